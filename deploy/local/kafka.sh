#!/usr/bin/env bash
# Single-node Apache Kafka (KRaft, combined broker+controller) on loopback, from Maven Central jars.
#   kafka.sh up     fetch jars if missing, format storage once, start, wait until ready
#   kafka.sh down   stop the broker this checkout started
#   kafka.sh status
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

pidfile="$KAFKA_DIR/kafka.pid"

running() { [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

fetch() {
  if [[ -f "$KAFKA_LIBS/kafka_2.13-$KAFKA_VERSION.jar" ]]; then return; fi
  command -v mvn >/dev/null || die "Maven (mvn) is needed to fetch Kafka $KAFKA_VERSION; install it (apt-get install maven)"
  command -v java >/dev/null || die "Java 17 is needed to run Kafka; install it (apt-get install openjdk-17-jre-headless)"
  log "fetching Kafka $KAFKA_VERSION jars from Maven Central into $KAFKA_LIBS"
  local tmp="$KAFKA_LIBS.partial"
  rm -rf "$tmp"
  mvn -q -B -f "$DEPLOY_DIR/pom.xml" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$tmp" >&2
  # Rename only when complete, so an interrupted download is never mistaken for a cache hit.
  mv "$tmp" "$KAFKA_LIBS"
}

configure() {
  mkdir -p "$KAFKA_DIR/data"
  cat > "$KAFKA_DIR/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_ADVERTISED_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$KAFKA_DIR/data
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
PROPS
  # Format once: the data directory must survive broker restarts with its messages.
  if [[ ! -f "$KAFKA_DIR/data/meta.properties" ]]; then
    # A cluster id is 16 random bytes in unpadded URL-safe base64 (what `StorageTool random-uuid`
    # prints); made here, it saves a JVM start on every fresh stack. Like Kafka's own, never one
    # that starts with '-': the tool would take it for an option.
    local cluster_id="-"
    while [[ "$cluster_id" == -* ]]; do
      cluster_id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
    done
    # A one-shot tool: the quick JIT tier and the serial collector start it fastest.
    java -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -cp "$KAFKA_LIBS/*" \
      -Dlog4j2.configurationFile="$DEPLOY_DIR/log4j2.properties" \
      kafka.tools.StorageTool format -t "$cluster_id" -c "$KAFKA_DIR/server.properties" >&2
  fi
}

up() {
  if running; then log "kafka already running (pid $(cat "$pidfile")) on 127.0.0.1:$KAFKA_PORT"; return; fi
  if port_open "$KAFKA_PORT"; then
    # Another checkout's broker (or one started by hand) already serves this port: use it, and
    # leave it running afterwards since this checkout did not start it.
    log "a broker already listens on 127.0.0.1:$KAFKA_PORT; using it (set SAGA_KAFKA_PORT for another)"
    return
  fi
  local t0=$SECONDS
  fetch
  configure
  log "starting kafka $KAFKA_VERSION on 127.0.0.1:$KAFKA_PORT"
  KAFKA_LOG_DIR="$KAFKA_DIR" setsid nohup java -Xms256m -Xmx768m -XX:+UseG1GC \
    -Dlog4j2.configurationFile="$DEPLOY_DIR/log4j2.properties" -Dkafka.logs.dir="$KAFKA_DIR" \
    -cp "$KAFKA_LIBS/*" kafka.Kafka "$KAFKA_DIR/server.properties" \
    >"$KAFKA_DIR/server.out" 2>&1 </dev/null &
  echo $! > "$pidfile"
  if ! wait_for "kafka" 120 port_open "$KAFKA_PORT"; then
    tail -n 30 "$KAFKA_DIR/server.out" >&2
    die "kafka did not open 127.0.0.1:$KAFKA_PORT within 120 s (log: $KAFKA_DIR/server.out)"
  fi
  log "kafka ready in $((SECONDS - t0)) s"
}

down() {
  if ! running; then rm -f "$pidfile"; return; fi
  local pid; pid="$(cat "$pidfile")"
  log "stopping kafka (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  # A controlled shutdown takes a few seconds; past the deadline the broker is killed, and KRaft
  # recovers its log on the next start.
  if ! wait_for "kafka exit" 60 bash -c "! kill -0 $pid"; then
    log "kafka did not stop within 60 s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
    wait_for "kafka exit" 10 bash -c "! kill -0 $pid" || true
  fi
  rm -f "$pidfile"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  fetch) fetch ;;
  status) if running; then echo "kafka running (pid $(cat "$pidfile"))"; else echo "kafka stopped"; exit 3; fi ;;
  *) echo "usage: $0 up|down|status|fetch" >&2; exit 2 ;;
esac
