#!/usr/bin/env bash
# Runs the load runs of docs/PERFORMANCE.md: `sluice-load` against
# `sluice serve --config examples/load.yaml` and against the no-op reference
# server (bench/cmd/noop), interleaved, and prints one line per run
# with the server's CPU time per request, then the engine's own latency
# from /metrics.
#
#   scripts/load-runs.sh                       # memory store
#   STORE=redis scripts/load-runs.sh           # a redis-server of its own on PORT+20
#   STORE=redis://127.0.0.1:6390 scripts/load-runs.sh
#
# With a Redis store it also prints the Redis commands per check of each
# Sluice run, from INFO commandstats before and after.
#
# Environment: STORE (default memory://), DURATION (10s), CONCURRENCY (64),
# KEYS (1000), TARGETS ("http grpc envoy"), BATCH (10; 0 skips the batch
# runs), GRPC_CLIENT (h2, the load generator's own; grpc-go), THREADS (the load
# generator's --threads on the gRPC and Envoy targets, default 1; 0: one per core),
# SERVER_PROCS (GOMAXPROCS of both servers; empty: Go's default, one per core),
# SERVER_GODEBUG (GODEBUG of both servers; empty: Go's defaults),
# PORT (base port, default 18180: sluice on PORT and PORT+1, the
# reference on PORT+10 and PORT+11). Loopback only.
#
# RATELIMIT_BIN: the path of an envoyproxy/ratelimit server binary, built
# by you from its repository. With a Redis store, each Envoy run is then
# followed by one against it, on the same Redis (its own keys), serving the
# same limit, with the servers' GOMAXPROCS and GODEBUG, its stats off and
# everything else at its defaults (RATELIMIT_ENV adds settings, as
# NAME=value words), on PORT+30 to PORT+32.
set -euo pipefail
cd "$(dirname "$0")/.."
STORE=${STORE:-memory://}
DURATION=${DURATION:-10s}
CONCURRENCY=${CONCURRENCY:-64}
KEYS=${KEYS:-1000}
TARGETS=${TARGETS:-http grpc envoy}
BATCH=${BATCH:-10}
PORT=${PORT:-18180}
GRPC_CLIENT=${GRPC_CLIENT:-h2}
THREADS=${THREADS:-1}
SERVER_PROCS=${SERVER_PROCS:-}
SERVER_GODEBUG=${SERVER_GODEBUG:-}
RATELIMIT_BIN=${RATELIMIT_BIN:-}
RATELIMIT_ENV=${RATELIMIT_ENV:-}
case "$RATELIMIT_BIN:$STORE" in
  :*|*:redis|*:redis://*) ;;
  *) echo "RATELIMIT_BIN needs a plain Redis store (STORE=redis)" >&2; exit 2;;
esac
mkdir -p bin
go build -o bin/sluice ./cmd/sluice
(cd bench && go build -o ../bin/sluice-load ./cmd/sluice-load && go build -o ../bin/noop ./cmd/noop)
out=$(mktemp -d)
RP=""
if [ "$STORE" = redis ]; then
  redis-server --port $((PORT+20)) --bind 127.0.0.1 --save '' --appendonly no >"$out/redis.log" 2>&1 &
  RP=$!
  STORE=redis://127.0.0.1:$((PORT+20))
  for _ in $(seq 50); do redis-cli -p $((PORT+20)) ping >/dev/null 2>&1 && break; sleep 0.1; done
fi
redis_calls() { # total commands executed, excluding INFO itself
  redis-cli -u "$STORE" info commandstats | awk -F'[:=,]' '/^cmdstat_/ && $1 != "cmdstat_info" {n += $3} END {print n+0}'
}
procs=(); [ -n "$SERVER_PROCS" ] && procs=(GOMAXPROCS="$SERVER_PROCS")
[ -n "$SERVER_GODEBUG" ] && procs+=(GODEBUG="$SERVER_GODEBUG")
env "${procs[@]}" bin/sluice serve --config examples/load.yaml --store "$STORE" --log-level warn \
  --http-addr 127.0.0.1:$PORT --grpc-addr 127.0.0.1:$((PORT+1)) 2>"$out/serve.log" &
SP=$!
env "${procs[@]}" bin/noop --http-addr 127.0.0.1:$((PORT+10)) --grpc-addr 127.0.0.1:$((PORT+11)) 2>"$out/noop.log" &
NP=$!
LP=""
if [ -n "$RATELIMIT_BIN" ]; then
  mkdir -p "$out/rt/ratelimit/config"
  # The limit of examples/load.yaml's envoy section, in its own format.
  printf 'domain: load\ndescriptors:\n  - key: client_id\n    rate_limit: { unit: minute, requests_per_unit: 1000 }\n' \
    >"$out/rt/ratelimit/config/load.yaml"
  hp=${STORE#redis://}; hp=${hp%%/*}
  # shellcheck disable=SC2086 # RATELIMIT_ENV is a list of words
  env "${procs[@]}" DISABLE_STATS=true USE_STATSD=false LOG_LEVEL=warn RUNTIME_ROOT="$out/rt" RUNTIME_SUBDIRECTORY=ratelimit \
    RUNTIME_WATCH_ROOT=false REDIS_SOCKET_TYPE=tcp REDIS_URL="$hp" HOST=127.0.0.1 PORT=$((PORT+30)) \
    GRPC_HOST=127.0.0.1 GRPC_PORT=$((PORT+31)) DEBUG_HOST=127.0.0.1 DEBUG_PORT=$((PORT+32)) $RATELIMIT_ENV \
    "$RATELIMIT_BIN" >"$out/ratelimit.log" 2>&1 &
  LP=$!
fi
trap 'kill $SP $NP $RP $LP 2>/dev/null; wait $SP $NP $RP $LP 2>/dev/null; rm -rf "$out"' EXIT
sleep 1
if [ -n "$LP" ]; then # it loads its configuration and dials Redis first
  for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$((PORT+31))) 2>/dev/null && break; sleep 0.1; done
fi
kill -0 $SP $NP $LP || { cat "$out"/*.log; exit 1; }
cpu() { awk '{print $14+$15}' /proc/$1/stat; }  # clock ticks
tck=$(getconf CLK_TCK)
run() { # name pid target addr [extra flags]
  local name=$1 pid=$2 t=$3 a=$4; shift 4
  local c0; c0=$(cpu $pid)
  local r0=0; case "$STORE:$name" in redis*:sluice*|redis*:ratelimit*) r0=$(redis_calls);; esac
  local threads=0; [ "$t" != http ] && threads=$THREADS
  bin/sluice-load --target $t --addr $a --duration $DURATION --concurrency $CONCURRENCY \
    --keys $KEYS --domain load --grpc-client $GRPC_CLIENT --threads $threads --json "$@" >"$out/$name.json" || true
  local c1; c1=$(cpu $pid)
  local r1=0; case "$STORE:$name" in redis*:sluice*|redis*:ratelimit*) r1=$(redis_calls);; esac
  python3 - "$out/$name.json" "$name" $(( c1 - c0 )) $tck $(( r1 - r0 )) <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
l = r.get("latency_ms") or dict.fromkeys(("p50", "p90", "p99", "p999", "max"), float("nan"))  # none answered
cpu_us = int(sys.argv[3]) * 1e6 / int(sys.argv[4]) / max(r["requests"], 1)
redis = int(sys.argv[5])
extra = "  redis cmds/check %.2f" % (redis / max(r["checks"], 1)) if redis else ""
print("%-20s %7.0f req/s %8.0f checks/s  p50 %5.2f  p90 %5.2f  p99 %5.2f  p999 %6.2f  max %6.1f ms  allowed %d denied %d errors %d  server cpu %.1f us/req%s"
      % (sys.argv[2], r["throughput"], r["check_throughput"], l["p50"], l["p90"], l["p99"], l["p999"], l["max"],
         r["allowed"], r["denied"], r["errors"], cpu_us, extra))
PY
}
echo "store $(echo "$STORE" | sed 's|//[^@]*@|//|'), gRPC client $GRPC_CLIENT ($THREADS threads), servers' GOMAXPROCS ${SERVER_PROCS:-default}${SERVER_GODEBUG:+ and GODEBUG $SERVER_GODEBUG}, $CONCURRENCY callers, $KEYS keys, $DURATION per run; $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for t in $TARGETS; do
  p=$((PORT+1)); np=$((PORT+11))
  if [ "$t" = http ]; then p=$PORT; np=$((PORT+10)); fi
  run "sluice-$t" $SP $t 127.0.0.1:$p
  run "reference-$t" $NP $t 127.0.0.1:$np
  if [ "$t" = envoy ] && [ -n "$LP" ]; then
    run "ratelimit-$t" $LP $t 127.0.0.1:$((PORT+31))
  fi
done
if [ "$BATCH" -gt 1 ]; then
  run "sluice-http-batch$BATCH" $SP http 127.0.0.1:$PORT --batch $BATCH
  run "sluice-grpc-batch$BATCH" $SP grpc 127.0.0.1:$((PORT+1)) --batch $BATCH
fi
curl -s http://127.0.0.1:$PORT/metrics >"$out/metrics.txt"
python3 - "$out/metrics.txt" <<'PY'
import re, sys
fams = {}
for line in open(sys.argv[1]):
    m = re.match(r'(sluice_(?:check|store_call)_duration_seconds)_bucket\{(.*)\} (\S+)', line)
    if m:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        le = labels.pop("le")
        key = m.group(1) + " " + ",".join("%s=%s" % kv for kv in sorted(labels.items()))
        fams.setdefault(key, []).append((float("inf") if le == "+Inf" else float(le), float(m.group(3))))
for key, b in sorted(fams.items()):
    b.sort(); n = b[-1][1]
    if n == 0:
        continue
    q = lambda p: next(le for le, c in b if c >= p * n)
    print("%-58s count %8d  p50 <= %g us  p99 <= %g us  p999 <= %g us" % (key, n, q(.5) * 1e6, q(.99) * 1e6, q(.999) * 1e6))
PY
# Decisions by source over all the runs: anything but "store" was not
# decided by the store (fail_open past the deadline, for instance).
awk -F'[{}]' '/^sluice_decisions_total/ { match($2, /source="[^"]*"/); src = substr($2, RSTART+8, RLENGTH-9); split($3, v, " "); n[src] += v[1] }
  END { printf "decisions by source:"; for (s in n) printf " %s %d", s, n[s]; print "" }' "$out/metrics.txt"
grep -E '^process_resident_memory_bytes' "$out/metrics.txt" || true
