#!/usr/bin/env bash
# Measures the Redis CPU per check of docs/PERFORMANCE.md ("Redis CPU per
# check"): for each algorithm, `sluice serve` on a redis-server of its own
# serves one Envoy limit of that algorithm (1,000 per minute per client),
# `sluice-load` (built here) sends Envoy checks to it, and the Redis server's CPU time
# (INFO cpu, used_cpu_user + used_cpu_sys) before and after the run is
# divided by the checks answered. With several binaries, each algorithm is
# run with each binary in turn, against the same redis-server, ROUNDS
# times, so that two versions are compared in one run:
#
#   scripts/redis-cpu-runs.sh                          # bin/sluice, built here
#   BINS="/path/old-sluice bin/sluice" scripts/redis-cpu-runs.sh
#
# Environment: BINS (default: bin/sluice, built from this tree), ALGS
# (default: all six), DURATION (10s), CONCURRENCY (64), KEYS (10000),
# RATE (checks per second in all, open loop; default: as fast as the
# callers go, closed loop), ROUNDS (1), PORT (base port, default 18280: sluice on PORT and PORT+1,
# Redis on PORT+20). Loopback only. The word ratelimit in BINS stands for
# envoyproxy/ratelimit, the binary RATELIMIT_BIN (built by you from its
# repository), run for the fixed window only, its own at the same limit. Prints one line per run: the binary,
# the algorithm, checks/s, Redis CPU µs per check and the share of it in
# the kernel (network), script calls per check, Redis commands per check
# (the script calls and the commands they make: GET, the write, TIME; or
# a plain HINCRBY), reads of a connection per check (INFO stats
# total_reads_processed), and the callers' p50 and p99 latency. With FLOOR=1, each fixed-window run is followed
# by bench/cmd/redisfloor on the same Redis at the rate and pipeline depth
# (checks per read) the run reached: the Redis CPU of the one command a
# fixed-window check needs, bare, at that load, and the run's ratio to it.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
CONCURRENCY=${CONCURRENCY:-64}
KEYS=${KEYS:-10000}
ROUNDS=${ROUNDS:-1}
PORT=${PORT:-18280}
ALGS=${ALGS:-fixed_window token_bucket leaky_bucket gcra sliding_window_counter sliding_window_log}
mkdir -p bin
(cd bench && go build -o ../bin/sluice-load ./cmd/sluice-load && go build -o ../bin/redisfloor ./cmd/redisfloor)
case " ${BINS:-} " in *" ratelimit "*) [ -x "${RATELIMIT_BIN:-}" ] || { echo "BINS names ratelimit: set RATELIMIT_BIN to its binary" >&2; exit 2; };; esac
if [ -z "${BINS:-}" ]; then
  go build -o bin/sluice ./cmd/sluice
  BINS=bin/sluice
fi
RPORT=$((PORT+20))
out=$(mktemp -d)
redis-server --port $RPORT --bind 127.0.0.1 --save '' --appendonly no >"$out/redis.log" 2>&1 &
RP=$!
SP=""
trap 'kill $SP $RP 2>/dev/null; wait $SP $RP 2>/dev/null; rm -rf "$out"' EXIT
for _ in $(seq 50); do redis-cli -p $RPORT ping >/dev/null 2>&1 && break; sleep 0.1; done
# stats prints Redis' user and system CPU seconds, its script calls, its
# commands (scripts' and their own, INFO and CONFIG left out) and its reads
# of client connections.
stats() {
  { redis-cli -p $RPORT info cpu; redis-cli -p $RPORT info commandstats; redis-cli -p $RPORT info stats; } | tr -d '\r' |
    awk -F'[:=,]' '/^used_cpu_user:/ {u = $2} /^used_cpu_sys:/ {s = $2}
      /^cmdstat_(evalsha|eval|fcall):/ {k += $3}
      /^cmdstat_/ && !/^cmdstat_(info|config)/ {c += $3}
      /^total_reads_processed:/ {r = $2}
      END {printf "%.6f %.6f %d %d %d", u, s, k, c, r}'
}
echo "Redis $(redis-server --version | awk '{print $3}'), $CONCURRENCY callers${RATE:+ at $RATE checks/s}, $KEYS keys, $DURATION per run; $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$ROUNDS"); do
  for alg in $ALGS; do
    for bin in $BINS; do
      printf 'version: 1\nenvoy:\n  - domain: load\n    descriptors:\n      - key: client_id\n        rate_limit: { unit: minute, requests_per_unit: 1000, algorithm: %s }\n' \
        "$alg" >"$out/policy.yaml"
      redis-cli -p $RPORT flushall >/dev/null
      if [ "$bin" = ratelimit ]; then
        # Its fixed window of the same limit, its stats off, the rest at its defaults.
        [ "$alg" = fixed_window ] || continue
        mkdir -p "$out/rt/rl/config"
        printf 'domain: load\ndescriptors:\n  - key: client_id\n    rate_limit: { unit: minute, requests_per_unit: 1000 }\n' \
          >"$out/rt/rl/config/load.yaml"
        env DISABLE_STATS=true USE_STATSD=false LOG_LEVEL=warn RUNTIME_ROOT="$out/rt" RUNTIME_SUBDIRECTORY=rl \
          RUNTIME_WATCH_ROOT=false REDIS_SOCKET_TYPE=tcp REDIS_URL=127.0.0.1:$RPORT HOST=127.0.0.1 PORT=$PORT \
          GRPC_HOST=127.0.0.1 GRPC_PORT=$((PORT+1)) DEBUG_HOST=127.0.0.1 DEBUG_PORT=$((PORT+2)) \
          "$RATELIMIT_BIN" >"$out/serve.log" 2>&1 &
      else
        "$bin" serve --config "$out/policy.yaml" --store redis://127.0.0.1:$RPORT --log-level warn \
          --http-addr 127.0.0.1:$PORT --grpc-addr 127.0.0.1:$((PORT+1)) 2>"$out/serve.log" &
      fi
      SP=$!
      for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$((PORT+1))) 2>/dev/null && break; sleep 0.1; done
      s0=$(stats)
      bin/sluice-load --target envoy --addr 127.0.0.1:$((PORT+1)) --duration "$DURATION" --concurrency "$CONCURRENCY" \
        --keys "$KEYS" --domain load ${RATE:+--rate "$RATE"} --json >"$out/load.json" || true
      s1=$(stats)
      kill $SP; wait $SP 2>/dev/null || true; SP=""
      python3 - "$out/load.json" "$bin" "$alg" "$s0" "$s1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
checks = max(r["checks"], 1)
user, sys_, calls, cmds, reads = (float(b) - float(a) for a, b in zip(sys.argv[4].split(), sys.argv[5].split()))
cpu = (user + sys_) * 1e6 / checks
lat = r.get("latency_ms") or {}
print("%-28s %-24s %8.0f checks/s  redis cpu %5.2f us/check (%2.0f%% sys)  %.3f script calls/check  %.2f commands/check  %.3f reads/check  p50 %.2f ms p99 %.2f ms  allowed %d denied %d errors %d"
      % (sys.argv[2][-28:], sys.argv[3], r["check_throughput"], cpu, 100 * sys_ / max(user + sys_, 1e-9), calls / checks,
         cmds / checks, reads / checks, lat.get("p50", 0), lat.get("p99", 0), r["allowed"], r["denied"], r["errors"]))
open(sys.argv[1] + ".floor", "w").write("%.0f %d %.4f\n" % (r["check_throughput"], max(1, round(checks / max(reads, 1))), cpu))
PY
      if [ "${FLOOR:-0}" = 1 ] && [ "$alg" = fixed_window ]; then
        read -r rate per cpu <"$out/load.json.floor"
        redis-cli -p $RPORT flushall >/dev/null
        f=$(bin/redisfloor --addr 127.0.0.1:$RPORT --rate "$rate" --per "$per" --callers 1 --duration "$DURATION")
        python3 -c "import re, sys; f = float(re.search(r'redis cpu ([0-9.]+)', sys.argv[1]).group(1)); print('%-28s %-24s %s; the run: %.2fx' % ('redisfloor', 'HINCRBY alone', sys.argv[1], float(sys.argv[2]) / f))" "$f" "$cpu"
      fi
    done
  done
done
