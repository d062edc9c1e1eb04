#!/usr/bin/env bash
# Runs the control plane's throughput comparison of docs/PERFORMANCE.md:
# the same RULES rules (one per resource, /api/v1/orders/0, /1, ...) served
# by two instances on the memory store, one from a configuration file and
# one from etcd through the control plane, each loaded by `sluice-load` in
# turn, ROUNDS times, with the same flags. It builds sluice and the etcd
# server of the tests (internal/tools/etcd), starts etcd on free loopback
# ports, writes the rules into etcd through the second instance's admin
# API, checks that both instances answer every resource with its own rule,
# then prints one line per run (checks/s, server CPU per check) and the
# medians' ratio etcd/file.
#
#   scripts/control-plane-runs.sh
#   ROUNDS=5 DURATION=20s TARGET=grpc scripts/control-plane-runs.sh
#
# Environment: RULES (10000), KEYS (client ids, 100000: key k checks the
# rule of resource k mod RULES), ROUNDS (3), DURATION (10s), CONCURRENCY
# (64), TARGET (http or grpc, default http), SERVER_PROCS (GOMAXPROCS of
# both servers; empty: Go's default), PROFILE (a directory: each run also
# writes the server's CPU profile there, NAME-ROUND.pprof, taken over the
# run's duration less a second, and after the runs each server's heap
# profile, NAME.heap). The admin API allows each token 100
# writes a minute, so the rules are written with one token per 100 rules.
set -euo pipefail
if [ $# -gt 0 ]; then
  case $1 in
    -h|--help)
      while IFS= read -r line; do
        case $line in
          '#!'*) ;;
          '#'*) line=${line#\#}; echo "${line# }";;
          *) break;;
        esac
      done <"$0"
      exit 0;;
    *) echo "usage: $0 [--help]; settings are environment variables (see --help)" >&2; exit 2;;
  esac
fi
cd "$(dirname "$0")/.."
RULES=${RULES:-10000}
KEYS=${KEYS:-100000}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
CONCURRENCY=${CONCURRENCY:-64}
TARGET=${TARGET:-http}
SERVER_PROCS=${SERVER_PROCS:-}
PROFILE=${PROFILE:-}
case $TARGET in http|grpc) ;; *) echo "TARGET must be http or grpc" >&2; exit 2;; esac
mkdir -p bin
go build -o bin/sluice ./cmd/sluice
(cd bench && go build -o ../bin/sluice-load ./cmd/sluice-load)
(cd internal/tools/etcd && GOWORK=off go build -o ../../../bin/etcd-test .)
out=$(mktemp -d)
EP=""; FP=""; CP=""
trap 'kill $FP $CP $EP 2>/dev/null; wait $FP $CP $EP 2>/dev/null; rm -rf "$out"' EXIT

# Eight free loopback ports: etcd's client and peer, then HTTP, gRPC and
# debug (pprof) of each instance.
read -r ETCD PEER FHTTP FGRPC CHTTP CGRPC FDEBUG CDEBUG < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(8)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in ss))')

# The rules, the same for the file and for etcd: a mix of algorithms, one
# limit per client and resource, never reached by the runs.
python3 - "$out" "$RULES" <<'PY'
import hashlib, json, secrets, sys
out, n = sys.argv[1], int(sys.argv[2])
algs = ["fixed_window", "sliding_window_counter", "token_bucket", "gcra"]
rules = [{"id": "r%d" % i, "match": {"resource": "/api/v1/orders/%d" % i}, "dimension": "client",
          "algorithm": algs[i % len(algs)], "limit": 1000 + i % 100, "window": "1m"} for i in range(n)]
with open(out + "/rules.yaml", "w") as f:
    f.write("version: 1\nrules:\n")
    for r in rules:
        f.write("  - %s\n" % json.dumps(r))
with open(out + "/empty.yaml", "w") as f:
    f.write("version: 1\nrules: []\n")
with open(out + "/rules.jsonl", "w") as f:
    for r in rules:
        f.write(json.dumps(r) + "\n")
with open(out + "/tokens.yaml", "w") as y, open(out + "/tokens.txt", "w") as t:
    for i in range((n + 99) // 100):
        tok = "slc_" + secrets.token_urlsafe(32)
        t.write(tok + "\n")
        y.write("- {name: bench%d, role: admin, sha256: %s}\n" % (i, hashlib.sha256(tok.encode()).hexdigest()))
PY

bin/etcd-test -client http://127.0.0.1:$ETCD -peer http://127.0.0.1:$PEER -data-dir "$out/etcd" >"$out/etcd.log" 2>&1 &
EP=$!
for _ in $(seq 300); do grep -qx ready "$out/etcd.log" && break; sleep 0.1; done
grep -qx ready "$out/etcd.log" || { cat "$out/etcd.log"; exit 1; }
procs=(); [ -n "$SERVER_PROCS" ] && procs=(GOMAXPROCS="$SERVER_PROCS")
fdebug=(); cdebug=()
if [ -n "$PROFILE" ]; then
  mkdir -p "$PROFILE"
  fdebug=(--debug-addr 127.0.0.1:$FDEBUG); cdebug=(--debug-addr 127.0.0.1:$CDEBUG)
fi
env "${procs[@]}" bin/sluice serve --config "$out/rules.yaml" --log-level warn "${fdebug[@]}" \
  --http-addr 127.0.0.1:$FHTTP --grpc-addr 127.0.0.1:$FGRPC 2>"$out/file.log" &
FP=$!
env "${procs[@]}" bin/sluice serve --config "$out/empty.yaml" --log-level warn "${cdebug[@]}" \
  --config-store etcd://127.0.0.1:$ETCD/sluice-bench --data-dir "$out/data" --admin-tokens "$out/tokens.yaml" \
  --http-addr 127.0.0.1:$CHTTP --grpc-addr 127.0.0.1:$CGRPC 2>"$out/etcd-instance.log" &
CP=$!
for p in $FHTTP $CHTTP; do
  for _ in $(seq 300); do (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null && break; sleep 0.1; done
done
kill -0 $FP $CP || { cat "$out"/*.log; exit 1; }

# Write the rules through the admin API (four writers, retrying what the
# API asks to retry), then wait until both instances answer each resource
# with its rule.
python3 - "$out" 127.0.0.1:$CHTTP 127.0.0.1:$FHTTP "$RULES" <<'PY'
import http.client, json, sys, threading, time
out, admin, filehttp, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rules = open(out + "/rules.jsonl").read().splitlines()
tokens = open(out + "/tokens.txt").read().split()
failed = []
def write(w, workers):
    c = http.client.HTTPConnection(*admin.split(":"), timeout=60)
    for i in range(w, n, workers):
        for attempt in range(20):
            c.request("POST", "/api/v1/rules", rules[i], {"Authorization": "Bearer " + tokens[i // 100], "Content-Type": "application/json"})
            r = c.getresponse(); body = r.read()
            if r.status == 201:
                break
            if r.status not in (429, 503) or attempt == 19:
                failed.append("rule %d: HTTP %d %s" % (i, r.status, body[:200])); return
            time.sleep(min(0.1 * 2 ** attempt, 5))
t0 = time.time()
ws = [threading.Thread(target=write, args=(w, 4)) for w in range(4)]
[w.start() for w in ws]; [w.join() for w in ws]
if failed:
    sys.exit("writing the rules: " + failed[0])
print("wrote %d rules through the admin API in %.0f s" % (n, time.time() - t0), flush=True)
def wrong(addr):  # resources not answered by their own rule alone
    c = http.client.HTTPConnection(*addr.split(":"), timeout=60)
    bad = 0
    for lo in range(0, n, 1000):
        checks = [{"resource": "/api/v1/orders/%d" % i, "cost": 0} for i in range(lo, min(lo + 1000, n))]
        c.request("POST", "/api/v1/batch-check", json.dumps({"client_id": "probe", "mode": "best_effort", "checks": checks}),
                  {"Content-Type": "application/json"})
        r = c.getresponse(); body = json.loads(r.read())
        if "results" not in body:
            sys.exit("batch check on %s: %s" % (addr, body))
        res = body["results"]
        bad += sum(1 for i, x in enumerate(res, lo) if [y["rule"] for y in x.get("rules", [])] != ["r%d" % i])
    return bad
if wrong(filehttp):
    sys.exit("the file instance does not serve the rules")
t0 = time.time()
while (bad := wrong(admin)) and time.time() - t0 < 300:
    time.sleep(1)
if bad:
    sys.exit("the etcd instance still lacks %d rules after 300 s" % bad)
print("both instances answer each of the %d resources with its rule" % n, flush=True)
PY

cpu() { awk '{print $14+$15}' /proc/$1/stat; } # clock ticks
tck=$(getconf CLK_TCK)
run() { # name pid http-port grpc-port debug-port round
  local name=$1 pid=$2 addr=127.0.0.1:$3
  [ "$TARGET" = grpc ] && addr=127.0.0.1:$4
  local prof=""
  if [ -n "$PROFILE" ]; then
    local secs; secs=$(python3 -c 'import re, sys; m = re.fullmatch(r"(\d+)s", sys.argv[1]); print(max(int(m.group(1)) - 1, 1) if m else 5)' "$DURATION")
    python3 -c 'import sys, urllib.request; open(sys.argv[2], "wb").write(urllib.request.urlopen(sys.argv[1], timeout=120).read())' \
      "http://127.0.0.1:$5/debug/pprof/profile?seconds=$secs" "$PROFILE/$name-$6.pprof" &
    prof=$!
  fi
  local c0; c0=$(cpu "$pid")
  bin/sluice-load --target "$TARGET" --addr "$addr" --duration "$DURATION" --concurrency "$CONCURRENCY" \
    --keys "$KEYS" --resource /api/v1/orders --resources "$RULES" --json >"$out/run.json" || true
  local c1; c1=$(cpu "$pid")
  [ -n "$prof" ] && wait "$prof"
  python3 - "$out/run.json" "$name" $((c1 - c0)) "$tck" <<'PY' | tee -a "$out/runs.txt"
import json, sys
r = json.load(open(sys.argv[1]))
cpu_us = int(sys.argv[3]) * 1e6 / int(sys.argv[4]) / max(r["checks"], 1)
print("%-5s %8.0f checks/s  server cpu %5.1f us/check  p50 %5.2f  p99 %5.2f ms  allowed %d denied %d errors %d"
      % (sys.argv[2], r["check_throughput"], cpu_us, r["latency_ms"]["p50"], r["latency_ms"]["p99"],
         r["allowed"], r["denied"], r["errors"]))
PY
}
echo "$RULES rules, $TARGET, $CONCURRENCY callers, $KEYS keys, $DURATION per run, servers' GOMAXPROCS ${SERVER_PROCS:-default}; $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$ROUNDS"); do
  # Alternate which goes first, so that a drift of the machine falls on both.
  if [ $((round % 2)) = 1 ]; then
    run file $FP $FHTTP $FGRPC $FDEBUG "$round"; run etcd $CP $CHTTP $CGRPC $CDEBUG "$round"
  else
    run etcd $CP $CHTTP $CGRPC $CDEBUG "$round"; run file $FP $FHTTP $FGRPC $FDEBUG "$round"
  fi
done
if [ -n "$PROFILE" ]; then
  for nd in file:$FDEBUG etcd:$CDEBUG; do
    python3 -c 'import sys, urllib.request; open(sys.argv[2], "wb").write(urllib.request.urlopen(sys.argv[1], timeout=60).read())' \
      "http://127.0.0.1:${nd#*:}/debug/pprof/heap?gc=1" "$PROFILE/${nd%%:*}.heap"
  done
fi
python3 - "$out/runs.txt" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    f = line.split()
    runs.setdefault(f[0], []).append((float(f[1]), float(f[5])))
med = {k: (statistics.median(x for x, _ in v), statistics.median(c for _, c in v)) for k, v in runs.items()}
print("median: file %.0f checks/s %.1f us/check, etcd %.0f checks/s %.1f us/check; etcd/file: throughput %.3f, cpu per check %.3f"
      % (med["file"][0], med["file"][1], med["etcd"][0], med["etcd"][1],
         med["etcd"][0] / med["file"][0], med["etcd"][1] / med["file"][1]))
PY
echo "load average $(cut -d' ' -f1-3 /proc/loadavg)"
