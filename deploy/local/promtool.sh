#!/usr/bin/env bash
# Fetches promtool, which tests deploy/prometheus/alerts.yml, from Debian's prometheus package.
# Only the binary is unpacked into $SAGA_CACHE_DIR (no install: the package would also set up a
# Prometheus server). Idempotent; prints promtool's path.
set -euo pipefail
source "$(dirname "$0")/common.sh"

dest="$SAGA_CACHE_DIR/promtool"
tool="$dest/usr/bin/promtool"
if [[ -x "$tool" ]]; then
    echo "$tool"
    exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
if ! apt-get download prometheus >/dev/null 2>&1; then
    SUDO=""
    if [[ "$(id -u)" != 0 ]]; then
        SUDO="sudo"
    fi
    $SUDO apt-get update -qq
    apt-get download prometheus >/dev/null
fi
mkdir -p "$dest"
dpkg-deb -x prometheus_*.deb "$work/x"
mkdir -p "$dest/usr/bin"
cp "$work/x/usr/bin/promtool" "$tool"
printf '[promtool] %s\n' "$("$tool" --version 2>&1 | head -1)" >&2
echo "$tool"
