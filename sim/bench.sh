#!/usr/bin/env bash
# Throughput of the mock engine (--instant, one core) and of the load generator.
#
#   sim/bench.sh            # build release, run every measurement, print the figures
#   REQUESTS=20000 sim/bench.sh
#
# The engine is pinned to core 0 and the load generator to core 1 (taskset), so each figure
# is "one core". The load generator's own cost is reported as CPU seconds per request
# (/usr/bin/time), which bounds the rate it can drive on one core independently of the
# engine it is pointed at.
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS=${REQUESTS:-100000}
RATE=${RATE:-5000}
BIN=target/release/kvmesh-sim
cargo build --release -p kvmesh-sim >&2
OUT=$(mktemp -d)
ENGINE_PID=
cleanup() { [ -n "$ENGINE_PID" ] && kill "$ENGINE_PID" 2>/dev/null || true; rm -rf "$OUT"; }
trap cleanup EXIT

taskset -c 0 "$BIN" engine --port 0 --instant >"$OUT/engine.out" &
ENGINE_PID=$!
for _ in $(seq 100); do grep -q listening "$OUT/engine.out" 2>/dev/null && break; sleep 0.05; done
URL=$(sed -n 's/.*listening on //p' "$OUT/engine.out")
SMALL=(--workload gsp --gsp-system-len 8 --gsp-question-len 8 --gsp-output-len 16)

run() { # name, args...
  local name=$1; shift
  echo "== $name"
  /usr/bin/time -f "load generator CPU: %U s user + %S s sys, wall %e s" \
    taskset -c 1 "$BIN" load --targets "$URL" "${SMALL[@]}" "$@" --json "$OUT/$name.json" 2>&1 \
    | grep -E "requests:|TTFT|E2E|CPU"
}

run closed-64 --concurrency 64 --requests "$REQUESTS"
run open-"$RATE" --rate "$RATE" --requests $((RATE * 10))
run open-"$RATE"-stream --rate "$RATE" --requests $((RATE * 5)) --stream
echo "== engine process CPU after all runs: $(ps -o time= -p "$ENGINE_PID")"
