#!/usr/bin/env bash
# The whole test suite on a machine that may have none of its services:
# checks the Rust toolchain (scripts/check-toolchain.sh), installs (Debian
# packages) and starts whatever does not answer — PostgreSQL with its
# server binaries, NATS with JetStream, RabbitMQ, Chromium and
# chromedriver, and the DynamoDB emulators dynalite (npm) and moto (PyPI; it serves SQS too, for
# crates/idem/tests/consume_sqs.rs) —, lets the tests into PostgreSQL (see
# ensure_postgres_access), then runs `cargo test --workspace` with any
# arguments given (with `-p PACKAGE`, `cargo test` of those packages only),
# and, for the whole workspace with no arguments, the gateway's black-box
# tests again on each DynamoDB emulator and the Lambda example once end to
# end under cargo lambda's local runtime emulator (cargo-lambda, PyPI).
# Installing needs root; on a machine whose services already answer and
# let the tests in, `cargo test --workspace` alone does the same.
#
# IDEM_TEST_SERVICES, a list of postgres, nats, rabbitmq, chromium, redis,
# dynalite, moto, cargo-lambda, promtool and stripe (default: all of them), limits what is
# checked, installed and started, e.g.
# `IDEM_TEST_SERVICES=postgres bash scripts/test.sh -p idem-postgres`.
#
# Checking the PostgreSQL part against a fresh Debian server while
# another one already serves 127.0.0.1:5432, as root, leaving that one
# alone: a cluster with Debian's defaults (`pg_createcluster
# --start-conf=manual 15 fresh`: scram-sha-256 on 127.0.0.1, no database
# `test`, no password on role postgres), port 5432 and listen_addresses
# '127.0.0.1' in its postgresql.conf; a network namespace
# (`ip netns add pgfresh; ip -n pgfresh link set lo up`); inside it, in a
# mount namespace of its own (`ip netns exec pgfresh unshare --mount
# --propagation private bash`) with a tmpfs owned by postgres on
# /run/postgresql, so that the two servers' sockets do not meet:
#   pg_ctlcluster --skip-systemctl-redirect 15 fresh start
#   IDEM_TEST_SERVICES=postgres bash scripts/test.sh -p idem-postgres -p idem-testkit
# then `pg_dropcluster --stop 15 fresh` and `ip netns del pgfresh`. Leave
# out crates/idem/tests/postgres_restart.rs there: it stops and starts the
# cluster named `main`, whichever network it listens on.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*"; }
die() { echo "$*" >&2; exit 1; }

# Every service the suite can use: the default of IDEM_TEST_SERVICES.
SERVICES_ALL="postgres nats rabbitmq chromium redis dynalite moto cargo-lambda promtool stripe"

wanted() { # service: named in IDEM_TEST_SERVICES (spaces or commas), or it is unset
  case " $SERVICES_ALL " in
    *" $1 "*) ;;
    *) echo "scripts/test.sh: asked whether '$1' is wanted, which is no service of SERVICES_ALL" >&2; exit 2 ;;
  esac
  local list=" ${IDEM_TEST_SERVICES:-$SERVICES_ALL} "
  [[ ${list//,/ } == *" $1 "* ]]
}

# A service named in IDEM_TEST_SERVICES that the suite does not know is a
# typo that would silently skip what it meant: refuse it.
asked=${IDEM_TEST_SERVICES:-}
for service in ${asked//,/ }; do
  case " $SERVICES_ALL " in
    *" $service "*) ;;
    *) echo "IDEM_TEST_SERVICES names '$service', which is none of: $SERVICES_ALL" >&2; exit 2 ;;
  esac
done

answers() { # host port
  timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null
}

wait_for() { # name host port seconds
  local i
  for ((i = 0; i < $4; i++)); do
    answers "$2" "$3" && return 0
    sleep 1
  done
  echo "$1 did not answer on $2:$3 within $4 s" >&2
  return 1
}

ensure_postgres() {
  if command -v pg_isready >/dev/null && pg_isready -q -h 127.0.0.1 -p 5432; then
    log "PostgreSQL answers on 127.0.0.1:5432"
    return 0
  fi
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    log "installing PostgreSQL"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  log "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  wait_for PostgreSQL 127.0.0.1 5432 60
}

# Succeeds when `psql` gets into the URL as a superuser; otherwise says
# why (psql's first line) and fails.
pg_superuser() { # url
  local said
  said=$(PGCONNECT_TIMEOUT=5 psql -X -w -At -d "$1" \
    -c "SELECT rolsuper FROM pg_roles WHERE rolname = current_user" 2>&1) || {
    said=$(head -n1 <<<"$said")
    echo "${said#psql: error: }"
    return 1
  }
  [ "$said" = t ] || { echo "the role is not a superuser"; return 1; }
}

# The tests log in with IDEM_TEST_POSTGRES_URL or else POSTGRES_URL_DEFAULT
# of crates/idem-testkit/src/services.rs (read from there: it is defined
# once), as a superuser: they make schemas of their own, and roles with a
# password to check the store's privilege errors. A fresh Debian server
# refuses that URL: its pg_hba.conf asks for a password on 127.0.0.1
# (scram-sha-256), its postgres role has none, and it has no database
# `test`. As the postgres OS user over the local socket (peer
# authentication), this creates the database and gives the role the URL's
# password, only when the role has no password at all: a password someone
# set is never replaced, and pg_hba.conf is left as it is. A server that
# already lets the tests in is not touched.
# The password as PostgreSQL stores it for scram-sha-256 (RFC 5803), with
# 16 iterations instead of the 4096 PostgreSQL picks: the client side of
# every login runs in the tests' unoptimised build, where 4096 iterations
# cost about 35 ms a connection, enough for a gateway's fresh pool to miss
# the races tests run within 500 ms. The password is public (it is in the
# repository): iterations would not protect it. Perl and Digest::SHA come
# with Debian's PostgreSQL (postgresql-common is written in Perl); without
# them the password is stored the usual way.
scram_secret() { # password
  command -v perl >/dev/null && perl -MDigest::SHA=hmac_sha256,sha256 -MMIME::Base64 -e '
    my ($password, $iterations) = ($ARGV[0], 16);
    open my $random, "<", "/dev/urandom" or die; read $random, my $salt, 16;
    my $u = hmac_sha256($salt . pack("N", 1), $password);
    my $salted = $u;
    for (2 .. $iterations) { $u = hmac_sha256($u, $password); $salted ^= $u }
    printf "SCRAM-SHA-256\$%d:%s\$%s:%s", $iterations, map { encode_base64($_, "") }
      $salt, sha256(hmac_sha256("Client Key", $salted)), hmac_sha256("Server Key", $salted);
  ' "$1" 2>/dev/null || printf '%s' "$1"
}

ensure_postgres_access() {
  local url said user password port db
  if ! command -v psql >/dev/null; then
    log "installing the PostgreSQL client"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-client >/dev/null
  fi
  if [ -n "${IDEM_TEST_POSTGRES_URL:-}" ]; then
    said=$(pg_superuser "$IDEM_TEST_POSTGRES_URL") ||
      die "PostgreSQL does not let IDEM_TEST_POSTGRES_URL in as a superuser: $said"
    log "PostgreSQL lets IDEM_TEST_POSTGRES_URL in"
    return 0
  fi
  url=$(sed -n 's/^pub const POSTGRES_URL_DEFAULT: &str = "\(.*\)";$/\1/p' crates/idem-testkit/src/services.rs)
  [[ $url =~ ^postgres://([^:@/]+):([^@/]+)@127\.0\.0\.1:([0-9]+)/([^/?]+)$ ]] ||
    die "crates/idem-testkit/src/services.rs has no POSTGRES_URL_DEFAULT of the form postgres://USER:PASSWORD@127.0.0.1:PORT/DB"
  user=${BASH_REMATCH[1]} password=${BASH_REMATCH[2]} port=${BASH_REMATCH[3]} db=${BASH_REMATCH[4]}
  if pg_superuser "$url" >/dev/null; then
    log "PostgreSQL lets the tests in as $user on database $db"
    return 0
  fi
  said=$(pg_superuser "$url" || true)
  local as_postgres=()
  if [ "$(id -u)" = 0 ] && id -u postgres >/dev/null 2>&1; then
    as_postgres=(runuser -u postgres --)
  elif [ "$(id -un)" != postgres ]; then
    die "PostgreSQL refuses the tests ($said): run this as root to create database $db and give role $user the tests' password, or set IDEM_TEST_POSTGRES_URL to a superuser's URL"
  fi
  log "PostgreSQL refuses the tests ($said): creating what they need over the local socket"
  said=$(cd / && "${as_postgres[@]}" psql -X -At -v ON_ERROR_STOP=1 -p "$port" -d postgres \
    -v user="$user" -v password="$(scram_secret "$password")" -v db="$db" 2>&1 <<'SQL'
SELECT format('CREATE ROLE %I LOGIN SUPERUSER PASSWORD %L', :'user', :'password')
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'user') \gexec
SELECT format('ALTER ROLE %I PASSWORD %L', :'user', :'password')
  FROM pg_authid WHERE rolname = :'user' AND rolpassword IS NULL \gexec
SELECT format('CREATE DATABASE %I', :'db')
 WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db') \gexec
SQL
  ) || die "PostgreSQL's local socket for port $port did not let the postgres OS user in: $(head -n1 <<<"$said")"
  [ -z "$said" ] || log "PostgreSQL: $(tr '\n' ' ' <<<"$said")"
  local why="pg_hba.conf has no rule that lets $user in on 127.0.0.1 with a password"
  [[ $said == *" ROLE"* ]] || why="role $user has a password of its own, left as it is"
  said=$(pg_superuser "$url") ||
    die "PostgreSQL still refuses the tests ($said): $why; set IDEM_TEST_POSTGRES_URL to a superuser's URL"
  log "PostgreSQL lets the tests in as $user on database $db"
}

# The failover tests build throwaway clusters from the server binaries
# (initdb, pg_ctl, pg_basebackup) and run them as the postgres OS user
# when the tests run as root; the server on 5432 is not enough.
ensure_postgres_binaries() {
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
  if [ -z "$bin" ] || [ ! -x "$bin/initdb" ] || [ ! -x "$bin/pg_basebackup" ]; then
    log "installing the PostgreSQL server binaries"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  if ! id -u postgres >/dev/null 2>&1; then
    log "creating the postgres OS user"
    useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
  fi
  command -v runuser >/dev/null || { echo "runuser (util-linux) is missing" >&2; return 1; }
}

# A service the tests need: if it does not answer, install its Debian
# package when its binary is missing, start it, and wait for it.
ensure_service() { # name port package binary start-command…
  local name=$1 port=$2 package=$3 binary=$4
  shift 4
  if answers 127.0.0.1 "$port"; then
    log "$name answers on 127.0.0.1:$port"
    return 0
  fi
  if ! command -v "$binary" >/dev/null; then
    log "installing $name"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null
  fi
  log "starting $name"
  "$@" >/dev/null 2>&1 || true
  wait_for "$name" 127.0.0.1 "$port" 90
}

# Redis is expected on the machine but no test needs it: warn only.
ensure_redis() {
  answers 127.0.0.1 6379 && return 0
  if command -v redis-server >/dev/null; then
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null 2>&1 || true
  fi
  answers 127.0.0.1 6379 || echo "warning: Redis is not running; no test needs it" >&2
}

# The console's browser test (crates/idem/tests/console.rs) drives
# Debian's Chromium through chromedriver.
ensure_chromium() {
  if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    log "Chromium and chromedriver are installed"
    return 0
  fi
  log "installing Chromium and chromedriver"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
}

# The DynamoDB store's tests run on two independent implementations that
# install from the registries: dynalite (npm) and moto in server mode
# (PyPI), each in a folder of its own under IDEM_EMULATORS_DIR (default
# ~/.cache/idem-emulators), installed once, pinned, started in the
# background with their logs beside them.
emulators_dir() {
  local dir=${IDEM_EMULATORS_DIR:-${HOME:-/root}/.cache/idem-emulators}
  mkdir -p "$dir" && echo "$dir"
}

ensure_dynalite() {
  local dir
  if answers 127.0.0.1 4567; then
    log "dynalite answers on 127.0.0.1:4567"
    return 0
  fi
  dir=$(emulators_dir)/dynalite-$DYNALITE_VERSION
  if [ ! -x "$dir/node_modules/.bin/dynalite" ]; then
    if ! command -v npm >/dev/null; then
      log "installing Node.js and npm"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
    fi
    log "installing dynalite $DYNALITE_VERSION (npm)"
    npm install --silent --no-audit --no-fund --prefix "$dir" "dynalite@$DYNALITE_VERSION" >/dev/null
  fi
  log "starting dynalite"
  nohup "$dir/node_modules/.bin/dynalite" --host 127.0.0.1 --port 4567 \
    --createTableMs 0 --deleteTableMs 0 --updateTableMs 0 >"$dir/dynalite.log" 2>&1 &
  wait_for dynalite 127.0.0.1 4567 60
}

# A fresh virtual environment in dir with one pinned PyPI package
# (installing Python's venv first where Debian left it out).
pip_install() { # dir requirement
  if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
    log "installing Python's venv"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  fi
  log "installing $2 (PyPI)"
  rm -rf "$1" && python3 -m venv "$1"
  "$1/bin/pip" install --quiet --disable-pip-version-check "$2"
}

ensure_moto() {
  local dir
  if answers 127.0.0.1 4568; then
    log "moto answers on 127.0.0.1:4568"
    return 0
  fi
  dir=$(emulators_dir)/moto-$MOTO_VERSION
  [ -x "$dir/bin/moto_server" ] || pip_install "$dir" "moto[server]==$MOTO_VERSION"
  log "starting moto"
  nohup "$dir/bin/moto_server" -H 127.0.0.1 -p 4568 >"$dir/moto.log" 2>&1 &
  wait_for moto 127.0.0.1 4568 60
}

# The Lambda example (examples/lambda-http) runs once end to end under
# cargo lambda's local runtime emulator (`cargo lambda watch`), installed
# from PyPI like moto: two invocations of its API Gateway event with one
# key must be one payout and one replay.
ensure_cargo_lambda() {
  local dir
  dir=$(emulators_dir)/cargo-lambda-$CARGO_LAMBDA_VERSION
  [ -x "$dir/bin/cargo-lambda" ] || pip_install "$dir" "cargo-lambda==$CARGO_LAMBDA_VERSION"
  log "cargo-lambda $CARGO_LAMBDA_VERSION is installed"
}

lambda_end_to_end() {
  local bin work port=9309 watch first again i
  bin=$(emulators_dir)/cargo-lambda-$CARGO_LAMBDA_VERSION/bin
  work=$(mktemp -d)
  PATH="$bin:$PATH" cargo lambda watch -p lambda-http-payouts --wait --ignore-changes \
    -A 127.0.0.1 -P "$port" --env-var "IDEM_STORE=$work/idem.db" >"$work/watch.log" 2>&1 &
  watch=$!
  for ((i = 0; i < 120; i++)); do answers 127.0.0.1 "$port" && break; sleep 1; done
  invoke() {
    PATH="$bin:$PATH" cargo lambda invoke lambda-http-payouts -A 127.0.0.1 -P "$port" \
      --data-file examples/lambda-http/events/payout.json -o json
  }
  first=$(invoke) && again=$(invoke) || {
    kill "$watch" 2>/dev/null; cat "$work/watch.log" >&2
    die "the Lambda example did not answer under cargo lambda watch (log above)"
  }
  kill "$watch" 2>/dev/null; wait "$watch" 2>/dev/null || true
  python3 - "$first" "$again" <<'PY' || { cat "$work/watch.log" >&2; exit 1; }
import json, sys
first, again = (json.loads(a) for a in sys.argv[1:3])
def header(answer, name):
    return {k.lower(): v for k, v in (answer.get("headers") or {}).items()}.get(name)
problems = []
if first.get("statusCode") != 201:
    problems.append(f"the first invocation answered {first.get('statusCode')}, not 201")
if header(first, "idempotent-replayed") is not None:
    problems.append("the first invocation was marked replayed")
if (again.get("statusCode"), again.get("body")) != (first.get("statusCode"), first.get("body")):
    problems.append("the second invocation did not answer what the first did")
if header(again, "idempotent-replayed") != "true":
    problems.append("the second invocation was not marked replayed")
if problems:
    sys.exit("the Lambda example end to end: " + "; ".join(problems) + f"\nfirst: {first}\nagain: {again}")
print("==> the Lambda example end to end: one payout, then its replay")
PY
  rm -rf "$work"
}

# The alert rules (docs/alerts/idem.rules.yml) through Prometheus's own
# checker, where Debian's prometheus package can be installed (it ships
# promtool); crates/idem/tests/gauges.rs parses them everywhere. Only
# promtool is wanted: a Prometheus service the package starts is stopped.
check_alert_rules() {
  if ! command -v promtool >/dev/null; then
    # Read whole, then matched: `apt-cache … | grep -q` under pipefail
    # fails when grep stops reading at its match (apt-cache gets SIGPIPE).
    local policy
    policy=$(apt-cache policy prometheus 2>/dev/null || true)
    if ! grep -q 'Candidate: [0-9]' <<<"$policy"; then
      echo "warning: promtool is not installable here (no prometheus package); the rule file is parsed by the tests only" >&2
      return 0
    fi
    log "installing promtool (Debian's prometheus package)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
      systemctl stop prometheus && systemctl disable --quiet prometheus || true
    fi
  fi
  log "promtool check rules docs/alerts/idem.rules.yml, and its unit tests"
  promtool check rules docs/alerts/idem.rules.yml
  promtool test rules docs/alerts/idem.rules.test.yml
}

# stripe-python, the real client, against idem serve with a route in the
# Stripe error dialect and one without (scripts/stripe_dialect.py); the
# client from PyPI in a venv of its own under IDEM_EMULATORS_DIR.
stripe_dialect() {
  local dir started
  dir=$(emulators_dir)/stripe-$STRIPE_VERSION
  [ -x "$dir/bin/python" ] && "$dir/bin/python" -c 'import stripe' 2>/dev/null \
    || pip_install "$dir" "stripe==$STRIPE_VERSION"
  cargo build -q -p idem
  started=$(date +%s)
  "$dir/bin/python" scripts/stripe_dialect.py target/debug/idem
  log "stripe-python against idem serve took $(($(date +%s) - started)) s"
}

DYNALITE_VERSION=4.0.0
MOTO_VERSION=5.2.6
CARGO_LAMBDA_VERSION=1.9.2
STRIPE_VERSION=16.1.0

bash scripts/check-toolchain.sh
if wanted postgres; then
  ensure_postgres
  ensure_postgres_access
  ensure_postgres_binaries
fi
if wanted chromium; then ensure_chromium; fi
if wanted nats; then
  ensure_service NATS 4222 nats-server nats-server \
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server
fi
if wanted rabbitmq; then ensure_service RabbitMQ 5672 rabbitmq-server rabbitmq-server rabbitmq-server -detached; fi
if wanted redis; then ensure_redis; fi
if wanted dynalite; then ensure_dynalite; fi
if wanted moto; then ensure_moto; fi
if wanted cargo-lambda; then ensure_cargo_lambda; fi
if wanted promtool; then check_alert_rules; fi

# `-p PACKAGE` (or --package) tests those packages instead of the workspace.
scope=(--workspace)
for arg in "$@"; do
  case $arg in
    --) break ;;
    -p | -p* | --package | --package=*) scope=() ;;
  esac
done
log "tests"
cargo test "${scope[@]}" "$@"

# idem-http on its own, with none of its optional features: in the
# workspace run, feature unification turns `jwt` and `otel` on, so the
# refusal of a JWT principal without `jwt` is only seen here.
if [ ${#scope[@]} -gt 0 ] && [ $# -eq 0 ]; then
  log "idem-http without its optional features"
  cargo test -p idem-http --lib
fi

# The gateway's and the consumer's black-box tests once more on each
# DynamoDB emulator: a gateway or consumer a test starts on an SQLite file
# runs on a table of the emulator instead
# (crates/idem/tests/support/dynamo.rs). The cases about SQLite
# itself (an unwritable file, a stalled disk) stay SQLite's.
if [ ${#scope[@]} -gt 0 ] && [ $# -eq 0 ]; then
  # moto's server answers one request at a time: a storm of 1 000 claims
  # takes it seconds, past the bound the storm case puts on "at once", so
  # that case runs on dynalite only.
  for emulator in dynalite moto; do
    wanted "$emulator" || continue
    skip=(--skip _on_sqlite --skip an_unwritable_store_fails_closed)
    [ "$emulator" = moto ] && skip+=(--skip a_retry_storm_waits_within_the_limits)
    log "the gateway's and the consumer's black-box tests on $emulator"
    IDEM_TEST_GATEWAY_STORE=$emulator cargo test -p idem --test gateway --test wait \
      --test attempts --test slow_clients --test reconcile --test consume_nats \
      --test consume_rabbitmq --test gauges -- "${skip[@]}"
  done
fi

if [ ${#scope[@]} -gt 0 ] && [ $# -eq 0 ] && wanted stripe; then
  log "stripe-python against idem serve: the Stripe error dialect"
  stripe_dialect
fi

if [ ${#scope[@]} -gt 0 ] && [ $# -eq 0 ] && wanted cargo-lambda; then
  log "the Lambda example end to end under cargo lambda watch"
  lambda_end_to_end
fi
