#!/usr/bin/env bash
# Cross-node overhead of two builds, interleaved in one run (issue 4): on a shared machine
# only a comparison within the same minutes means anything. Each round sends the same open-loop
# load straight to an instant engine (the baseline), then through build A's pair of sidecars
# and build B's pair (entry → QUIC → serving sidecar → the same engine), alternating which goes
# first, and prints each path's latency and each sidecar's CPU per request. Passing the same
# directory twice measures the noise.
#
# Usage: scripts/bench-overhead-ab.sh --a DIR --b DIR [--rounds 4] [--requests 3000]
#                                     [--rate 500] [--long]
#   DIR holds `kvmesh` and `kvmesh-sim` (e.g. a copy of target/release of each build).
#   --long: streamed 2048+128-token prompts at 50 req/s (TTFT) instead of 16+16-token ones.
set -euo pipefail
A=; B=; ROUNDS=4; REQUESTS=3000; RATE=500; LONG=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --a) A=$2; shift 2 ;;
        --b) B=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --requests) REQUESTS=$2; shift 2 ;;
        --rate) RATE=$2; shift 2 ;;
        --long) LONG=1; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
[[ -n $A && -n $B ]] || { echo "usage: $0 --a DIR --b DIR [options]" >&2; exit 2; }
WORK=$(mktemp -d)
# shellcheck source=lib/loopback.sh
source "$(dirname "$0")/lib/loopback.sh"

# Engine A serves another model, so every request entering at an `a` sidecar crosses the mesh.
start_engine "$A" engine-a other-model
ENGINE_A=$ENGINE_URL
start_engine "$A" engine-b mock-model
ENGINE_B=$ENGINE_URL
# Two meshes (two CAs), one per build, in front of the same two engines.
for build in a b; do
    dir=$A; [[ $build == b ]] && dir=$B
    "$dir/kvmesh" cert init --dir "$WORK/tls-$build" >/dev/null
    start_sidecar "$dir" "$WORK/tls-$build" "entry-$build" "$ENGINE_A"
    start_sidecar "$dir" "$WORK/tls-$build" "serving-$build" "$ENGINE_B" "$(mesh_of "entry-$build")"
    for _ in $(seq 200); do
        curl -s "$(http_of "entry-$build")/v1/models" | grep -q mock-model && break
        sleep 0.05
    done
done
if [[ $LONG == 1 ]]; then
    SHAPE=(--gsp-groups 4 --gsp-system-len 2048 --gsp-question-len 128 --stream); METRIC=TTFT
    [[ $RATE == 500 ]] && RATE=50
else
    SHAPE=(--gsp-groups 64 --gsp-system-len 16 --gsp-question-len 16); METRIC=E2E
fi
load() { # LABEL TARGET
    "$A/kvmesh-sim" load --targets "$2" --engines "$ENGINE_B" --model mock-model --workload gsp \
        --gsp-prompts-per-group 1000 --gsp-output-len 16 "${SHAPE[@]}" --rate "$RATE" \
        --requests "$REQUESTS" --no-scrape >"$WORK/load.log" 2>&1
    printf '%-10s %s\n' "$1" "$(grep -E "^$METRIC" "$WORK/load.log")"
}
echo "date: $(date -u +%FT%TZ)  machine: $(nproc) cores; A=$A B=$B"
echo "$REQUESTS requests per path and round at $RATE req/s; $METRIC latency in ms:"
echo "                     $(printf '%10s %10s %10s %10s %10s' mean p50 p90 p99 max)"
for round in $(seq "$ROUNDS"); do
    echo "round $round"
    load direct "$ENGINE_B"
    order="a b"; [[ $((round % 2)) == 0 ]] && order="b a"
    for build in $order; do
        entry_before=$(cpu_ticks "entry-$build"); serving_before=$(cpu_ticks "serving-$build")
        load "build-$build" "$(http_of "entry-$build")"
        echo "           CPU per request: entry $(cpu_per_request "entry-$build" "$entry_before" "$REQUESTS"), serving $(cpu_per_request "serving-$build" "$serving_before" "$REQUESTS")"
    done
done
