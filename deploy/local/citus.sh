#!/usr/bin/env bash
# A Citus cluster on loopback for the Citus tests: a coordinator and two workers, each a
# PostgreSQL cluster of its own (Debian's pg_createcluster) with the citus extension preloaded.
# Citus is not in Debian's packages: this script uses it when the machine's PostgreSQL has it
# installed (citus.so in its library directory) and says so, exit status 3, when it does not.
#   citus.sh up                 create the clusters once, start them, register the workers
#   citus.sh down               stop the three clusters
#   citus.sh stop-worker N      stop worker N (1 or 2), for the tests of a worker outage
#   citus.sh start-worker N     start it again
#   citus.sh stop-coordinator   stop the coordinator, for the test of its outage
#   citus.sh start-coordinator  start it again
#   citus.sh status             "citus running", "citus stopped" (3) or "citus not installed" (4)
#   citus.sh url                the coordinator's URL
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

CITUS_PORT="${SAGA_CITUS_PORT:-55450}"
NODES=(coordinator worker1 worker2)

pg_version() { ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n1; }
node_port() { case "$1" in coordinator) echo "$CITUS_PORT" ;; worker1) echo $((CITUS_PORT + 1)) ;; worker2) echo $((CITUS_PORT + 2)) ;; esac; }
node_cluster() { echo "saga-citus-$1"; }
installed() { local v; v="$(pg_version)"; [[ -n "$v" && -f "/usr/lib/postgresql/$v/lib/citus.so" ]]; }
node_status() { pg_lsclusters --no-header 2>/dev/null | awk -v c="$(node_cluster "$1")" '$2 == c {print $4}'; }
psql_node() {
  runuser -u postgres -- psql -p "$(node_port "$1")" -h /var/run/postgresql -v ON_ERROR_STOP=1 -qAt "${@:2}"
}

create_node() {
  local v="$1" node="$2" port cluster
  port="$(node_port "$node")"; cluster="$(node_cluster "$node")"
  if [[ -n "$(node_status "$node")" ]]; then return; fi
  log "creating PostgreSQL $v cluster '$cluster' (Citus $node) on 127.0.0.1:$port"
  # Loopback trust: the coordinator opens connections to the workers as the connecting role,
  # without a password file. These clusters listen on 127.0.0.1 only and serve tests only.
  pg_createcluster "$v" "$cluster" --port "$port" -- --auth-local=peer --auth-host=trust >/dev/null
  # Two-phase commit of transactions that span workers needs prepared transactions.
  cat > "/etc/postgresql/$v/$cluster/conf.d/citus.conf" <<CONF
shared_preload_libraries = 'citus'
listen_addresses = '127.0.0.1'
max_connections = 200
max_prepared_transactions = 200
shared_buffers = 128MB
autovacuum_naptime = 10s
CONF
}

# The tests open and close connections by the thousand, each a backend on the coordinator and its
# own connections to the workers: TLS on them (Citus asks for it between nodes by default) cost
# a tenth of the cluster's CPU in handshakes, and JIT compiling the reads that fan out over every
# shard cost another twentieth, on tables of a few rows. Loopback only, for tests only.
write_test_speed() {
  cat > "$1/test-speed.conf" <<CONF
ssl = off
jit = off
citus.node_conninfo = 'sslmode=disable'
CONF
}

start_node() {
  local v="$1" node="$2"
  [[ "$(node_status "$node")" == online ]] && return
  mkdir -p /var/run/postgresql && chown postgres:postgres /var/run/postgresql
  write_durability "/etc/postgresql/$v/$(node_cluster "$node")/conf.d"
  write_test_speed "/etc/postgresql/$v/$(node_cluster "$node")/conf.d"
  pg_ctlcluster "$v" "$(node_cluster "$node")" start
  wait_for "citus $node" 60 port_open "$(node_port "$node")" || die "citus $node did not open its port within 60 s"
}

provision_node() {
  local node="$1"
  provision_role_and_db psql_node "$node"
  psql_node "$node" -d "$PG_DB" -c "CREATE EXTENSION IF NOT EXISTS citus" >&2
}

register_workers() {
  psql_node coordinator -d "$PG_DB" -c "SELECT citus_set_coordinator_host('127.0.0.1', $CITUS_PORT)" >/dev/null
  local w port
  for w in worker1 worker2; do
    port="$(node_port "$w")"
    if [[ "$(psql_node coordinator -d "$PG_DB" -c "SELECT count(*) FROM pg_dist_node WHERE nodeport = $port")" == 0 ]]; then
      psql_node coordinator -d "$PG_DB" -c "SELECT citus_add_node('127.0.0.1', $port)" >/dev/null
    fi
  done
}

up() {
  local t0=$SECONDS v node
  installed || { log "Citus is not installed in this machine's PostgreSQL"; exit 4; }
  v="$(pg_version)"
  for node in "${NODES[@]}"; do create_node "$v" "$node"; done
  # Side by side: three clusters starting one after another would triple the wait.
  for node in "${NODES[@]}"; do start_node "$v" "$node" & done
  wait
  for node in "${NODES[@]}"; do provision_node "$node"; done
  register_workers
  log "citus ready in $((SECONDS - t0)) s (fsync $(psql_node coordinator -c 'SHOW fsync')): $(url)"
}

down() {
  local v node; v="$(pg_version)"
  [[ -n "$v" ]] || return 0
  for node in "${NODES[@]}"; do
    if [[ "$(node_status "$node")" == online ]]; then
      pg_ctlcluster "$v" "$(node_cluster "$node")" stop -m fast &
    fi
  done
  wait
}

# Stops (as a crash would: -m immediate) or starts one node.
node() {
  local v; v="$(pg_version)"
  if [[ "$1" == stop ]]; then
    pg_ctlcluster "$v" "$(node_cluster "$2")" stop -m immediate
  else
    start_node "$v" "$2"
  fi
}

worker() {
  case "$2" in 1|2) ;; *) die "no worker '$2': 1 or 2" ;; esac
  node "$1" "worker$2"
}

url() { echo "postgresql://$PG_USER:$PG_PASSWORD@127.0.0.1:$CITUS_PORT/$PG_DB"; }

status() {
  installed || { echo "citus not installed"; exit 4; }
  local node
  for node in "${NODES[@]}"; do
    [[ "$(node_status "$node")" == online ]] || { echo "citus stopped"; exit 3; }
  done
  echo "citus running"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  stop-worker) worker stop "${2:-}" ;;
  start-worker) worker start "${2:-}" ;;
  stop-coordinator) node stop coordinator ;;
  start-coordinator) node start coordinator ;;
  status) status ;;
  url) url ;;
  *) echo "usage: $0 up|down|stop-worker N|start-worker N|stop-coordinator|start-coordinator|status|url" >&2; exit 2 ;;
esac
