#!/usr/bin/env bash
# Compares two builds of Sluice in one run, alternating them so that a busy
# machine slows both alike (docs/PERFORMANCE.md, "Two builds compared"):
#
#   scripts/compare-builds.sh BASE [NEW]     # git revisions; NEW: the work tree
#
# Four figures per build and round:
#   - in-process: the engine's BenchmarkCheck (memory store), ns per check;
#   - http: the daemon's BenchmarkHTTPCheck (HTTP API, memory store), ns per check;
#   - redis-16, redis-64: checks/s of `sluice serve` on a redis-server of
#     its own, driven over HTTP by one sluice-load (the same binary for both
#     builds) with 16 and 64 callers, 10,000 keys.
# Then the ratio NEW / BASE of each figure's median (above 1 is better for
# checks/s, below 1 for ns per check).
#
# Environment: ROUNDS (3), DURATION (5s per load run), BENCHTIME (2s),
# PORT (base port, default 18380). Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:?usage: compare-builds.sh BASE [NEW]}
NEW=${2:-}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5s}
BENCHTIME=${BENCHTIME:-2s}
PORT=${PORT:-18380}
out=$(mktemp -d)
RP=""; SP=""
cleanup() {
  kill $SP $RP 2>/dev/null || true; wait $SP $RP 2>/dev/null || true
  git worktree remove --force "$out/base-tree" 2>/dev/null || true
  [ -n "$NEW" ] && git worktree remove --force "$out/new-tree" 2>/dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT

build() { # name tree
  local name=$1 tree=$2
  (cd "$tree" && go build -o "$out/$name-sluice" ./cmd/sluice &&
    go test -c -o "$out/$name-engine.test" ./internal/engine &&
    go test -c -o "$out/$name-daemon.test" ./internal/daemon)
  echo "$tree"
}
git worktree add -q --detach "$out/base-tree" "$BASE"
build base "$out/base-tree" >"$out/base.dir"
if [ -n "$NEW" ]; then
  git worktree add -q --detach "$out/new-tree" "$NEW"
  build new "$out/new-tree" >"$out/new.dir"
else
  build new "$PWD" >"$out/new.dir"
fi
(cd bench && go build -o "$out/sluice-load" ./cmd/sluice-load)

RPORT=$((PORT+20))
redis-server --port $RPORT --bind 127.0.0.1 --save '' --appendonly no >"$out/redis.log" 2>&1 &
RP=$!
for _ in $(seq 50); do redis-cli -p $RPORT ping >/dev/null 2>&1 && break; sleep 0.1; done

bench() { # name package benchmark: prints ns/op
  local dir; dir=$(cat "$out/$1.dir")
  (cd "$dir/internal/$2" && "$out/$1-$2.test" -test.run '^$' -test.bench "^$3\$" -test.benchtime "$BENCHTIME") |
    awk '$1 ~ /^Benchmark/ && $4 == "ns/op" && !done {print $3; done = 1}'
}
load() { # name callers: prints checks/s
  "$out/$1-sluice" serve --config examples/load.yaml --store redis://127.0.0.1:$RPORT --log-level warn \
    --http-addr 127.0.0.1:$PORT --grpc-addr 127.0.0.1:$((PORT+1)) 2>"$out/serve.log" &
  SP=$!
  for _ in $(seq 100); do curl -sf http://127.0.0.1:$PORT/readyz >/dev/null 2>&1 && break; sleep 0.1; done
  "$out/sluice-load" --target http --addr 127.0.0.1:$PORT --duration "$DURATION" --concurrency "$2" \
    --keys 10000 --quiet --json | python3 -c 'import json,sys; print("%.0f" % json.load(sys.stdin)["check_throughput"])'
  kill $SP; wait $SP 2>/dev/null || true; SP=""
}

echo "base $BASE, new ${NEW:-work tree}; $ROUNDS rounds; $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  order="base new"; [ $((r % 2)) -eq 0 ] && order="new base"
  for b in $order; do
    line="$b in-process $(bench $b engine BenchmarkCheck) ns"
    line="$line http $(bench $b daemon BenchmarkHTTPCheck) ns"
    line="$line redis-16 $(load $b 16) checks/s"
    line="$line redis-64 $(load $b 64) checks/s"
    echo "round $r $line" | tee -a "$out/results"
  done
done
python3 - "$out/results" <<'PY'
import statistics, sys
vals = {}
for line in open(sys.argv[1]):
    w = line.split()
    build = w[2]
    for name, i in (("in-process", 4), ("http", 7), ("redis-16", 10), ("redis-64", 13)):
        vals.setdefault((build, name), []).append(float(w[i]))
for name, unit in (("in-process", "ns/check"), ("http", "ns/check"), ("redis-16", "checks/s"), ("redis-64", "checks/s")):
    b, n = statistics.median(vals[("base", name)]), statistics.median(vals[("new", name)])
    print("%-10s base %10.0f  new %10.0f %-8s  new/base %.3f" % (name, b, n, unit, n / b))
PY
