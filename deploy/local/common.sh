# Shared settings for the local stack scripts (sourced, not run).
# Everything the stack writes at run time lives under $SAGA_LOCAL_DIR (in the checkout, ignored by
# git); downloaded jars live under $SAGA_CACHE_DIR so a fresh clone reuses them.
set -euo pipefail

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEPLOY_DIR="$REPO_DIR/deploy/local"
SAGA_LOCAL_DIR="${SAGA_LOCAL_DIR:-$REPO_DIR/.local}"
SAGA_CACHE_DIR="${SAGA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/saga-processor}"

KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$DEPLOY_DIR/pom.xml")"
KAFKA_PORT="${SAGA_KAFKA_PORT:-19092}"
KAFKA_CONTROLLER_PORT="${SAGA_KAFKA_CONTROLLER_PORT:-19093}"
# The port clients are told to connect to: the broker's own, unless a proxy stands in front of it
# (tests that black-hole the broker).
KAFKA_ADVERTISED_PORT="${SAGA_KAFKA_ADVERTISED_PORT:-$KAFKA_PORT}"
KAFKA_LIBS="$SAGA_CACHE_DIR/kafka-$KAFKA_VERSION/libs"
KAFKA_DIR="$SAGA_LOCAL_DIR/kafka"

PG_PORT="${SAGA_PG_PORT:-55432}"
PG_CLUSTER="${SAGA_PG_CLUSTER:-saga}"
PG_USER="saga"
PG_PASSWORD="saga"
PG_DB="saga"
# fsync of a cluster this stack starts: on, unless the test run turns it off (tests/run.py). With
# it off a commit still hands its WAL to the kernel, so a killed PostgreSQL (what the tests do)
# loses nothing; only a crash of the machine could. Benchmarks and the demo keep it on.
PG_FSYNC="${SAGA_LOCAL_PG_FSYNC:-on}"
# TLS on loopback connections of a cluster this stack starts: as Debian makes it (on), unless the
# test run turns it off. A test run opens tens of thousands of connections, each a handshake.
PG_SSL="${SAGA_LOCAL_PG_SSL:-on}"

log() { printf '[stack] %s\n' "$*" >&2; }
die() { printf '[stack] error: %s\n' "$*" >&2; exit 1; }

# wait_for DESCRIPTION SECONDS COMMAND...: polls COMMAND until it succeeds or the deadline passes.
wait_for() {
  local what="$1" seconds="$2"; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if (( SECONDS >= deadline )); then return 1; fi
    sleep 0.3
  done
}

# write_durability CONF_DIR: the fsync setting, written before each start of a cluster (a cluster
# already running is left as it is).
write_durability() {
  [[ "$PG_FSYNC" == on || "$PG_FSYNC" == off ]] || die "SAGA_LOCAL_PG_FSYNC must be on or off, not '$PG_FSYNC'"
  printf 'fsync = %s\n' "$PG_FSYNC" > "$1/durability.conf"
}

# write_transport CONF_DIR: TLS off when SAGA_LOCAL_PG_SSL is off; else the cluster's own setting.
write_transport() {
  [[ "$PG_SSL" == on || "$PG_SSL" == off ]] || die "SAGA_LOCAL_PG_SSL must be on or off, not '$PG_SSL'"
  if [[ "$PG_SSL" == off ]]; then printf 'ssl = off\n' > "$1/transport.conf"; else rm -f "$1/transport.conf"; fi
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# provision_role_and_db PSQL...: the tests' role and database, once, through the given psql
# command (each cluster script has its own wrapper: port and socket of its cluster).
provision_role_and_db() {
  "$@" -d postgres <<SQL >&2
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') THEN
    CREATE ROLE $PG_USER LOGIN SUPERUSER PASSWORD '$PG_PASSWORD';
  END IF;
END \$\$;
SQL
  if [[ "$("$@" -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" != 1 ]]; then
    "$@" -d postgres -c "CREATE DATABASE $PG_DB OWNER $PG_USER" >&2
  fi
}
