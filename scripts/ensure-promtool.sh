#!/usr/bin/env bash
# Installs promtool (Debian/Ubuntu package "prometheus") when it is missing and
# this user can, so that `make test` checks and unit-tests the alerting rules in
# deploy/prometheus with it. Never fails: without promtool the Go test in
# deploy/ still parses the rules and the dashboard and checks every metric
# name they use.
set -uo pipefail
if command -v promtool >/dev/null 2>&1; then
  exit 0
fi
# No pipe into grep -q here: with pipefail, apt-cache killed by SIGPIPE once
# grep has its match would fail the test.
if command -v apt-get >/dev/null 2>&1 && [[ "$(apt-cache policy prometheus 2>/dev/null)" == *"Candidate: "[0-9]* ]]; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing promtool (package prometheus) with apt-get..." >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null || true
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    echo "installing promtool (package prometheus) with sudo apt-get..." >&2
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null || true
  fi
fi
if ! command -v promtool >/dev/null 2>&1; then
  echo "promtool not available: the rules in deploy/prometheus are checked by the Go test only." >&2
fi
exit 0
