#!/usr/bin/env bash
# kvmesh against vllm-router's cache_aware policy (and round-robin straight to the engines) in
# front of the same 4 modelled engines, as ratios: runs scripts/demo.sh --with-vllm-router
# (fresh engines per policy, the demo's gsp and trace workloads) --runs times and prints, per
# run and workload, hit rate, mean and p99 TTFT with kvmesh / vllm-router and
# kvmesh / round-robin. The demo's own reports stay in OUT/run-N/. Figures go to
# BENCHMARKS.md by hand.
#
# Usage: scripts/compare-vllm-router.sh [--bin-dir DIR] [--runs 2] [--out DIR]
#            [--workload gsp,trace] [--duration 40]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN_DIR=; RUNS=2; OUT=compare-report; WORKLOADS=gsp,trace; DURATION=40
while [[ $# -gt 0 ]]; do
    case $1 in
        --bin-dir) BIN_DIR=$2; shift 2 ;;
        --runs) RUNS=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --workload) WORKLOADS=$2; shift 2 ;;
        --duration) DURATION=$2; shift 2 ;;
        -h | --help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "compare-vllm-router.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[[ $RUNS =~ ^[0-9]+$ && $RUNS -ge 1 ]] || { echo "--runs: a positive integer" >&2; exit 2; }
[[ $OUT == /* ]] || OUT="$PWD/$OUT"
bin_args=()
[[ -n $BIN_DIR ]] && bin_args=(--bin-dir "$BIN_DIR")

for ((run = 1; run <= RUNS; run++)); do
    echo "== run $run of $RUNS: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    bash "$ROOT/scripts/demo.sh" "${bin_args[@]}" --with-vllm-router --workload "$WORKLOADS" \
        --duration "$DURATION" --out "$OUT/run-$run" >"$OUT-run-$run.log" 2>&1 ||
        { tail -n 30 "$OUT-run-$run.log" >&2; exit 1; }
done

python3 - "$OUT" "$RUNS" <<'PY'
import json, sys
out, runs = sys.argv[1], int(sys.argv[2])
def ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b else "n/a"
def pct(x):
    return f"{x * 100:.1f}%" if x is not None else "n/a"
def ms(x):
    return f"{x * 1000:.1f}" if x is not None else "n/a"
print("| run | workload | policy | hit rate | mean TTFT ms | p99 TTFT ms | errors |")
print("|---|---|---|---:|---:|---:|---:|")
ratios = []
for run in range(1, runs + 1):
    doc = json.load(open(f"{out}/run-{run}/results.json"))
    by = {(r["workload"], r["policy"]): r for r in doc["runs"]}
    for (workload, policy), r in by.items():
        print(f"| {run} | {workload} | {policy} | {pct(r['hit_rate'])} | {ms(r['ttft_s']['mean'])} | "
              f"{ms(r['ttft_s']['p99'])} | {r['errors']} |")
    for workload in dict.fromkeys(w for (w, _) in by):
        k = by.get((workload, "kvmesh"))
        for other in ("vllm-router cache_aware", "round-robin"):
            o = by.get((workload, other))
            if k and o:
                ratios.append((run, workload, other, ratio(k["hit_rate"], o["hit_rate"]),
                               ratio(k["ttft_s"]["mean"], o["ttft_s"]["mean"]),
                               ratio(k["ttft_s"]["p99"], o["ttft_s"]["p99"])))
print()
print("| run | workload | kvmesh / | hit rate | mean TTFT | p99 TTFT |")
print("|---|---|---|---:|---:|---:|")
for row in ratios:
    print("| " + " | ".join(str(c) for c in row) + " |")
PY
