#!/usr/bin/env bash
# What the analytics cost the checks, measured in one run (docs/PERFORMANCE.md):
# `sluice serve --config examples/load.yaml` three times, with the analytics
# off (--no-analytics), in memory (the default) and on PostgreSQL
# (--analytics), each server on one core, loaded in turn by `sluice-load
# --target grpc` (64 callers, 1000 keys, one thread) for ROUNDS rounds in a
# rotating order, so that the machine's noise falls on each alike. Then
# PostgreSQL is killed (SIGKILL) and the rounds run again, the PostgreSQL
# server still writing into it (its writes fail, its checks go on), and
# PostgreSQL is restarted. It prints each run, the medians, and the
# analytics metrics and answer of the PostgreSQL server while PostgreSQL is
# down and after its restart.
#
# PostgreSQL: initdb and postgres from PATH (run as the postgres user when
# run as root), on PORT+9, in a temporary directory, fsync off.
#
# Environment: ROUNDS (5), DURATION (5s), PORT (18280). Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5s}
PORT=${PORT:-18280}
work=$(mktemp -d)
bin=$work/sluice
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
go build -o "$bin" ./cmd/sluice
(cd bench && go build -o "$work/sluice-load" ./cmd/sluice-load)

as_pg=()
if [ "$(id -u)" = 0 ]; then
  chown postgres "$work"
  as_pg=(runuser -u postgres --)
fi
"${as_pg[@]}" initdb -D "$work/pg" -U sluice -A trust -E UTF8 --no-sync --locale=C >/dev/null
pgport=$((PORT + 9))
"${as_pg[@]}" postgres -D "$work/pg" -p "$pgport" -k "$work" -c listen_addresses=127.0.0.1 -c fsync=off \
  >"$work/pg.log" 2>&1 &
pgpid=$!
pids+=("$pgpid")
url="postgres://sluice@127.0.0.1:$pgport/postgres"
for _ in $(seq 50); do
  "$bin" migrate --analytics "$url" >/dev/null 2>&1 && break
  sleep 0.2
done

names=(off memory postgres)
flags=("--no-analytics" "" "--analytics $url")
for i in 0 1 2; do
  # shellcheck disable=SC2086
  GOMAXPROCS=1 "$bin" serve --config examples/load.yaml --log-level error \
    --http-addr "127.0.0.1:$((PORT + 2 * i))" --grpc-addr "127.0.0.1:$((PORT + 2 * i + 1))" ${flags[$i]} &
  pids+=($!)
done
sleep 1

declare -A rates p99s
run() { # phase round
  for j in 0 1 2; do
    i=$(( ($2 + j) % 3 ))
    out=$("$work/sluice-load" --target grpc --addr "127.0.0.1:$((PORT + 2 * i + 1))" --duration "$DURATION" \
      --concurrency 64 --keys 1000 --threads 1 --json)
    read -r rate p99 < <(python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["throughput"], r["latency_ms"]["p99"])' <<<"$out")
    printf '%-10s round %d %-9s %10.0f checks/s  p99 %6.2f ms\n' "$1" "$2" "${names[$i]}" "$rate" "$p99"
    rates[$1,$i]+="$rate "
    p99s[$1,$i]+="$p99 "
  done
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for r in $(seq 0 $((ROUNDS - 1))); do run "pg-up" "$r"; done
# The postmaster and its backends (which would go on serving their
# connections), by their process ids.
pm=$(head -1 "$work/pg/postmaster.pid")
kill -9 "$pm" $(pgrep -P "$pm") 2>/dev/null || true
sleep 1
for r in $(seq 0 $((ROUNDS - 1))); do run "pg-killed" "$r"; done
for phase in pg-up pg-killed; do
  off=$(median <<<"${rates[$phase,0]}")
  for i in 0 1 2; do
    m=$(median <<<"${rates[$phase,$i]}")
    printf '%-10s %-9s median %10.0f checks/s (%.3f of off), median p99 %s ms\n' "$phase" "${names[$i]}" "$m" \
      "$(awk -v a="$m" -v b="$off" 'BEGIN {print a / b}')" "$(median <<<"${p99s[$phase,$i]}")"
  done
done
echo "PostgreSQL killed:"
curl -s "http://127.0.0.1:$((PORT + 4))/metrics" | grep '^sluice_analytics_'
# Restarted on its data: the server's next writes succeed, and the rollups
# kept meanwhile reach it.
"${as_pg[@]}" postgres -D "$work/pg" -p "$pgport" -k "$work" -c listen_addresses=127.0.0.1 -c fsync=off \
  >>"$work/pg.log" 2>&1 &
pids+=($!)
sleep 22
echo "PostgreSQL restarted, two flushes later:"
curl -s "http://127.0.0.1:$((PORT + 4))/metrics" | grep -E '^sluice_analytics_(sink|events_dropped)'
curl -s "http://127.0.0.1:$((PORT + 4))/api/v1/analytics?granularity=hour" | python3 -c '
import json, sys
a = json.load(sys.stdin)
print("GET /api/v1/analytics from", a["source"], ":", a["summary"]["total_requests"], "checks this hour, gaps", a["gaps"])'
