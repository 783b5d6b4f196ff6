#!/usr/bin/env bash
# bench/gateway.sh: idem serve measured the way users measure a proxy —
# with wrk, against the upstream directly and against a plain nginx
# proxy_pass hop, in the same run — so every figure has its baseline beside it.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: bench/gateway.sh [--quick] [--duration-s N] [--rounds N]
                        [--connections "32 256"] [--keys N] [--tail-s N]
                        [--postgres URL | --no-postgres] [--idem BIN]
                        [--no-others] [--only MODES]

Measures, interleaved within each round and at each connection count:
  direct          wrk -> upstream (nginx answering 201 at once)
  nginx-hop       wrk -> nginx proxy_pass (keepalive) -> upstream
  sqlite-fresh    wrk -> idem serve (embedded SQLite store), a new key per request
  sqlite-hot      ... one key sent before the run, replayed
  sqlite-many     ... KEYS keys sent before the run, cycled
  sqlite-window   ... fresh keys while the store's suspect window is open (after
                  `idem store mark-restored`): each is looked up at the upstream
                  (nginx answering 404) before it is forwarded; printed as a ratio
                  to sqlite-fresh of the same round
  pg-fresh/-hot/-many   the same with the PostgreSQL store
  pg2-fresh/-many  two gateways on one PostgreSQL schema, one wrk each, summed
  pg-insert       the raw-insert baseline: pgbench, 16 clients (one gateway's pool),
                  a prepared INSERT … ON CONFLICT DO NOTHING into a bare table keyed
                  like idem's records, once per round; pg-fresh and pg2-fresh are
                  also printed as a ratio to it
  and the same upstream answering after 20 ms: direct-20ms, nginx-hop-20ms,
  sqlite-fresh-20ms, pg-fresh-20ms.
  sqlite-tail     after the rounds: sqlite-fresh at 32 connections for --tail-s
                  seconds, its p99.9 and max against the targets (10 ms, 25 ms),
                  after nginx-hop-tail, the hop over the same length (the machine's
                  own stalls)
  others          after that: `idem-bench consume` on NATS and on RabbitMQ (idem
                  consume against the bare consumer) and `idem sim --bench`,
                  their figures against their targets
Prints a table per round and a summary: req/s, p50/p99/p99.9/max, ratios
against direct and against the nginx hop (median over rounds, each ratio taken
within its round), added latency, CPU time and PostgreSQL commits per request,
and each gateway's RSS after the 256-connection runs.

Options:
  --quick              a smoke run: 2 s per measurement, one round, 200 keys
  --duration-s N       seconds per measurement (default 10; 1..=600)
  --rounds N           rounds (default 2; 1..=20)
  --connections LIST   connection counts, space-separated (default "32 256")
  --keys N             keys of the many-keys replay mode (default 1000; 1..=100000)
  --tail-s N           seconds of the sqlite-tail run (default 30, --quick 2; 0 skips it)
  --postgres URL       PostgreSQL server (default postgres://postgres@127.0.0.1:5432/test);
                       a fresh schema is created for the run and dropped at the end
  --no-postgres        skip the PostgreSQL modes
  --idem BIN           use this idem binary instead of building one in release
                       (idem-bench is then looked for beside it)
  --no-others          skip the consumer and simulator benchmarks
  --only MODES         measure only these modes of the rounds (comma-separated
                       names from the list above, e.g. pg2-many,direct); the
                       tail and the others run as their own options say
  -h, --help           this text

Installs wrk, nginx, the nginx echo module (its echo_sleep is the 20 ms
upstream) and the PostgreSQL client with apt-get when missing. Everything
runs on spare loopback ports under a temporary directory and is stopped and
removed on exit; a part that does not start fails the run with its log.
EOF
}

duration_s=10
rounds=2
connections="32 256"
keys=1000
tail_s=30
others=1
postgres_url="postgres://postgres@127.0.0.1:5432/test"
use_postgres=1
idem_bin=""
only=""

die() {
    echo "bench/gateway.sh: $*" >&2
    exit 1
}

number_in() { # NAME VALUE MIN MAX
    if ! [[ $2 =~ ^[0-9]+$ ]] || (($2 < $3 || $2 > $4)); then
        die "$1 = '$2' is not a number in $3..=$4"
    fi
}

while (($#)); do
    case $1 in
    --quick) duration_s=2 rounds=1 keys=200 tail_s=2 ;;
    --duration-s) duration_s=${2-}; shift ;;
    --rounds) rounds=${2-}; shift ;;
    --connections) connections=${2-}; shift ;;
    --keys) keys=${2-}; shift ;;
    --tail-s) tail_s=${2-}; shift ;;
    --no-others) others=0 ;;
    --postgres) postgres_url=${2-}; shift ;;
    --no-postgres) use_postgres=0 ;;
    --idem) idem_bin=${2-}; shift ;;
    --only) only=${2-}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown option '$1'" ;;
    esac
    shift
done
number_in --duration-s "$duration_s" 1 600
number_in --rounds "$rounds" 1 20
number_in --keys "$keys" 1 100000
number_in --tail-s "$tail_s" 0 600
[[ -n $connections ]] || die "--connections is empty"
for c in $connections; do number_in "--connections entry" "$c" 2 10000; done

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lua="$repo/bench/gateway.lua"
echo_module=/usr/lib/nginx/modules/ngx_http_echo_module.so

# --- tools -------------------------------------------------------------------

missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v nginx >/dev/null || missing+=(nginx)
[[ -f $echo_module ]] || missing+=(libnginx-mod-http-echo)
command -v curl >/dev/null || missing+=(curl)
((use_postgres == 0)) || { command -v psql >/dev/null && command -v pgbench >/dev/null; } ||
    missing+=(postgresql-client)
if ((${#missing[@]})); then
    echo "installing ${missing[*]} with apt-get" >&2
    sudo=()
    ((EUID == 0)) || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" ||
        die "apt-get install ${missing[*]} failed"
fi
[[ -f $echo_module ]] || die "$echo_module is missing after installing libnginx-mod-http-echo"

if [[ -z $idem_bin ]]; then
    build=(-p idem)
    ((others == 0)) || build+=(-p idem-bench)
    (cd "$repo" && cargo build --release "${build[@]}") || die "cargo build --release ${build[*]} failed"
    idem_bin="${CARGO_TARGET_DIR:-$repo/target}/release/idem"
fi
[[ -x $idem_bin ]] || die "no idem binary at $idem_bin"
bench_bin="$(dirname "$idem_bin")/idem-bench"
((others == 0)) || [[ -x $bench_bin ]] || die "no idem-bench beside $idem_bin (build it, or pass --no-others)"

# --- lifecycle ---------------------------------------------------------------

work=$(mktemp -d "${TMPDIR:-/tmp}/idem-bench.XXXXXX")
# nginx workers run as an unprivileged user when started by root; they only
# need to read the configuration.
chmod 755 "$work"
# nginx opens its default error log under the prefix before it reads the
# configuration.
mkdir "$work/logs"
nonce="$(date +%s)$$"
schema="idem_bench_$nonce"
pids=()         # every process started here, stopped on exit
schema_made=0

cleanup() {
    local status=$? pid
    trap - EXIT INT TERM
    for pid in "${pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if ((schema_made)); then
        psql -q "$postgres_url" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 ||
            echo "bench/gateway.sh: could not drop schema $schema" >&2
    fi
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

used_ports=" "
upstream_port=""
hop_port=""
pick_port() { # VAR: a loopback port nothing listens on, not handed out before
    local p
    while :; do
        p=$((20000 + RANDOM % 40000))
        [[ $used_ports == *" $p "* ]] && continue
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            used_ports+="$p "
            printf -v "$1" '%s' "$p"
            return
        fi
    done
}

wait_http() { # NAME PID URL LOG: until URL answers any HTTP status, or fail
    local i code
    for ((i = 0; i < 300; i++)); do
        kill -0 "$2" 2>/dev/null || { tail -n 20 "$4" >&2 || true; die "$1 exited while starting (log above)"; }
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$3" || true)
        [[ $code != 000 ]] && return 0
        sleep 0.1
    done
    tail -n 20 "$4" >&2 || true
    die "$1 did not answer on $3 within 30 s (log above)"
}

body="$work/body.json"
printf '%s' '{"amount":1000,"currency":"EUR","destination":"acct-0001","reference":"bench"}' >"$body"
answer='{"id":"po_1","status":"accepted"}'
tenant=bench

nginx_common() { # NAME
    cat <<EOF
worker_processes auto;
pid $work/$1.pid;
error_log $work/$1.error.log warn;
events { worker_connections 8192; }
http {
    access_log off;
    client_body_temp_path $work/$1.body;
    proxy_temp_path $work/$1.proxy;
    fastcgi_temp_path $work/$1.fastcgi;
    uwsgi_temp_path $work/$1.uwsgi;
    scgi_temp_path $work/$1.scgi;
    keepalive_requests 100000000;
    keepalive_timeout 120s;
EOF
}

start_nginx() { # NAME PORT
    local log="$work/$1.error.log"
    nginx -t -q -p "$work" -c "$work/$1.conf" 2>"$log" || { cat "$log" >&2; die "nginx $1: bad configuration"; }
    nginx -p "$work" -c "$work/$1.conf" -g 'daemon off;' 2>>"$log" &
    pids+=($!)
    wait_http "nginx $1" "$!" "http://127.0.0.1:$2/" "$log"
}

pick_port upstream_port
{
    echo "load_module $echo_module;"
    nginx_common upstream
    cat <<EOF
    server {
        listen 127.0.0.1:$upstream_port backlog=4096;
        default_type application/json;
        location / { return 201 '$answer'; }
        # The provider's lookup by forwarded key: no such effect.
        location /payouts/by-key/ { return 404; }
        # echo_sleep waits on a timer, not a thread: 256 waiting requests cost nothing.
        location /slow/ { echo_status 201; echo_sleep 0.02; echo -n '$answer'; }
    }
}
EOF
} >"$work/upstream.conf"
start_nginx upstream "$upstream_port"

pick_port hop_port
{
    nginx_common hop
    cat <<EOF
    upstream app {
        server 127.0.0.1:$upstream_port;
        keepalive 1024;
        keepalive_requests 100000000;
    }
    server {
        listen 127.0.0.1:$hop_port backlog=4096;
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
} >"$work/hop.conf"
start_nginx hop "$hop_port"

declare -A gateway_pid gateway_port
start_gateway() { # NAME STORE_URL [ROUTE_EXTRA [TOP_EXTRA]]
    local port log="$work/$1.log"
    pick_port port
    cat >"$work/$1.toml" <<EOF
listen = "127.0.0.1:$port"
upstream = "http://127.0.0.1:$upstream_port"
store = "$2"
owner = "bench-$1"
requests_in_flight_max = 4096
${4-}

[[route]]
name = "payouts"
methods = ["POST"]
path = "/payouts"
principal = { header = "x-tenant-id" }
${3-}

[[route]]
name = "slow-payouts"
methods = ["POST"]
path = "/slow/payouts"
principal = { header = "x-tenant-id" }
EOF
    "$idem_bin" serve --config "$work/$1.toml" >"$log" 2>&1 &
    pids+=($!)
    gateway_pid[$1]=$!
    gateway_port[$1]=$port
    wait_http "idem serve ($1)" "$!" "http://127.0.0.1:$port/" "$log"
}

post() { # URL KEY: prints the status and whether it was a replay
    curl -s -o /dev/null -D - --max-time 10 -X POST "$1" \
        -H 'Content-Type: application/json' -H "x-tenant-id: $tenant" \
        -H "Idempotency-Key: $2" --data-binary "@$body" |
        awk 'NR == 1 { s = $2 } tolower($1) == "idempotent-replayed:" { r = "replayed" } END { print s, (r ? r : "fresh") }'
}

# A gateway that answers but does not replay would measure nothing: check
# one key fresh and then replayed before any load.
check_replay() { # NAME
    local url="http://127.0.0.1:${gateway_port[$1]}/payouts" first second
    first=$(post "$url" "check-$nonce-$1")
    second=$(post "$url" "check-$nonce-$1")
    [[ $first == "201 fresh" && $second == "201 replayed" ]] ||
        die "idem serve ($1): expected '201 fresh' then '201 replayed', got '$first' then '$second' (log: $work/$1.log)"
}

# Sends the replay modes' keys once: hot-NONCE and many-NONCE-1..KEYS.
seed() { # NAME
    local url="http://127.0.0.1:${gateway_port[$1]}/payouts" cfg="$work/seed-$1.curl" i good
    [[ $(post "$url" "hot-$nonce") == "201 "* ]] || die "idem serve ($1): seeding the hot key failed"
    : >"$cfg"
    for ((i = 1; i <= keys; i++)); do
        if ((i > 1)); then echo next >>"$cfg"; fi
        printf 'url = "%s"\nrequest = "POST"\nheader = "Content-Type: application/json"\nheader = "x-tenant-id: %s"\nheader = "Idempotency-Key: many-%s-%d"\ndata-binary = "@%s"\noutput = "/dev/null"\nwrite-out = "%%{http_code}\\n"\n' \
            "$url" "$tenant" "$nonce" "$i" "$body" >>"$cfg"
    done
    good=$(curl -s -K "$cfg" | grep -c '^201$' || true)
    [[ $good == "$keys" ]] || die "idem serve ($1): only $good of $keys seeded keys were answered 201"
}

start_gateway sqlite "sqlite://$work/idem.db"
check_replay sqlite
seed sqlite
# The same route with a lookup, on a store marked restored: every fresh key
# is verified at the upstream first. A short lease, so that a "not found"
# counts one second after the window opens.
start_gateway sqlite-window "sqlite://$work/window.db" "lease_ms = 1000
forward_key = { template = \"{scope_digest}:{key}\" }

[[lookup]]
route = \"payouts\"
url = \"http://127.0.0.1:$upstream_port/payouts/by-key/{forwarded_key}\"" \
    "response_timeout_ms = 800"
"$idem_bin" store mark-restored --store "sqlite://$work/window.db" \
    --since "$(date -u -d '-1 hour' +%Y-%m-%dT%H:%M:%SZ)" >"$work/mark-restored.out" 2>&1 ||
    { cat "$work/mark-restored.out" >&2; die "idem store mark-restored failed"; }
sleep 2
grep -q "suspect window open" "$work/sqlite-window.log" ||
    die "idem serve (sqlite-window) did not see the suspect window (log: $work/sqlite-window.log)"
check_replay sqlite-window
gateways=(sqlite sqlite-window)
if ((use_postgres)); then
    pg_store="$postgres_url"
    if [[ $pg_store == *\?* ]]; then pg_store+="&schema=$schema"; else pg_store+="?schema=$schema"; fi
    psql -q "$postgres_url" -c "SELECT 1" >/dev/null 2>&1 ||
        die "PostgreSQL at $postgres_url does not answer (or pass --no-postgres)"
    schema_made=1
    # The first gateway creates the schema; the second starts on it.
    start_gateway pg1 "$pg_store"
    start_gateway pg2 "$pg_store"
    check_replay pg1
    check_replay pg2
    seed pg1
    gateways+=(pg1 pg2)
    # The raw-insert baseline: a bare table keyed like idem's records, and
    # the prepared INSERT … ON CONFLICT DO NOTHING a claim of a new key is,
    # run by pgbench with as many clients as one gateway has connections.
    psql -q "$postgres_url" -c "CREATE TABLE $schema.bench_insert (
        scope TEXT COLLATE \"C\" NOT NULL, key TEXT COLLATE \"C\" NOT NULL,
        fingerprint BYTEA NOT NULL, state TEXT NOT NULL, token BIGINT NOT NULL,
        owner TEXT NOT NULL, lease_until_ms BIGINT NOT NULL, created_at_ms BIGINT NOT NULL,
        retention_s BIGINT NOT NULL, tombstone_s BIGINT NOT NULL, PRIMARY KEY (scope, key))" ||
        die "cannot create the raw-insert baseline's table in schema $schema"
    cat >"$work/insert.sql" <<SQL
\set k random(1, 9000000000000000)
INSERT INTO $schema.bench_insert VALUES ('POST /payouts|$tenant', :client_id || '-' || :k, '\x5a', 'in_progress', :k, 'bench', 30000, 0, 86400, 2592000) ON CONFLICT DO NOTHING;
SQL
fi
# Connections of each PostgreSQL gateway's pool: the raw-insert baseline's
# clients.
pg_pool=16

# --- measurements ------------------------------------------------------------

# name | base (fast or slow upstream) | targets | wrk mode | key prefix tag
modes=(
    "direct fast upstream fresh"
    "nginx-hop fast hop fresh"
    "sqlite-fresh fast sqlite fresh"
    "sqlite-hot fast sqlite hot"
    "sqlite-many fast sqlite many"
    "sqlite-window fast sqlite-window fresh"
)
if ((use_postgres)); then modes+=(
    "pg-fresh fast pg1 fresh"
    "pg-hot fast pg1 hot"
    "pg-many fast pg1 many"
    "pg2-fresh fast pg1,pg2 fresh"
    "pg2-many fast pg1,pg2 many"
); fi
modes+=(
    "direct-20ms slow upstream fresh"
    "nginx-hop-20ms slow hop fresh"
    "sqlite-fresh-20ms slow sqlite fresh"
)
if ((use_postgres)); then modes+=("pg-fresh-20ms slow pg1 fresh"); fi
if [[ -n $only ]]; then
    kept=()
    IFS=, read -r -a wanted <<<"$only"
    for w in "${wanted[@]}"; do
        found=0
        for m in "${modes[@]}"; do
            if [[ ${m%% *} == "$w" ]]; then kept+=("$m") found=1; fi
        done
        ((found)) || die "--only: no mode named '$w' (see --help; PostgreSQL modes need PostgreSQL)"
    done
    modes=("${kept[@]}")
fi

port_of() {
    case $1 in
    upstream) echo "$upstream_port" ;;
    hop) echo "$hop_port" ;;
    *) echo "${gateway_port[$1]}" ;;
    esac
}

# CPU time and commits per request: figures that do not drift with the
# machine's speed. CPU is utime + stime from /proc/PID/stat of the processes
# serving the target (idem serve, or nginx's master and workers), in clock
# ticks; commits are the COMMIT records PostgreSQL wrote to its WAL over the
# run, read back with pg_waldump (pg_stat_database.xact_commit lags: a
# backend that goes idle holds up to a second of counts for ten seconds, and
# it also counts read-only transactions, which commit nothing to disk).
clk_tck=$(getconf CLK_TCK)
pids_of() { # TARGET: the processes whose CPU a measurement of TARGET counts
    case $1 in
    upstream | hop)
        local master
        master=$(cat "$work/$1.pid")
        echo "$master" $(pgrep -P "$master")
        ;;
    *) echo "${gateway_pid[$1]}" ;;
    esac
}
cpu_ticks() { # PID...: their utime + stime, summed, in clock ticks
    local total=0 p t
    for p; do
        t=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$p/stat" 2>/dev/null) || continue
        total=$((total + t))
    done
    echo "$total"
}
pg_waldump_bin=""
pg_wal_dir=""
if ((use_postgres)); then
    pg_waldump_bin=$(ls /usr/lib/postgresql/*/bin/pg_waldump 2>/dev/null | sort -V | tail -1 || true)
    pg_wal_dir="$(psql -Atq "$postgres_url" -c 'SHOW data_directory' 2>/dev/null || true)/pg_wal"
    [[ -n $pg_waldump_bin && -r $pg_wal_dir ]] || {
        echo "bench/gateway.sh: pg_waldump or $pg_wal_dir not readable here: commits per request not measured" >&2
        pg_waldump_bin=""
    }
fi
wal_lsn() { psql -Atq "$postgres_url" -c 'SELECT pg_current_wal_flush_lsn()'; }
wal_commits() { # FROM_LSN TO_LSN: COMMIT records written between them
    "$pg_waldump_bin" -p "$pg_wal_dir" -s "$1" -e "$2" --stats=record 2>/dev/null |
        awk '$1 == "Transaction/COMMIT" { n = $2 } END { print n + 0 }'
}
# Before and after one measurement: CPU ticks of its targets, of every
# PostgreSQL server process, and the WAL position.
probe_cpu() { # TARGET...
    local -a ps=()
    local t
    for t; do ps+=($(pids_of "$t")); done
    printf '%s %s %s\n' "$(cpu_ticks "${ps[@]}")" \
        "$( ((use_postgres)) && cpu_ticks $(pgrep -x postgres) || echo 0)" \
        "$([[ -n $pg_waldump_bin ]] && wal_lsn || echo -)"
}
# Appends cpu_us/req, server cpu_us/req and commits/req to a results line.
per_request() { # LINE BEFORE AFTER REQUESTS USES_POSTGRES
    local line=$1 requests=$4 commits=-
    read -r c0 s0 l0 <<<"$2"
    read -r c1 s1 l1 <<<"$3"
    if (($5)) && [[ -n $pg_waldump_bin && $l0 != - ]]; then commits=$(wal_commits "$l0" "$l1"); fi
    awk -v line="$line" -v n="$requests" -v c=$((c1 - c0)) -v s=$((s1 - s0)) -v k="$commits" -v tck="$clk_tck" -v pg="$5" '
        BEGIN { if (n <= 0) n = 1
            printf "%s\t%.1f\t%s\t%s\n", line, c * 1e6 / tck / n, pg ? sprintf("%.1f", s * 1e6 / tck / n) : "-",
                k == "-" ? "-" : sprintf("%.3f", k / n) }'
}

results="$work/results.tsv" # round conns mode base rps p50_us p99_us bad sock cpu_us server_cpu_us commits p999_us max_us
rss="$work/rss.tsv"         # round gateway VmRSS_kB VmHWM_kB
: >"$results"
: >"$rss"
failures=0

# One measurement: one wrk per target (two gateways split the connections and
# wrk's two threads), req/s summed, the worse p50, p99, p99.9 and max of the
# targets.
measure() { # ROUND CONNS NAME BASE TARGETS MODE
    local round=$1 conns=$2 name=$3 base=$4 mode=$6 path=/payouts prefix key_args
    local -a targets wrk_pids outs
    IFS=, read -r -a targets <<<"$5"
    [[ $base == slow ]] && path=/slow/payouts
    case $mode in
    fresh) prefix="fresh-$nonce-r$round-c$conns-$name" ;;
    hot) prefix="hot-$nonce" ;;
    many) prefix="many-$nonce" ;;
    esac
    local n=${#targets[@]} i threads=$((2 / ${#targets[@]})) c before after uses_pg=0
    [[ $5 == *pg* ]] && uses_pg=1
    before=$(probe_cpu "${targets[@]}")
    for ((i = 0; i < n; i++)); do
        c=$((conns / n))
        outs[i]="$work/wrk-$round-$conns-$name-$i.out"
        key_args=("$mode" "$prefix" "$keys" "$tenant" "$body")
        if [[ $mode == fresh ]]; then key_args[1]="$prefix-$i"; fi
        wrk -t"$threads" -c"$c" -d"${duration_s}s" --latency -s "$lua" \
            "http://127.0.0.1:$(port_of "${targets[i]}")$path" -- "${key_args[@]}" >"${outs[i]}" 2>&1 &
        wrk_pids[i]=$!
        pids+=($!)
    done
    for ((i = 0; i < n; i++)); do
        wait "${wrk_pids[i]}" || { cat "${outs[i]}" >&2; die "wrk failed for $name at $conns connections"; }
    done
    after=$(probe_cpu "${targets[@]}")
    local line
    line=$(awk -v round="$round" -v conns="$conns" -v name="$name" -v base="$base" '
        /^BENCH / {
            for (f = 2; f <= NF; f++) { split($f, kv, "="); v[kv[1]] = kv[2] }
            rps += v["requests"] / (v["duration_us"] / 1e6); total += v["requests"]
            if (v["p50_us"] > p50) p50 = v["p50_us"]
            if (v["p99_us"] > p99) p99 = v["p99_us"]
            if (v["p999_us"] > p999) p999 = v["p999_us"]
            if (v["max_us"] > pmax) pmax = v["max_us"]
            bad += v["non2xx"]; sock += v["socket_errors"]; seen++
        }
        END {
            if (seen == 0) exit 2
            printf "%s\t%s\t%s\t%s\t%.0f\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", round, conns, name, base, rps, p50, p99, bad, sock, total, p999, pmax
        }' "${outs[@]}") || { cat "${outs[@]}" >&2; die "no result line from wrk for $name at $conns connections"; }
    local total tail
    total=$(cut -f10 <<<"$line")
    tail=$(cut -f11-12 <<<"$line")
    line=$(per_request "$(cut -f1-9 <<<"$line")" "$before" "$after" "$total" "$uses_pg")
    line="$line"$'\t'"$tail"
    printf '%s\n' "$line" >>"$results"
    local bad sock
    bad=$(cut -f8 <<<"$line")
    sock=$(cut -f9 <<<"$line")
    if ((bad + sock > 0)); then
        echo "bench/gateway.sh: $name at $conns connections: $bad non-2xx answers, $sock socket errors" >&2
        failures=$((failures + 1))
    fi
}

# The raw-insert baseline of a round: pgbench, prepared statements,
# $pg_pool clients, the measurement's duration; recorded as mode pg-insert
# (latency columns: pgbench's mean, for both).
measure_insert() { # ROUND
    local out="$work/pgbench-$1.out" tps mean_us before after
    before=$(probe_cpu)
    pgbench -n -M prepared -c "$pg_pool" -j 2 -T "$duration_s" -f "$work/insert.sql" "$postgres_url" >"$out" 2>&1 ||
        { cat "$out" >&2; die "pgbench failed"; }
    tps=$(awk '/^tps = / { print int($3) }' "$out")
    mean_us=$(awk '/^latency average = / { print int($4 * 1000) }' "$out")
    [[ -n $tps && -n $mean_us ]] || { cat "$out" >&2; die "no figures from pgbench"; }
    after=$(probe_cpu)
    local total
    total=$(awk '/^number of transactions actually processed: / { print $6 }' "$out")
    per_request "$(printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t0\t0' "$1" "$pg_pool" pg-insert fast "$tps" "$mean_us" "$mean_us")" \
        "$before" "$after" "${total:-0}" 1 | sed 's/$/\t-\t-/' >>"$results"
}

sample_rss() { # ROUND
    local g
    for g in "${gateways[@]}"; do
        kill -0 "${gateway_pid[$g]}" 2>/dev/null || die "idem serve ($g) died during the run (log: $work/$g.log)"
        awk -v round="$1" -v g="$g" '
            /^VmRSS:/ { rss = $2 } /^VmHWM:/ { hwm = $2 }
            END { printf "%s\t%s\t%s\t%s\n", round, g, rss, hwm }' "/proc/${gateway_pid[$g]}/status" >>"$rss"
    done
}

print_round() { # ROUND
    echo
    echo "round $1 of $rounds (${duration_s} s per measurement, wrk -t2)"
    awk -F'\t' -v round="$1" '
        function ms(us) { return us == "-" ? "-" : sprintf("%.3f", us / 1000) }
        BEGIN { printf "%-18s %6s %10s %9s %9s %9s %9s\n", "mode", "conns", "req/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms" }
        $1 == round { printf "%-18s %6d %10d %9.3f %9.3f %9s %9s\n", $3, $2, $5, $6 / 1000, $7 / 1000, ms($13), ms($14) }' "$results"
}

echo "idem: $idem_bin; work dir: $work; $(nproc) CPUs shared by wrk, nginx, idem and PostgreSQL"
for ((round = 1; round <= rounds; round++)); do
    if ((use_postgres)); then
        echo "round $round: pg-insert (pgbench, $pg_pool clients)" >&2
        measure_insert "$round"
    fi
    for conns in $connections; do
        for m in "${modes[@]}"; do
            read -r name base targets mode <<<"$m"
            echo "round $round: $name at $conns connections" >&2
            measure "$round" "$conns" "$name" "$base" "$targets" "$mode"
        done
        if [[ $conns == 256 ]]; then sample_rss "$round"; fi
    done
    print_round "$round"
done
# With no 256-connection run, RSS is sampled once, after the last round.
[[ -s $rss ]] || sample_rss "$rounds"

# The tail: one long fresh-key run on SQLite, where a stall (a checkpoint, a
# slow fsync) shows in p99.9 and max; its own results file, so that the
# rounds' medians stay the rounds'.
tail_results="$work/tail.tsv"
: >"$tail_results"
if ((tail_s > 0)); then
    round_results=$results round_duration_s=$duration_s
    results=$tail_results duration_s=$tail_s
    # The hop over the same length first: the stalls the machine itself
    # gives a plain proxy (scheduling, the other processes) are its tail.
    echo "tail: nginx-hop at 32 connections for $tail_s s" >&2
    measure tail 32 nginx-hop-tail fast hop fresh
    echo "tail: sqlite-fresh at 32 connections for $tail_s s" >&2
    measure tail 32 sqlite-tail fast sqlite fresh
    results=$round_results duration_s=$round_duration_s
fi

# The other throughput targets, each measured by its own benchmark against
# its own baseline of the same run.
others_out=()
if ((others)); then
    for broker in nats rabbitmq; do
        echo "others: idem-bench consume --broker $broker" >&2
        out="$work/consume-$broker.out"
        if "$bench_bin" consume --broker "$broker" --idem "$idem_bin" --dir "$work" >"$out" 2>&1; then
            others_out+=("idem consume ($broker): $(grep -m1 'overall:' "$out" | sed 's/^ *overall: //')")
        else
            tail -20 "$out" >&2
            others_out+=("idem consume ($broker): the benchmark failed (log above)")
            failures=$((failures + 1))
        fi
    done
    echo "others: idem sim --bench" >&2
    out="$work/sim.out"
    if "$idem_bin" sim --bench --seeds 2000 "$repo/examples/contracts/payouts.toml" >"$out" 2>&1; then
        rate=$(awk '/^bench .* intents\/s$/ { print $(NF - 1) }' "$out" | head -1)
        met=MISSED
        ((${rate:-0} >= 250000)) && met=MET
        others_out+=("idem sim --bench --seeds 2000 payouts.toml: ${rate:-?} intents/s  target >= 250000: $met")
    else
        tail -20 "$out" >&2
        others_out+=("idem sim --bench: failed (log above)")
        failures=$((failures + 1))
    fi
fi

# --- summary -----------------------------------------------------------------

# The median of a space-separated list, for both summaries' awk programs.
awk_median='
    function median(list,   n, a, i, j, t) {
        n = split(list, a, " ")
        for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }'

echo
echo "summary: median over $rounds round(s); each ratio and added latency is taken against"
echo "direct (and the nginx hop) of the same round and connection count, on the same upstream"
awk -F'\t' "$awk_median"'
    { r = $1; c = $2; m = $3; b = $4
      rps[r, c, m] = $5; p50[r, c, m] = $6; p99[r, c, m] = $7; base[m] = b
      if (!((c, m) in seen)) { seen[c, m] = 1; order[++n] = c SUBSEP m }
      rounds[r] = 1 }
    END {
        printf "%-18s %6s %10s %9s %9s %9s %9s %9s %9s\n", "mode", "conns", "req/s", "p50 ms", "p99 ms", "x direct", "x hop", "+p50 ms", "+p99 ms"
        for (k = 1; k <= n; k++) {
            split(order[k], cm, SUBSEP); c = cm[1]; m = cm[2]
            d = base[m] == "slow" ? "direct-20ms" : "direct"
            h = base[m] == "slow" ? "nginx-hop-20ms" : "nginx-hop"
            lr = l50 = l99 = lxd = lxh = la50 = la99 = ""
            for (r in rounds) {
                if (!((r, c, m) in rps)) continue
                lr = lr " " rps[r, c, m]; l50 = l50 " " p50[r, c, m]; l99 = l99 " " p99[r, c, m]
                if (rps[r, c, d] > 0) lxd = lxd " " rps[r, c, m] / rps[r, c, d]
                if (rps[r, c, h] > 0) lxh = lxh " " rps[r, c, m] / rps[r, c, h]
                la50 = la50 " " (p50[r, c, m] - p50[r, c, d]); la99 = la99 " " (p99[r, c, m] - p99[r, c, d])
            }
            printf "%-18s %6d %10d %9.3f %9.3f %9.2f %9.2f %+9.3f %+9.3f\n", m, c, median(lr), median(l50) / 1000, median(l99) / 1000,
                median(lxd), median(lxh), median(la50) / 1000, median(la99) / 1000
        }
    }' "$results"
if ((use_postgres)); then
    echo
    echo "PostgreSQL fresh keys against the raw-insert baseline of the same round (pg-insert, median over rounds)"
    awk -F'\t' "$awk_median"'
        $3 == "pg-insert" { ins[$1] = $5 }
        $3 == "pg-fresh" || $3 == "pg2-fresh" { fresh[$1, $2, $3] = $5; if (!(($2, $3) in seen)) { seen[$2, $3] = 1; order[++n] = $2 SUBSEP $3 } }
        END {
            for (k = 1; k <= n; k++) {
                split(order[k], cm, SUBSEP); l = ""
                for (key in fresh) { split(key, rcm, SUBSEP); if (rcm[2] == cm[1] && rcm[3] == cm[2] && ins[rcm[1]] > 0) l = l " " fresh[key] / ins[rcm[1]] }
                if (l != "") printf "%-18s %6d %9.2f x pg-insert\n", cm[2], cm[1], median(l)
            }
        }' "$results"
fi
echo
echo "fresh keys inside the suspect window against outside it (sqlite-window / sqlite-fresh of the"
echo "same round, median over rounds; +p50: the lookup each fresh key waits for)"
awk -F'\t' "$awk_median"'
    $3 == "sqlite-fresh" { out_rps[$1, $2] = $5; out_p50[$1, $2] = $6 }
    $3 == "sqlite-window" { in_rps[$1, $2] = $5; in_p50[$1, $2] = $6; if (!($2 in seen)) { seen[$2] = 1; order[++n] = $2 } }
    END {
        for (k = 1; k <= n; k++) {
            c = order[k]; lx = lp = ""
            for (key in in_rps) { split(key, rc, SUBSEP); if (rc[2] == c && out_rps[rc[1], c] > 0) {
                lx = lx " " in_rps[key] / out_rps[rc[1], c]; lp = lp " " (in_p50[key] - out_p50[rc[1], c]) } }
            if (lx != "") printf "sqlite-window %6d %9.2f x sqlite-fresh   %+9.3f ms p50\n", c, median(lx), median(lp) / 1000
        }
    }' "$results"
echo
echo "CPU time per request (utime + stime over the run / requests, microseconds; x hop: against"
echo "the nginx hop's own CPU per request of the same round), PostgreSQL's CPU per request and its"
echo "WAL commits per request (median over rounds; pg-insert's CPU is pgbench's server side only)"
awk -F'\t' "$awk_median"'
    { r = $1; c = $2; m = $3; b = $4; cpu[r, c, m] = $10; srv[r, c, m] = $11; com[r, c, m] = $12; base[m] = b
      if (!((c, m) in seen)) { seen[c, m] = 1; order[++n] = c SUBSEP m }
      rounds[r] = 1 }
    END {
        printf "%-18s %6s %10s %9s %12s %12s\n", "mode", "conns", "cpu us", "x hop", "server us", "commits"
        for (k = 1; k <= n; k++) {
            split(order[k], cm, SUBSEP); c = cm[1]; m = cm[2]
            h = base[m] == "slow" ? "nginx-hop-20ms" : "nginx-hop"
            lc = lx = ls = lk = ""
            for (r in rounds) {
                if (!((r, c, m) in cpu)) continue
                lc = lc " " cpu[r, c, m]
                if (cpu[r, c, h] > 0) lx = lx " " cpu[r, c, m] / cpu[r, c, h]
                if (srv[r, c, m] != "-") ls = ls " " srv[r, c, m]
                if (com[r, c, m] != "-") lk = lk " " com[r, c, m]
            }
            printf "%-18s %6d %10.1f %9s %12s %12s\n", m, c, median(lc), lx == "" ? "-" : sprintf("%.2f", median(lx)),
                ls == "" ? "-" : sprintf("%.1f", median(ls)), lk == "" ? "-" : sprintf("%.3f", median(lk))
        }
    }' "$results"
echo
echo "tail latency (p99.9 median over rounds, max the worst of them; targets for sqlite-fresh"
echo "at 32 connections over a ${tail_s} s run: p99.9 <= 10 ms, max <= 25 ms)"
awk -F'\t' "$awk_median"'
    $13 != "-" { k = $2 SUBSEP $3; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
      l[k] = l[k] " " $13; if ($14 > worst[k]) worst[k] = $14 }
    END {
        printf "%-18s %6s %9s %9s\n", "mode", "conns", "p99.9 ms", "max ms"
        for (i = 1; i <= n; i++) { split(order[i], cm, SUBSEP)
            printf "%-18s %6d %9.3f %9.3f\n", cm[2], cm[1], median(l[order[i]]) / 1000, worst[order[i]] / 1000 }
    }' "$results"
if [[ -s $tail_results ]]; then
    awk -F'\t' '{ p = $13 / 1000; m = $14 / 1000
        if ($3 == "nginx-hop-tail") {
            printf "%-18s %6d %9.3f %9.3f   %d req/s over the run; the baseline: what the machine gives a plain proxy\n", $3, $2, p, m, $5
            next
        }
        printf "%-18s %6d %9.3f %9.3f   %d req/s over the run; p99.9 <= 10 ms: %s, max <= 25 ms: %s\n", $3, $2, p, m, $5,
            p <= 10 ? "MET" : "MISSED", m <= 25 ? "MET" : "MISSED" }' "$tail_results"
fi
if ((${#others_out[@]})); then
    echo
    echo "the consumer and the simulator (target: idem consume >= 0.5x the bare consumer)"
    printf '%s\n' "${others_out[@]}"
fi
echo
echo "gateway RSS after the 256-connection runs (VmHWM: the peak since start)"
awk -F'\t' '{ if ($3 > rss[$2]) rss[$2] = $3; if ($4 > hwm[$2]) hwm[$2] = $4; if (!($2 in seen)) { seen[$2] = 1; order[++n] = $2 } }
    END { for (k = 1; k <= n; k++) printf "%-8s VmRSS %6.1f MiB   VmHWM %6.1f MiB\n", order[k], rss[order[k]] / 1024, hwm[order[k]] / 1024 }' "$rss"

((failures == 0)) || die "$failures measurement(s) had failed requests (see above); the figures are not valid"
