#!/usr/bin/env bash
# The local stack: PostgreSQL and Kafka on loopback, no Docker needed.
#   stack.sh up          start what is not running; remember what this call started
#   stack.sh up --untracked   the same, but leave it for `down --all` (a stack started by hand)
#   stack.sh down        stop only what `up` started (a service that ran before is left alone)
#   stack.sh up --registry    also a Schema Registry (deploy/local/registry.sh)
#   stack.sh down --all  stop every service, whoever started them (the registry: if this checkout did)
#   stack.sh env         print the environment variables that point tests and the demo at the stack
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

marker() { echo "$SAGA_LOCAL_DIR/started-$1"; }
TRACK=1
mark() { if [[ $TRACK == 1 ]]; then touch "$(marker "$1")"; fi; }

up() {
  local t0=$SECONDS
  mkdir -p "$SAGA_LOCAL_DIR"
  if ! "$DEPLOY_DIR/postgres.sh" status >/dev/null 2>&1; then
    "$DEPLOY_DIR/postgres.sh" up && mark postgres
  else
    "$DEPLOY_DIR/postgres.sh" up
  fi
  if ! "$DEPLOY_DIR/kafka.sh" status >/dev/null 2>&1; then
    "$DEPLOY_DIR/kafka.sh" up
    # Marked only if this call really started it (not when it found another broker on the port).
    if "$DEPLOY_DIR/kafka.sh" status >/dev/null 2>&1; then mark kafka; fi
  else
    "$DEPLOY_DIR/kafka.sh" up
  fi
  if [[ "$WITH_REGISTRY" == 1 ]]; then
    if ! "$DEPLOY_DIR/registry.sh" status >/dev/null 2>&1; then
      "$DEPLOY_DIR/registry.sh" up
      if "$DEPLOY_DIR/registry.sh" status >/dev/null 2>&1; then mark registry; fi
    fi
  fi
  log "stack ready in $((SECONDS - t0)) s"
}

down() {
  local all="${1:-}"
  for svc in registry kafka postgres; do
    if [[ "$all" == --all || -f "$(marker "$svc")" ]]; then
      "$DEPLOY_DIR/$svc.sh" down
    fi
    rm -f "$(marker "$svc")"
  done
}

env_vars() {
  echo "SAGA_TEST_KAFKA_BOOTSTRAP=127.0.0.1:$KAFKA_PORT"
  echo "SAGA_TEST_DATABASE_URL=postgresql://$PG_USER:$PG_PASSWORD@127.0.0.1:$PG_PORT/$PG_DB"
  if "$DEPLOY_DIR/registry.sh" status >/dev/null 2>&1; then
    echo "SAGA_TEST_SCHEMA_REGISTRY_URL=$("$DEPLOY_DIR/registry.sh" url)"
  fi
}

case "${1:-}" in
  up)
    WITH_REGISTRY=0
    for arg in "${@:2}"; do
      case "$arg" in
        --untracked) TRACK=0 ;;
        --registry) WITH_REGISTRY=1 ;;
        *) echo "usage: $0 up [--untracked] [--registry]" >&2; exit 2 ;;
      esac
    done
    up ;;
  down) down "${2:-}" ;;
  env) env_vars ;;
  *) echo "usage: $0 up|down [--all]|env" >&2; exit 2 ;;
esac
