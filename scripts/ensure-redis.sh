#!/usr/bin/env bash
# Makes sure redis-server and redis-cli are on PATH: the tests start their own
# servers on free ports. Installs Debian/Ubuntu's redis-server package when it
# is missing and this user can; otherwise says what to install.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
  exit 0
fi
echo "redis-server not found; the tests need it (they start their own servers on free ports)." >&2
if command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing redis-server with apt-get..." >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    echo "installing redis-server with sudo apt-get..." >&2
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
fi
if ! command -v redis-server >/dev/null 2>&1; then
  cat >&2 <<'MSG'
Could not install redis-server. Install it, then run make test again:
  Debian/Ubuntu: sudo apt-get install redis-server
  Fedora:        sudo dnf install redis
  macOS:         brew install redis
MSG
  exit 1
fi
# The package may start a system service; the tests never use it.
