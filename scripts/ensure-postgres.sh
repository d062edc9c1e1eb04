#!/usr/bin/env bash
# Makes sure initdb and postgres can be found: the analytics tests start their
# own PostgreSQL server on a free port (never 5432). Debian/Ubuntu install the
# binaries under /usr/lib/postgresql/VERSION/bin, off PATH; the tests look there
# too. Installs the distribution's postgresql package when it is missing and
# this user can; otherwise says what to install.
set -euo pipefail
found() {
  if command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1; then
    return 0
  fi
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && return 0
  done
  return 1
}
if found; then
  exit 0
fi
echo "initdb and postgres not found: the analytics tests start their own PostgreSQL server." >&2
# A failed install is reported below with what to install, not by set -e.
if command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing postgresql with apt-get..." >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } || true
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    echo "installing postgresql with sudo apt-get..." >&2
    { sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } || true
  fi
fi
if ! found; then
  cat >&2 <<'MSG'
Could not install PostgreSQL. Install it, then run make test again:
  Debian/Ubuntu: sudo apt-get install postgresql
  Fedora:        sudo dnf install postgresql-server
  macOS:         brew install postgresql
MSG
  exit 1
fi
# The package may start a system service on 5432; the tests never use it.
