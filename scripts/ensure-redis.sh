#!/usr/bin/env bash
# Makes sure redis-server and redis-cli are on PATH: the tests start their own
# servers on free ports. Installs Debian/Ubuntu's redis-server package when it
# is missing and this user can; otherwise says what to install.
set -euo pipefail
missing() {
  local m=""
  for c in redis-server redis-cli; do
    command -v "$c" >/dev/null 2>&1 || m="$m $c"
  done
  echo "${m# }"
}
m=$(missing)
if [ -z "$m" ]; then
  exit 0
fi
echo "${m// / and } not found on PATH: the tests start their own Redis servers on free ports." >&2
# A failed install is reported below with what to install, not by set -e.
if command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing redis-server with apt-get..." >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null; } || true
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    echo "installing redis-server with sudo apt-get..." >&2
    { sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null; } || true
  fi
fi
if [ -n "$(missing)" ]; then
  cat >&2 <<'MSG'
Could not install redis-server. Install it, then run make test again:
  Debian/Ubuntu: sudo apt-get install redis-server
  Fedora:        sudo dnf install redis
  macOS:         brew install redis
MSG
  exit 1
fi
# The package may start a system service; the tests never use it.
