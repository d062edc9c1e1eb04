#!/usr/bin/env bash
# Makes sure a Chromium browser can be found: the dashboard's test opens /ui/
# in headless Chromium (driven by chromedp) against a daemon it starts on a
# free port. Installs Debian/Ubuntu's chromium package when it is missing and
# this user can; otherwise says what to install.
set -euo pipefail
found() {
  local c
  for c in chromium chromium-browser google-chrome google-chrome-stable headless-shell; do
    command -v "$c" >/dev/null 2>&1 && return 0
  done
  return 1
}
if found; then
  exit 0
fi
echo "chromium not found on PATH: the dashboard's test opens the page in headless Chromium." >&2
# A failed install is reported below with what to install, not by set -e.
if command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing chromium with apt-get..." >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; } || true
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    echo "installing chromium with sudo apt-get..." >&2
    { sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; } || true
  fi
fi
if ! found; then
  cat >&2 <<'MSG'
Could not install Chromium. Install it, then run make test again:
  Debian:        sudo apt-get install chromium
  Ubuntu:        sudo apt-get install chromium-browser (or Google Chrome)
  Fedora:        sudo dnf install chromium
  macOS:         brew install --cask chromium
MSG
  exit 1
fi
