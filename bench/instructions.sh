#!/usr/bin/env bash
# bench/instructions.sh: the gateway's user-space instructions per request,
# counted by valgrind's callgrind over a stretch of wrk load. Unlike req/s
# and CPU seconds, the count does not drift with the machine's speed or
# with what else runs on it, so two builds can be compared a few percent
# apart on a noisy machine.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: bench/instructions.sh [--seconds N] [--modes "hot fresh"] BIN [BIN...]

For each idem binary, in turn: starts `idem serve` under callgrind on a
new SQLite store in a temporary directory, in front of an nginx that
answers every POST with a 201, sends one key, warms up for 3 s with
wrk (one thread, 8 connections), zeroes the counters, runs wrk for N
seconds (default 6) in each mode, and prints the instructions counted in
between divided by the requests wrk saw answered:

  hot     every request replays the one key sent before the run
  fresh   every request a new key (claim, forward, completion)

Only the gateway's own instructions in user space are counted: the
kernel's share of a request (sockets, fsync) is not, and SHA-256 runs its
portable code under valgrind (no SHA extensions), so a count is for
comparing builds, not for adding up to CPU time. The SQLite writer's
share of a fresh key depends on how many operations share a commit,
which the slowdown under valgrind changes: compare fresh counts of
builds measured the same way only.

Installs valgrind, wrk and nginx with apt-get when missing.
EOF
}

seconds=6
modes="hot fresh"
bins=()
die() {
    echo "bench/instructions.sh: $*" >&2
    exit 1
}
while (($#)); do
    case $1 in
    --seconds) seconds=${2-}; shift ;;
    --modes) modes=${2-}; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) usage >&2; die "unknown option '$1'" ;;
    *) bins+=("$1") ;;
    esac
    shift
done
[[ $seconds =~ ^[0-9]+$ ]] && ((seconds >= 1 && seconds <= 600)) || die "--seconds '$seconds' is not in 1..=600"
((${#bins[@]})) || { usage >&2; die "name at least one idem binary"; }
for bin in "${bins[@]}"; do [[ -x $bin ]] || die "no idem binary at $bin"; done
for mode in $modes; do [[ $mode == hot || $mode == fresh ]] || die "unknown mode '$mode'"; done

missing=()
command -v valgrind >/dev/null || missing+=(valgrind)
command -v wrk >/dev/null || missing+=(wrk)
command -v nginx >/dev/null || missing+=(nginx)
command -v curl >/dev/null || missing+=(curl)
if ((${#missing[@]})); then
    echo "installing ${missing[*]} with apt-get" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
        die "apt-get install ${missing[*]} failed"
fi

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/idem-instructions.XXXXXX")
chmod 755 "$work"
mkdir "$work/logs"
pids=()
cleanup() {
    local status=$? pid
    trap - EXIT INT TERM
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() { # a loopback port nothing listens on
    local p
    while :; do
        p=$((20000 + RANDOM % 40000))
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
    done
}
answers() { # URL SECONDS
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$1" || true) != 000 ]] && return 0
        sleep 0.1
    done
    return 1
}

upstream_port=$(free_port)
cat >"$work/upstream.conf" <<EOF
worker_processes 1;
pid $work/upstream.pid;
error_log $work/upstream.error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $work/body;
    proxy_temp_path $work/proxy;
    fastcgi_temp_path $work/fastcgi;
    uwsgi_temp_path $work/uwsgi;
    scgi_temp_path $work/scgi;
    keepalive_requests 100000000;
    server {
        listen 127.0.0.1:$upstream_port;
        default_type application/json;
        location / { return 201 '{"id":"po_1","status":"accepted"}'; }
    }
}
EOF
nginx -p "$work" -c "$work/upstream.conf" -g 'daemon off;' 2>>"$work/upstream.error.log" &
pids+=($!)
answers "http://127.0.0.1:$upstream_port/" 10 || die "nginx did not start (log: $work/upstream.error.log)"
body="$work/body.json"
printf '%s' '{"amount":1000,"currency":"EUR","destination":"acct-0001","reference":"bench"}' >"$body"

load() { # URL MODE PREFIX SECONDS: wrk's machine-readable line
    wrk -t1 -c8 -d"$4"s -s "$repo/bench/gateway.lua" "$1" -- "$2" "$3" 1 bench "$body" | grep '^BENCH' || true
}

printf '%-40s %-6s %10s %16s %14s\n' binary mode requests instructions "instr/request"
for bin in "${bins[@]}"; do
    for mode in $modes; do
        port=$(free_port)
        run="$work/run-$RANDOM"
        mkdir "$run"
        cat >"$run/idem.toml" <<EOF
listen = "127.0.0.1:$port"
upstream = "http://127.0.0.1:$upstream_port"
store = "sqlite://$run/idem.db"
owner = "instructions"

[[route]]
name = "payouts"
methods = ["POST"]
path = "/payouts"
principal = { header = "x-tenant-id" }
EOF
        valgrind --tool=callgrind --callgrind-out-file="$run/callgrind.%p" \
            "$bin" serve --config "$run/idem.toml" >"$run/idem.log" 2>&1 &
        pid=$!
        pids+=("$pid")
        url="http://127.0.0.1:$port/payouts"
        answers "http://127.0.0.1:$port/" 60 || die "idem serve did not start under valgrind (log: $run/idem.log)"
        curl -s -o /dev/null -X POST "$url" -H 'Idempotency-Key: hot' -H 'x-tenant-id: bench' \
            -H 'content-type: application/json' --data-binary @"$body"
        # A hot run replays the key just sent; a fresh run makes new ones.
        key() { if [[ $mode == hot ]]; then echo hot; else echo "$1-$RANDOM"; fi; }
        load "$url" "$mode" "$(key warm)" 3 >/dev/null
        callgrind_control -z "$pid" >/dev/null 2>&1
        line=$(load "$url" "$mode" "$(key measured)" "$seconds")
        callgrind_control -d "$pid" >/dev/null 2>&1
        kill -TERM "$pid"
        wait "$pid" 2>/dev/null || true
        requests=$(sed -n 's/.*requests=\([0-9]*\).*/\1/p' <<<"$line")
        [[ -n $requests && $requests -gt 0 ]] || die "wrk saw no answer from $bin ($mode; log: $run/idem.log)"
        [[ $line == *" non2xx=0 socket_errors=0"* ]] || die "$bin ($mode): not every answer was a 2xx: $line"
        # The first dump is the one taken after the load; the last is the exit's.
        dump=$(ls "$run"/callgrind.* | sort -V | sed -n 2p)
        instructions=$(awk '/^totals:/ {print $2}' "$dump")
        [[ -n $instructions ]] || die "no callgrind totals in $dump"
        printf '%-40s %-6s %10d %16d %14d\n' "$(basename "$bin")" "$mode" "$requests" "$instructions" \
            $((instructions / requests))
    done
done
