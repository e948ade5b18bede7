#!/usr/bin/env bash
# Router overhead with instant engines (issue 4): the same small non-streamed requests
#   1. straight to engine B (the baseline),
#   2. into sidecar A, forwarded over QUIC to sidecar B and its engine, and into sidecar B
#      straight to its own engine (one proxy hop, like a central router),
#   3. through vllm-router (round_robin, one worker: engine B), when --with-vllm-router
#      installs it in a throwaway virtualenv or it is on PATH,
# at a fixed open-loop rate; then the most one sidecar can serve (closed loop, local engine),
# and the sidecars' resident memory. Figures go to BENCHMARKS.md by hand.
#
# Usage: scripts/bench-overhead.sh [--bin-dir DIR] [--rate 500] [--requests 15000] [--with-vllm-router]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=; RATE=500; REQUESTS=15000; WITH_ROUTER=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --bin-dir) BIN=$2; shift 2 ;;
        --rate) RATE=$2; shift 2 ;;
        --requests) REQUESTS=$2; shift 2 ;;
        --with-vllm-router) WITH_ROUTER=1; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
if [[ -z $BIN ]]; then
    (cd "$ROOT" && cargo build --release -p kvmesh-node -p kvmesh-sim --bins)
    BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"
fi
WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

wait_line() { # FILE PATTERN
    for _ in $(seq 400); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
    echo "timed out waiting for '$2' in $1" >&2; cat "$1" >&2; exit 1
}
engine() { # NAME MODEL: starts an engine; sets ENGINE_URL (not a subshell, so PIDS keeps it)
    "$BIN/kvmesh-sim" engine --port 0 --model "$2" --instant >"$WORK/$1.out" 2>&1 &
    PIDS+=($!)
    wait_line "$WORK/$1.out" listening
    ENGINE_URL=$(grep -o 'http://[0-9.:]*' "$WORK/$1.out")
}
sidecar() { # NAME BACKEND [SEEDS]
    "$BIN/kvmesh" cert issue --dir "$WORK/tls" --node "$1" >/dev/null
    "$BIN/kvmesh" serve --backend "$2" --listen 127.0.0.1:0 --mesh 127.0.0.1:0 --node-id "$1" \
        --tls-dir "$WORK/tls" ${3:+--seeds "$3"} >"$WORK/$1.out" 2>"$WORK/$1.err" &
    PIDS+=($!)
    wait_line "$WORK/$1.out" listening
}
http_of() { grep -o 'http://[0-9.:]*' "$WORK/$1.out"; }
mesh_of() { grep -o ' mesh [0-9][0-9.:]*' "$WORK/$1.out" | cut -d' ' -f3; }
load() { # LABEL TARGET ENGINE MODEL ARGS...
    local label=$1 target=$2 eng=$3 model=$4
    shift 4
    "$BIN/kvmesh-sim" load --targets "$target" --engines "$eng" --model "$model" \
        --workload gsp --gsp-groups 64 --gsp-prompts-per-group 1000 --gsp-system-len 16 \
        --gsp-question-len 16 --gsp-output-len 16 --json "$WORK/$label.json" "$@" >"$WORK/$label.log" 2>&1
    printf '%-22s %s\n' "$label" "$(grep -E '^E2E' "$WORK/$label.log")"
}

"$BIN/kvmesh" cert init --dir "$WORK/tls" >/dev/null
# Engine A serves another model, so every request entering at A goes to B over the mesh.
engine engine-a other-model
A_ENGINE=$ENGINE_URL
engine engine-b mock-model
B_ENGINE=$ENGINE_URL
sidecar a "$A_ENGINE"
sidecar b "$B_ENGINE" "$(mesh_of a)"
for _ in $(seq 200); do
    curl -s "$(http_of a)/v1/models" | grep -q mock-model && break
    sleep 0.05
done
echo "date: $(date -u +%FT%TZ)  machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "open loop at $RATE req/s, $REQUESTS requests of 16+16 tokens, non-streamed; E2E latency in ms:"
echo "                       $(printf '%10s %10s %10s %10s %10s' mean p50 p90 p99 max)"
COMMON=(--rate "$RATE" --requests "$REQUESTS" --no-scrape)
load direct-to-engine "$B_ENGINE" "$B_ENGINE" mock-model "${COMMON[@]}"
load kvmesh-a-to-b "$(http_of a)" "$B_ENGINE" mock-model "${COMMON[@]}"
load kvmesh-b-local "$(http_of b)" "$B_ENGINE" mock-model "${COMMON[@]}"
if [[ $WITH_ROUTER == 1 ]] || command -v vllm-router >/dev/null; then
    ROUTER=$(command -v vllm-router || true)
    if [[ -z $ROUTER ]]; then
        python3 -m venv "$WORK/venv" && "$WORK/venv/bin/pip" install --quiet vllm-router && ROUTER="$WORK/venv/bin/vllm-router"
    fi
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    MPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$ROUTER" --host 127.0.0.1 --port "$PORT" --policy round_robin --prometheus-port "$MPORT" \
        --worker-urls "$B_ENGINE" >"$WORK/router.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 200); do curl -s "http://127.0.0.1:$PORT/v1/models" | grep -q mock-model && break; sleep 0.1; done
    load vllm-router "http://127.0.0.1:$PORT" "$B_ENGINE" mock-model "${COMMON[@]}"
fi
echo "closed loop, concurrency 128, through sidecar b to its local engine:"
load kvmesh-max-throughput "$(http_of b)" "$B_ENGINE" mock-model --concurrency 128 --requests 50000 --no-scrape
grep -E 'requests:' "$WORK/kvmesh-max-throughput.log"
for n in a b; do
    pid=$(pgrep -f "node-id $n --tls-dir $WORK/tls" | head -n1)
    echo "sidecar $n RSS: $(awk '/VmRSS/ {print $2, $3}' "/proc/$pid/status")"
done
