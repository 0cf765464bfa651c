#!/usr/bin/env bash
# A Schema Registry on loopback: Apicurio Registry from Maven Central, its Confluent-compatible
# API at http://127.0.0.1:$SAGA_REGISTRY_PORT/apis/ccompat/v7.
#   registry.sh up       fetch the app if missing, start it, wait until it answers
#   registry.sh down     stop the registry this checkout started
#   registry.sh status
#   registry.sh url      print the API's address
#   registry.sh fetch
# Its schemas live in an H2 file under $SAGA_LOCAL_DIR, so a stop and a start keep them (and
# their ids), as a production registry's storage does; SAGA_REGISTRY_STORAGE=memory keeps them
# in memory instead (the app's own default: a restart forgets every schema).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

REGISTRY_PORT="${SAGA_REGISTRY_PORT:-18081}"
REGISTRY_MANAGEMENT_PORT="${SAGA_REGISTRY_MANAGEMENT_PORT:-18082}"
REGISTRY_DIR="$SAGA_LOCAL_DIR/registry"
pidfile="$REGISTRY_DIR/registry.pid"
# The newest Apicurio needs Java 21 or later; 3.0.9 is the last that runs on Java 17.
NEW_VERSION=3.3.3
OLD_VERSION=3.0.9
REGISTRY_STORAGE="${SAGA_REGISTRY_STORAGE:-file}"

running() { [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

java_major() { "$1" -version 2>&1 | sed -n 's/.* version "\([0-9]*\).*/\1/p' | head -n 1; }

# choose: sets JAVA and VERSION: a JDK of 21 or later if one is installed, else the machine's.
choose() {
  JAVA="${SAGA_REGISTRY_JAVA:-}"
  if [[ -z "$JAVA" ]]; then
    local candidate
    for candidate in ${JAVA_HOME:+"$JAVA_HOME/bin/java"} /usr/lib/jvm/*/bin/java; do
      [[ -x "$candidate" ]] || continue
      if (( $(java_major "$candidate" || echo 0) >= 21 )); then JAVA="$candidate"; break; fi
    done
  fi
  JAVA="${JAVA:-java}"
  command -v "$JAVA" >/dev/null || die "Java is needed to run the registry; install it (apt-get install openjdk-17-jre-headless)"
  if (( $(java_major "$JAVA" || echo 0) >= 21 )); then VERSION=$NEW_VERSION; else VERSION=$OLD_VERSION; fi
  APP_DIR="$SAGA_CACHE_DIR/apicurio-registry-$VERSION"
}

fetch() {
  choose
  if [[ -d "$APP_DIR" ]]; then return; fi
  command -v mvn >/dev/null || die "Maven (mvn) is needed to fetch Apicurio Registry $VERSION; install it (apt-get install maven)"
  log "fetching Apicurio Registry $VERSION from Maven Central into $APP_DIR"
  local tmp="$APP_DIR.partial"
  rm -rf "$tmp" && mkdir -p "$tmp"
  mvn -q -B dependency:copy -Dartifact="io.apicurio:apicurio-registry-app:$VERSION:tar.gz:all" \
      -DoutputDirectory="$tmp" >&2
  tar -xzf "$tmp/apicurio-registry-app-$VERSION-all.tar.gz" -C "$tmp"
  rm -f "$tmp/apicurio-registry-app-$VERSION-all.tar.gz"
  # Renamed only when complete, so an interrupted download is never mistaken for a cache hit.
  mv "$tmp" "$APP_DIR"
}

answers() { curl -sf "http://127.0.0.1:$REGISTRY_PORT/apis/ccompat/v7/subjects" >/dev/null; }

# The app's jar: quarkus-run.jar in 3.1 and later, <name>-runner.jar before.
app_jar() {
  local jar
  for jar in "$APP_DIR/quarkus-run.jar" "$APP_DIR"/*-runner.jar; do
    if [[ -f "$jar" ]]; then echo "$jar"; return; fi
  done
  die "no runnable jar in $APP_DIR (remove it to fetch again)"
}

# Ready, or the process gone: a start that failed is reported at once, not after the deadline.
answers_or_died() { answers || ! kill -0 "$(cat "$pidfile")" 2>/dev/null; }

up() {
  if running; then log "registry already running (pid $(cat "$pidfile")) on 127.0.0.1:$REGISTRY_PORT"; return; fi
  if port_open "$REGISTRY_PORT"; then
    log "something already listens on 127.0.0.1:$REGISTRY_PORT; using it (set SAGA_REGISTRY_PORT for another)"
    return
  fi
  local t0=$SECONDS storage=()
  fetch
  case "$REGISTRY_STORAGE" in
    # The same SQL storage as the app's default, in a file instead of memory; one per version,
    # since the two bundle different H2 releases, whose files need not open in the other.
    file) storage=(-Dapicurio.datasource.url="jdbc:h2:file:$REGISTRY_DIR/data-$VERSION/registry") ;;
    memory) ;;
    *) die "SAGA_REGISTRY_STORAGE must be file or memory, not '$REGISTRY_STORAGE'" ;;
  esac
  local jar; jar="$(app_jar)"
  mkdir -p "$REGISTRY_DIR"
  log "starting Apicurio Registry $VERSION on 127.0.0.1:$REGISTRY_PORT, $REGISTRY_STORAGE storage ($("$JAVA" -version 2>&1 | head -n 1))"
  # Loopback only, both the API and the management port (health, metrics). A small heap: the
  # schemas of a test run are few. Quarkus's own temporary files stay in the run directory.
  setsid nohup "$JAVA" -Xms64m -Xmx384m -XX:+UseSerialGC -Djava.io.tmpdir="$REGISTRY_DIR" \
    -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$REGISTRY_PORT" \
    -Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port="$REGISTRY_MANAGEMENT_PORT" \
    "${storage[@]}" -Dapicurio.storage.snapshot.location="$REGISTRY_DIR" \
    -jar "$jar" >"$REGISTRY_DIR/registry.out" 2>&1 </dev/null &
  echo $! > "$pidfile"
  if ! wait_for "registry" 120 answers_or_died || ! answers; then
    tail -n 30 "$REGISTRY_DIR/registry.out" >&2
    die "the registry did not answer on 127.0.0.1:$REGISTRY_PORT within 120 s (log: $REGISTRY_DIR/registry.out)"
  fi
  log "registry ready in $((SECONDS - t0)) s"
}

down() {
  if ! running; then rm -f "$pidfile"; return; fi
  local pid; pid="$(cat "$pidfile")"
  log "stopping the registry (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  if ! wait_for "registry exit" 30 bash -c "! kill -0 $pid"; then
    log "the registry did not stop within 30 s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
    wait_for "registry exit" 10 bash -c "! kill -0 $pid" || true
  fi
  rm -f "$pidfile"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  fetch) fetch ;;
  url) echo "http://127.0.0.1:$REGISTRY_PORT/apis/ccompat/v7" ;;
  status) if running; then echo "registry running (pid $(cat "$pidfile"))"; else echo "registry stopped"; exit 3; fi ;;
  *) echo "usage: $0 up|down|status|url|fetch" >&2; exit 2 ;;
esac
