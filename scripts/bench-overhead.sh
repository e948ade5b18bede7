#!/usr/bin/env bash
# Router overhead with instant engines (issue 4): the same small non-streamed requests
#   1. straight to engine B (the baseline),
#   2. into sidecar A, forwarded over QUIC to sidecar B and its engine, and into sidecar B
#      straight to its own engine (one proxy hop, like a central router),
#   3. through vllm-router (round_robin, one worker: engine B), when --with-vllm-router
#      installs it in a throwaway virtualenv or it is on PATH,
# at a fixed open-loop rate; then the most one sidecar can serve (closed loop, local engine),
# with the default single thread and with --worker-threads 2, and the sidecars' resident
# memory; then, with --peers N (default 16), N-1 more sidecars with their own engines join,
# traffic goes through every sidecar, and the resident memory of sidecars with N peers is read.
# Figures go to BENCHMARKS.md by hand.
#
# Usage: scripts/bench-overhead.sh [--bin-dir DIR] [--rate 500] [--requests 15000]
#                                  [--with-vllm-router] [--peers 16]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=; RATE=500; REQUESTS=15000; WITH_ROUTER=0; PEERS=16
while [[ $# -gt 0 ]]; do
    case $1 in
        --bin-dir) BIN=$2; shift 2 ;;
        --rate) RATE=$2; shift 2 ;;
        --requests) REQUESTS=$2; shift 2 ;;
        --with-vllm-router) WITH_ROUTER=1; shift ;;
        --peers) PEERS=$2; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
if [[ -z $BIN ]]; then
    (cd "$ROOT" && cargo build --release -p kvmesh-node -p kvmesh-sim --bins)
    BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"
fi
WORK=$(mktemp -d)
# shellcheck source=lib/loopback.sh
source "$ROOT/scripts/lib/loopback.sh"
engine() { start_engine "$BIN" "$@"; } # NAME MODEL
sidecar() { start_sidecar "$BIN" "$WORK/tls" "$@"; } # NAME BACKEND [SEEDS [EXTRA FLAGS...]]
memory() { # NAME: resident and peak resident memory of a sidecar
    awk '/VmRSS/ {rss=$2} /VmHWM/ {hwm=$2} END {printf "RSS %.1f MB, peak %.1f MB\n", rss/1024, hwm/1024}' \
        "/proc/${SIDECAR_PID[$1]}/status"
}
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
A0=$(cpu_ticks a); B0=$(cpu_ticks b)
load kvmesh-a-to-b "$(http_of a)" "$B_ENGINE" mock-model "${COMMON[@]}"
echo "    CPU per request: sidecar a $(cpu_per_request a "$A0" "$REQUESTS"), sidecar b $(cpu_per_request b "$B0" "$REQUESTS")"
B0=$(cpu_ticks b)
load kvmesh-b-local "$(http_of b)" "$B_ENGINE" mock-model "${COMMON[@]}"
echo "    CPU per request: sidecar b $(cpu_per_request b "$B0" "$REQUESTS")"
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
# The same with two worker threads: a sidecar alone (no seeds) in front of its own engine.
engine engine-c mock-model
C_ENGINE=$ENGINE_URL
sidecar c "$C_ENGINE" "" --worker-threads 2
echo "closed loop, concurrency 128, through sidecar c (--worker-threads 2) to its local engine:"
load kvmesh-max-throughput-2-threads "$(http_of c)" "$C_ENGINE" mock-model --concurrency 128 --requests 50000 --no-scrape
grep -E 'requests:' "$WORK/kvmesh-max-throughput-2-threads.log"
echo "sidecar a (1 peer, forwarding only): $(memory a)"
echo "sidecar b (1 peer, served everything above): $(memory b)"
echo "sidecar c (alone, 2 threads, served the 2-thread run): $(memory c)"

if [[ $PEERS -gt 1 ]]; then
    # N-1 more sidecars, each with its own instant engine, join through a: a and b then have N
    # peers each (c stays alone).
    for i in $(seq 2 "$PEERS"); do
        engine "engine-p$i" mock-model
        sidecar "p$i" "$ENGINE_URL" "$(mesh_of a)"
    done
    ENTRIES=$(http_of a)
    for i in $(seq 2 "$PEERS"); do ENTRIES+=",$(http_of "p$i")"; done
    ENTRIES+=",$(http_of b)"
    joined=0
    for _ in $(seq 600); do
        joined=$(curl -s "$(http_of b)/debug/cluster" | grep -o '"node":' | wc -l)
        [[ $joined -ge $((PEERS + 1)) ]] && break # b itself and its N peers
        sleep 0.1
    done
    echo "$PEERS peers: sidecar b sees $((joined - 1)) peers; gsp traffic (256+64 prompt, 16 output tokens) through all $((PEERS + 1)) sidecars:"
    "$BIN/kvmesh-sim" load --targets "$ENTRIES" --pick round-robin --model mock-model --workload gsp \
        --gsp-groups 128 --gsp-prompts-per-group 1000 --gsp-system-len 256 --gsp-question-len 64 \
        --gsp-output-len 16 --rate 500 --requests 10000 --no-scrape >"$WORK/peers.log" 2>&1
    grep -E '^E2E|requests:' "$WORK/peers.log"
    sleep 2 # summaries of what was just served reach every node
    echo "sidecar a ($PEERS peers): $(memory a)"
    echo "sidecar b ($PEERS peers): $(memory b)"
    worst=$(for n in a b $(seq -f 'p%g' 2 "$PEERS"); do awk '/VmHWM/ {print $2}' "/proc/${SIDECAR_PID[$n]}/status"; done | sort -n | tail -n1)
    echo "largest peak RSS of the $((PEERS + 1)) sidecars: $(awk -v k="$worst" 'BEGIN {printf "%.1f MB", k/1024}')"
fi
