#!/usr/bin/env bash
# PostgreSQL from Debian's packages, as a dedicated cluster on loopback (its own port and data
# directory, so it never disturbs another cluster on the machine).
#   postgres.sh up     install the package if missing, create the cluster once, start, create role+db
#   postgres.sh down   stop the cluster
#   postgres.sh status
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

pg_version() { ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n1; }

install() {
  if [[ -n "$(pg_version)" ]] && command -v pg_ctlcluster >/dev/null; then return; fi
  [[ $(id -u) -eq 0 ]] || die "PostgreSQL is not installed and installing it needs root (apt-get install postgresql)"
  log "installing PostgreSQL from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  # The package's own default cluster is not needed: only ours is started.
  apt-get install -y -qq postgresql >&2
}

cluster_status() { pg_lsclusters --no-header 2>/dev/null | awk -v c="$PG_CLUSTER" '$2 == c {print $4}'; }

create_cluster() {
  local v="$1"
  if [[ -n "$(cluster_status)" ]]; then return; fi
  log "creating PostgreSQL $v cluster '$PG_CLUSTER' on 127.0.0.1:$PG_PORT"
  pg_createcluster "$v" "$PG_CLUSTER" --port "$PG_PORT" \
    -- --auth-local=peer --auth-host=scram-sha-256 >/dev/null
  # Loopback only; enough connections for several replicas plus tests; the outbox and deadline
  # tables churn, so autovacuum wakes often.
  cat > "/etc/postgresql/$v/$PG_CLUSTER/conf.d/saga.conf" <<CONF
listen_addresses = '127.0.0.1'
max_connections = 200
shared_buffers = 256MB
autovacuum_naptime = 10s
CONF
}

psql_admin() { runuser -u postgres -- psql -p "$PG_PORT" -h /var/run/postgresql -v ON_ERROR_STOP=1 -qAt "$@"; }

provision() { provision_role_and_db psql_admin; }

up() {
  local t0=$SECONDS
  install
  local v; v="$(pg_version)"
  create_cluster "$v"
  if [[ "$(cluster_status)" == online ]]; then
    log "postgres already running on 127.0.0.1:$PG_PORT"
  else
    mkdir -p /var/run/postgresql && chown postgres:postgres /var/run/postgresql
    write_durability "/etc/postgresql/$v/$PG_CLUSTER/conf.d"
    write_transport "/etc/postgresql/$v/$PG_CLUSTER/conf.d"
    pg_ctlcluster "$v" "$PG_CLUSTER" start
    wait_for "postgres" 60 port_open "$PG_PORT" || die "postgres did not open port $PG_PORT within 60 s"
  fi
  provision
  log "postgres ready in $((SECONDS - t0)) s (fsync $(psql_admin -d postgres -c 'SHOW fsync')): postgresql://$PG_USER:$PG_PASSWORD@127.0.0.1:$PG_PORT/$PG_DB"
}

down() {
  local v; v="$(pg_version)"
  [[ -n "$v" && "$(cluster_status)" == online ]] || return 0
  log "stopping postgres cluster '$PG_CLUSTER'"
  pg_ctlcluster "$v" "$PG_CLUSTER" stop -m fast
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) if [[ "$(cluster_status)" == online ]]; then echo "postgres running"; else echo "postgres stopped"; exit 3; fi ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
