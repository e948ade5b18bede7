#!/usr/bin/env bash
# What carrying an image costs (issue 17): the same non-streamed chat request with a 256 KiB
# PNG, sent
#   1. straight to engine B (the baseline),
#   2. into sidecar A, forwarded over QUIC to sidecar B and its engine (two hops: entry, peer),
#   3. into sidecar B, straight to its own engine (one hop),
# interleaved one after another, N times each, with instant engines; and the same three for
# the request without its image. Prints the median and p90 of curl's total time per path and
# the medians' differences against the baseline. Figures go to BENCHMARKS.md by hand.
#
# Usage: scripts/bench-media-overhead.sh [--bin-dir DIR] [--requests 400] [--image-kib 256]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=; REQUESTS=400; IMAGE_KIB=256
while [[ $# -gt 0 ]]; do
    case $1 in
        --bin-dir) BIN=$2; shift 2 ;;
        --requests) REQUESTS=$2; shift 2 ;;
        --image-kib) IMAGE_KIB=$2; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
if [[ -z $BIN ]]; then
    (cd "$ROOT" && cargo build --release -p kvmesh-node -p kvmesh-sim --bins)
    BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"
fi
command -v curl >/dev/null || { echo "needs curl" >&2; exit 1; }
WORK=$(mktemp -d)
# shellcheck source=lib/loopback.sh
source "$ROOT/scripts/lib/loopback.sh"

"$BIN/kvmesh" cert init --dir "$WORK/tls" >/dev/null
# Engine A serves another model, so every request entering at A goes to B over the mesh.
start_engine "$BIN" engine-a other-model
A_ENGINE=$ENGINE_URL
start_engine "$BIN" engine-b mock-model
B_ENGINE=$ENGINE_URL
start_sidecar "$BIN" "$WORK/tls" a "$A_ENGINE"
start_sidecar "$BIN" "$WORK/tls" b "$B_ENGINE" "$(mesh_of a)"
for _ in $(seq 200); do
    curl -s "$(http_of a)/v1/models" | grep -q mock-model && break
    sleep 0.1
done
A=$(http_of a); B=$(http_of b)

# A 256 KiB PNG: a real signature and a 1024x768 header, then random bytes (incompressible,
# as photos are).
{
    printf '\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00\x04\x00\x00\x00\x03\x00\x08\x02\x00\x00\x00'
    head -c $((IMAGE_KIB * 1024 - 29)) /dev/urandom
} >"$WORK/image.png"
IMAGE=$(base64 -w0 "$WORK/image.png")
printf '{"model":"mock-model","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,%s"}},{"type":"text","text":"What is in this picture?"}]}]}' \
    "$IMAGE" >"$WORK/image.json"
printf '{"model":"mock-model","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"What is in this picture?"}]}]}' \
    >"$WORK/text.json"

send() { # URL BODY_FILE: prints the request's total seconds, fails on a non-200
    local out
    out=$(curl -s -o /dev/null -w '%{http_code} %{time_total}' -H 'content-type: application/json' \
        --data-binary "@$2" "$1/v1/chat/completions")
    [[ ${out%% *} == 200 ]] || { echo "$1 answered ${out%% *}" >&2; exit 1; }
    echo "${out#* }"
}
for body in image text; do
    for _ in $(seq 20); do send "$A" "$WORK/$body.json" >/dev/null; done # warm-up, connections
    for _ in $(seq "$REQUESTS"); do
        send "$B_ENGINE" "$WORK/$body.json" >>"$WORK/$body-direct.txt"
        send "$A" "$WORK/$body.json" >>"$WORK/$body-two-hops.txt"
        send "$B" "$WORK/$body.json" >>"$WORK/$body-one-hop.txt"
    done
done

quantile() { sort -g "$1" | awk -v q="$2" '{v[NR]=$1} END {i=int(q*(NR-1))+1; printf "%.3f", v[i]*1000}'; }
printf '%-16s %-10s %10s %10s %14s\n' request path "p50 ms" "p90 ms" "p50 added ms"
for body in image text; do
    base=$(quantile "$WORK/$body-direct.txt" 0.5)
    for path in direct two-hops one-hop; do
        p50=$(quantile "$WORK/$body-$path.txt" 0.5)
        p90=$(quantile "$WORK/$body-$path.txt" 0.9)
        added=$(awk -v a="$p50" -v b="$base" 'BEGIN {printf "%+.3f", a - b}')
        printf '%-16s %-10s %10s %10s %14s\n' "$body ($(wc -c <"$WORK/$body.json") B)" "$path" "$p50" "$p90" "$added"
    done
done
