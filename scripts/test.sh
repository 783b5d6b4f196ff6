#!/usr/bin/env bash
# The whole test suite on a machine that may have none of its services:
# installs (Debian packages) and starts whatever does not answer —
# PostgreSQL with its server binaries, NATS with JetStream, RabbitMQ,
# Chromium and chromedriver — then runs `cargo test --workspace` with any
# arguments given. Installing needs root; on a machine whose services
# already answer, `cargo test --workspace` alone does the same.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*"; }

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

ensure_postgres
ensure_postgres_binaries
ensure_chromium
ensure_service NATS 4222 nats-server nats-server \
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server
ensure_service RabbitMQ 5672 rabbitmq-server rabbitmq-server rabbitmq-server -detached
ensure_redis

log "tests"
exec cargo test --workspace "$@"
