#!/usr/bin/env bash
# kvmesh against vllm-router's cache_aware policy (and round-robin straight to the engines) in
# front of the same 4 modelled engines, as ratios: runs scripts/demo.sh --with-vllm-router
# (fresh engines per policy, the demo's gsp and trace workloads) --runs times and prints, per
# run and workload, hit rate, mean and p99 TTFT with kvmesh / vllm-router and
# kvmesh / round-robin. The demo's own reports stay in OUT/run-N/. Figures go to
# BENCHMARKS.md by hand.
#
# --pd: prefill/decode disaggregation instead: scripts/demo.sh --pd (2 prefill + 2 decode
# NixlConnector engines; kvmesh with sidecars --role prefill/decode, the same engines as mixed,
# and vllm-router --vllm-pd-disaggregation --prefill-policy cache_aware --decode-policy
# power_of_two), on the pd-burst workload (decode bursts while long prefills run) unless
# --workload says otherwise. Prints mean/p99 TTFT and ITL p50/p99 per run and the ratios
# kvmesh pd / vllm-router pd per run, with their medians. vllm-router is installed once into a
# throwaway virtualenv unless it is on PATH. --pd-config FILE: a kvmesh TOML file (a [pd]
# table) for the kvmesh pd sidecars (demo.sh --pd-config); --kv-blocks N: every engine's KV
# capacity (demo.sh --kv-blocks); --engine-arg ARG: one more argument for every engine.
#
# Usage: scripts/compare-vllm-router.sh [--bin-dir DIR] [--runs 2] [--out DIR]
#            [--workload gsp,trace] [--duration 40] [--pd [--pd-config FILE]]
#            [--kv-blocks N] [--engine-arg ARG]...
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN_DIR=; RUNS=2; OUT=compare-report; WORKLOADS=; DURATION=40; PD=0; PD_CONFIG=; mode_args=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --bin-dir) BIN_DIR=$2; shift 2 ;;
        --runs) RUNS=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --workload) WORKLOADS=$2; shift 2 ;;
        --duration) DURATION=$2; shift 2 ;;
        --pd) PD=1; shift ;;
        --pd-config) PD_CONFIG=$2; shift 2 ;;
        --kv-blocks) mode_args+=(--kv-blocks "$2"); shift 2 ;;
        --engine-arg) mode_args+=("--engine-arg=$2"); shift 2 ;;
        --engine-arg=*) mode_args+=("$1"); shift ;;
        -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "compare-vllm-router.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[[ $RUNS =~ ^[0-9]+$ && $RUNS -ge 1 ]] || { echo "--runs: a positive integer" >&2; exit 2; }
[[ $OUT == /* ]] || OUT="$PWD/$OUT"
if [[ -z $WORKLOADS ]]; then
    if [[ $PD == 1 ]]; then WORKLOADS=pd-burst; else WORKLOADS=gsp,trace; fi
fi
bin_args=()
[[ -n $BIN_DIR ]] && bin_args=(--bin-dir "$BIN_DIR")
[[ $PD == 1 ]] && mode_args+=(--pd)
[[ -n $PD_CONFIG ]] && mode_args+=(--pd-config "$PD_CONFIG")

mkdir -p "$(dirname "$OUT")"

# --pd: one vllm-router for every run (demo.sh takes it from PATH), in a virtualenv removed on
# exit; demo.sh's own processes are stopped by its trap.
VENV=
cleanup() {
    local rc=$?
    [[ -n $VENV ]] && rm -rf "$VENV"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if [[ $PD == 1 ]] && ! command -v vllm-router >/dev/null 2>&1; then
    VENV=$(mktemp -d "${TMPDIR:-/tmp}/kvmesh-compare-venv.XXXXXX")
    echo "installing vllm-router into a throwaway virtualenv ($VENV)" >&2
    { python3 -m venv "$VENV" && "$VENV/bin/pip" install --quiet vllm-router; } >"$OUT-venv.log" 2>&1 &&
        [[ -x $VENV/bin/vllm-router ]] ||
        { tail -n 5 "$OUT-venv.log" >&2; echo "compare-vllm-router.sh: cannot install vllm-router" >&2; exit 1; }
    export PATH="$VENV/bin:$PATH"
fi

for ((run = 1; run <= RUNS; run++)); do
    echo "== run $run of $RUNS: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    bash "$ROOT/scripts/demo.sh" "${bin_args[@]}" "${mode_args[@]+"${mode_args[@]}"}" --with-vllm-router \
        --workload "$WORKLOADS" --duration "$DURATION" --out "$OUT/run-$run" >"$OUT-run-$run.log" 2>&1 ||
        { tail -n 30 "$OUT-run-$run.log" >&2; exit 1; }
    echo "   finished $(date -u '+%H:%M:%S UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done

if [[ $PD == 1 ]]; then
    python3 - "$OUT" "$RUNS" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
def ms(x):
    return f"{x * 1000:.1f}" if x is not None else "n/a"
def ratio(a, b):
    return a / b if a is not None and b else None
def fmt(x):
    return f"{x:.2f}" if x is not None else "n/a"
FIGS = [("mean TTFT", "ttft_s", "mean"), ("p99 TTFT", "ttft_s", "p99"),
        ("ITL p50", "itl_s", "p50"), ("ITL p99", "itl_s", "p99")]
print("| run | workload | policy | requests | errors | mean TTFT ms | p99 TTFT ms | ITL p50 ms | ITL p99 ms |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|")
ratios = {}
for run in range(1, runs + 1):
    doc = json.load(open(f"{out}/run-{run}/results.json"))
    by = {(r["workload"], r["policy"]): r for r in doc["runs"]}
    for (workload, policy), r in by.items():
        print(f"| {run} | {workload} | {policy} | {r['requests']} | {r['errors']} | "
              + " | ".join(ms(r[k][q]) for (_, k, q) in FIGS) + " |")
    for workload in dict.fromkeys(w for (w, _) in by):
        k = by.get((workload, "kvmesh pd"))
        for other in ("vllm-router pd", "kvmesh mixed"):
            o = by.get((workload, other))
            if k and o:
                ratios.setdefault((workload, other), []).append(
                    [ratio(k[key][q], o[key][q]) for (_, key, q) in FIGS])
print()
print("| workload | kvmesh pd / | run | " + " | ".join(n for (n, _, _) in FIGS) + " |")
print("|---|---|---|" + "---:|" * len(FIGS))
for (workload, other), rows in ratios.items():
    for i, row in enumerate(rows, 1):
        print(f"| {workload} | {other} | {i} | " + " | ".join(fmt(x) for x in row) + " |")
    med = [statistics.median([r[j] for r in rows if r[j] is not None] or [float("nan")])
           for j in range(len(FIGS))]
    print(f"| {workload} | {other} | **median** | " + " | ".join(f"**{fmt(x)}**" for x in med) + " |")
    if other == "vllm-router pd":
        itl, ttft = med[3], med[0]
        print(f"\ntargets ({workload}, medians): ITL p99 {fmt(itl)} (<= 0.8: "
              f"{'met' if itl <= 0.8 else 'NOT met'}), mean TTFT {fmt(ttft)} (<= 0.9: "
              f"{'met' if ttft <= 0.9 else 'NOT met'})\n")
PY
    for ((run = 1; run <= RUNS; run++)); do
        echo
        echo "run $run, what went where (from $OUT/run-$run/results.json notes):"
        python3 -c 'import json, sys; [print("  " + n) for n in json.load(open(sys.argv[1]))["notes"]]' \
            "$OUT/run-$run/results.json"
    done
    exit 0
fi

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
