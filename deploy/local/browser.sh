#!/usr/bin/env bash
# Installs the headless browser the console tests drive: Debian's Chromium and its WebDriver.
# Idempotent: does nothing when /usr/bin/chromium and /usr/bin/chromedriver are there.
set -euo pipefail

if [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; then
    exit 0
fi
SUDO=""
if [[ "$(id -u)" != 0 ]]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
echo "[browser] $(/usr/bin/chromium --version)"
