#!/usr/bin/env bash
# The mock engine checked against real vLLM (issue 45 §3): the same requests, token for token
# (the load generator replays a workload from a seed), sent round-robin to N real vLLM CPU
# servers (scripts/lib/vllm.sh, one pinned core each) and then to N mock engines
# (`kvmesh-sim engine --engine-profile cpu-tiny`, the profile fitted to those servers by
# scripts/lib/fit-engine-profile.py), each with the same KV capacity and block size; then one
# table, per workload:
#
#   workload | engines | TTFT mean real / mock | Δ % | TTFT p99 real / mock | Δ % |
#   hit rate real / mock | Δ points
#
# The hit rates are the engines' own counters (vllm:prefix_cache_hits_total / _queries_total,
# which the mock exposes under the same names) over the run. Issue 45's targets: TTFT within
# 15%, hit rate within 3 points, on workloads that were not used to fit the profile.
#
# Usage: scripts/mock-vs-vllm.sh [--workload gsp,rag-pressure] [--engines 1] [--cores 1]
#            [--port 18200] [--out DIR] [--bin-dir DIR] [--workload-seed 7] [--mock-only]
#            [--real-only] [--time-scale 1]
#   --engines N      servers of each kind (default 1; at most one real server per core)
#   --cores C,...    the cores the real servers are pinned to, one each (default: 1, or 0,1)
#   --port P         first port (real servers P, P+1, ...; mock engines P+10, ...)
#   --out DIR        where the reports and table.md go (default: a kept temporary directory)
#   --mock-only      run the mock engines only, against the real runs already in --out
#   --real-only      run the real servers only
#   --time-scale S   the mock's --time-scale (1 = the profile as fitted)
# Needs python3. vLLM starts in ~40 s per workload (a fresh server: an empty cache).
# Every process it starts is in a process group of its own, killed on exit, error or Ctrl-C.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

WORKLOADS=gsp,rag-pressure; ENGINES=1; CORES=; PORT=18200; OUT=; BIN_DIR=; SEED=7
MOCK=1; REAL=1; TIME_SCALE=1
while [[ $# -gt 0 ]]; do
    case $1 in
        --workload) WORKLOADS=$2; shift 2 ;;
        --engines) ENGINES=$2; shift 2 ;;
        --cores) CORES=$2; shift 2 ;;
        --port) PORT=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --bin-dir) BIN_DIR=$2; shift 2 ;;
        --workload-seed) SEED=$2; shift 2 ;;
        --mock-only) REAL=0; shift ;;
        --real-only) MOCK=0; shift ;;
        --time-scale) TIME_SCALE=$2; shift 2 ;;
        -h | --help) sed -n '2,27p' "$0"; exit 0 ;;
        *) echo "mock-vs-vllm.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[[ $ENGINES =~ ^[1-9][0-9]*$ ]] || { echo "--engines: a positive integer" >&2; exit 2; }
if [[ -z $CORES ]]; then
    if ((ENGINES == 1)); then CORES=1; else CORES=$(seq -s, 0 $((ENGINES - 1))); fi
fi
IFS=, read -r -a CORE_LIST <<<"$CORES"
((${#CORE_LIST[@]} >= ENGINES)) || { echo "--cores: one core per real server" >&2; exit 2; }
IFS=, read -r -a WORKLOAD_LIST <<<"$WORKLOADS"
command -v python3 >/dev/null || { echo "mock-vs-vllm.sh needs python3" >&2; exit 2; }

if [[ -z $BIN_DIR ]]; then
    (cd "$ROOT" && cargo build --release -p kvmesh-sim --bins)
    BIN_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/release"
fi
SIM="$(cd "$BIN_DIR" && pwd)/kvmesh-sim"
[[ -x $SIM ]] || { echo "no kvmesh-sim in $BIN_DIR" >&2; exit 1; }
[[ $REAL == 1 || -n $OUT ]] || { echo "--mock-only needs --out (the real runs)" >&2; exit 2; }
[[ -n $OUT ]] || OUT=$(mktemp -d "${TMPDIR:-/tmp}/kvmesh-mock-vs-vllm.XXXXXX")
mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
WORK=$OUT
# shellcheck source=lib/processes.sh
source "$ROOT/scripts/lib/processes.sh"
trap 'kill_groups "${GROUPS_ALIVE[@]+"${GROUPS_ALIVE[@]}"}"' EXIT

T0=$(date +%s)
log() { printf '[mock-vs-vllm %4ss] %s\n' "$(($(date +%s) - T0))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The workloads, small enough for one core per engine. Both engines get the KV capacity in
# 32-token blocks (vllm.sh's block size); the load generator sends text prompts of the tiny
# model's one-token pieces, so both count the same tokens.
BLOCKS=0
LOAD_ARGS=()
configure() {
    LOAD_ARGS=(--workload "$1" --stream --seed "$SEED" --timeout 300 --threads 1 --model tiny)
    case $1 in
        gsp)
            # 8 groups x 8 questions: a 2048-token system prompt per group, 128-token
            # questions, 32 tokens out, 1.5 req/s per engine. Everything fits (2000 blocks).
            BLOCKS=2000
            LOAD_ARGS+=(--rate "$(awk -v n="$ENGINES" 'BEGIN { print 1.5 * n }')"
                --gsp-groups $((8 * ENGINES)) --gsp-prompts-per-group 8 --gsp-system-len 2048
                --gsp-question-len 128 --gsp-output-len 32)
            ;;
        rag-pressure)
            # The preset (4192-token prompts of 2 of 6 documents, 32 out) on its cache: 10,240
            # tokens per engine, 320 blocks of 32. 0.8 req/s per engine for 90 s.
            BLOCKS=320
            LOAD_ARGS+=(--rate "$(awk -v n="$ENGINES" 'BEGIN { print 0.8 * n }')" --duration 90)
            ;;
        *) die "workload $1: not one this script sizes (gsp, rag-pressure)" ;;
    esac
}

# Waits until URL/v1/models answers (up to $2 s).
wait_ready() {
    local deadline=$(($(date +%s) + $2))
    until curl -sf "$1/v1/models" >/dev/null 2>&1; do
        (($(date +%s) < deadline)) || return 1
        sleep 1
    done
}

# run_load W KIND URL...: the workload against the URLs, round-robin; JSON in $OUT/W-KIND.json.
run_load() {
    local w=$1 kind=$2
    shift 2
    local targets
    targets=$(IFS=,; echo "$*")
    printf '%s\n' "${LOAD_ARGS[@]}" >"$OUT/$w.load-args"
    "$SIM" load --targets "$targets" --pick round-robin "${LOAD_ARGS[@]}" \
        --json "$OUT/$w-$kind.json" --records "$OUT/$w-$kind.records.jsonl" \
        >"$OUT/logs/$w-$kind-load.log" 2>&1 ||
        { tail -n 20 "$OUT/logs/$w-$kind-load.log" >&2; die "the load generator failed on $w / $kind"; }
    grep -E '^(requests:|TTFT|cluster prefix-cache hit rate:)' "$OUT/logs/$w-$kind-load.log" |
        sed 's/^/    /' >&2 || true
}

run_real() {
    local w=$1 urls=() pids=() i
    for ((i = 0; i < ENGINES; i++)); do
        local port=$((PORT + i))
        if curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1; then
            die "port $port is taken (--port)"
        fi
        spawn "$w-vllm-$i" "$ROOT/scripts/lib/vllm.sh" serve "${CORE_LIST[i]}" "$port" \
            --num-gpu-blocks-override "$BLOCKS"
        pids+=("$SPAWNED_PID")
        urls+=("http://127.0.0.1:$port")
    done
    for url in "${urls[@]}"; do
        wait_ready "$url" 300 || die "vLLM at $url did not start (logs in $OUT/logs)"
    done
    log "[$w] real vLLM x$ENGINES (cores ${CORES}): kvmesh-sim load ${LOAD_ARGS[*]}"
    run_load "$w" real "${urls[@]}"
    kill_groups "${pids[@]}"
}

run_mock() {
    local w=$1 urls=() pids=() i
    for ((i = 0; i < ENGINES; i++)); do
        local port=$((PORT + 10 + i))
        spawn "$w-mock-$i" taskset -c "${CORE_LIST[i]}" "$SIM" engine --port "$port" \
            --engine-profile cpu-tiny --block-size 32 --kv-blocks "$BLOCKS" --model tiny \
            --max-model-len 8192 --time-scale "$TIME_SCALE" --engine-index "$i"
        pids+=("$SPAWNED_PID")
        urls+=("http://127.0.0.1:$port")
    done
    for url in "${urls[@]}"; do
        wait_ready "$url" 30 || die "the mock engine at $url did not start"
    done
    log "[$w] mock engines x$ENGINES (--engine-profile cpu-tiny): the same requests"
    run_load "$w" mock "${urls[@]}"
    kill_groups "${pids[@]}"
}

for w in "${WORKLOAD_LIST[@]}"; do
    configure "$w"
    [[ $REAL == 1 ]] && run_real "$w"
    [[ $MOCK == 1 ]] && run_mock "$w"
done

python3 - "$OUT" "$ENGINES" "${WORKLOAD_LIST[@]}" >"$OUT/table.md" <<'EOF'
import json, sys
out, engines, workloads = sys.argv[1], sys.argv[2], sys.argv[3:]
print("| workload | engines | requests | TTFT mean real / mock (ms) | Δ | TTFT p99 real / mock (ms) | Δ | hit rate real / mock | Δ points |")
print("|---|---|---|---|---|---|---|---|---|")
for w in workloads:
    try:
        real = json.load(open(f"{out}/{w}-real.json"))
        mock = json.load(open(f"{out}/{w}-mock.json"))
    except FileNotFoundError as e:
        print(f"| {w} | {engines} | missing: {e.filename} | | | | | | |")
        continue
    def pct(r, m):
        return f"{(m - r) / r * 100:+.1f}%"
    rm, mm = real["ttft_s"]["mean"] * 1e3, mock["ttft_s"]["mean"] * 1e3
    rp, mp = real["ttft_s"]["p99"] * 1e3, mock["ttft_s"]["p99"] * 1e3
    rh, mh = real["cluster"]["hit_rate"] * 100, mock["cluster"]["hit_rate"] * 100
    n = f"{real['requests']['ok']} / {mock['requests']['ok']}"
    print(f"| {w} | {engines} | {n} | {rm:.0f} / {mm:.0f} | {pct(rm, mm)} | {rp:.0f} / {mp:.0f} | "
          f"{pct(rp, mp)} | {rh:.1f}% / {mh:.1f}% | {mh - rh:+.1f} |")
EOF
cat "$OUT/table.md"
log "reports in $OUT"
