#!/usr/bin/env bash
# The simulator checked against real processes (issue 14): per workload, the demo's run over
# real processes (scripts/demo.sh --no-vllm-router: 4 mock engines + 4 sidecars, kvmesh through
# random entry nodes, then round-robin straight to fresh engines) and `kvmesh-sim simulate`
# over exactly the same requests, engines and arrivals, then one table:
#
#   workload | run | kvmesh hit rate real / sim | Δ points | round-robin hit rate real / sim |
#   kvmesh÷round-robin mean TTFT real / sim | Δ % | p99 ratio real / sim (informational)
#
# Δ % is (sim − real) / real of the mean-TTFT ratio. Issue 14's targets: the kvmesh hit rates
# within 5 points, the ratios within 15%. A second table compares kvmesh request by request
# (the simulator's --records-dir against the load generator's records): how many requests
# the same engine served, the routing reasons, and the mean TTFT by reason.
#
# The simulator's flags are not chosen here: the demo writes every engine flag and every load
# generator flag it used (runs/W.engine-args, runs/W.load-args), and each is translated below
# into its `simulate` counterpart; a flag without one stops the script (see translate_engine and
# translate_load). The simulator is deterministic, so it runs once per workload. Its kvmesh
# runs enter through every node as the load generator picks them (the same function of seed
# and index, `workload::random_target`); its round-robin runs through one entry node (one
# counter over the engines, as the load generator's --pick round-robin straight to them).
# What a real run draws afresh, the sidecars' keys for spreading a request among near-equal
# engines (their request ids carry the clock), the simulator draws with --spread-seed: kvmesh
# is also simulated under spread seeds 1..N-1 and the table gives the range over all N.
#
# Usage: scripts/sim-vs-real.sh [--bin-dir DIR] [--workload gsp,chat,rag-pressure]
#            [--runs 1] [--duration 40] [--nodes 4] [--out DIR] [--kv-blocks N]
#            [--engine-arg ARG]... [--workload-seed 7] [--spreads 5]
#   --bin-dir DIR    kvmesh and kvmesh-sim release binaries (default: cargo build --release)
#   --workload W,…   any of gsp, chat, rag, rag-pressure, vision, trace (demo.sh's)
#   --runs N         real runs per workload (the simulation runs once)
#   --out DIR        where the demo reports, the simulator's JSON and table.md go
#                    (default: a temporary directory, kept and printed)
#   --kv-blocks, --engine-arg, --workload-seed   passed to demo.sh (and so to the simulator)
#   --sim-only       do not run the demo: simulate against the real runs already in --out
#   --spreads N      simulate kvmesh under N spread seeds (0..N-1); the figures are seed 0's,
#                    the range is over all N
# Needs python3. The demo kills every process it starts on exit, error or Ctrl-C.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

BIN_DIR=; WORKLOADS=gsp,chat,rag-pressure; RUNS=1; DURATION=40; NODES=4; OUT=; SIM_ONLY=0
SPREADS=5
DEMO_EXTRA=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --bin-dir) BIN_DIR=$2; shift 2 ;;
        --workload) WORKLOADS=$2; shift 2 ;;
        --runs) RUNS=$2; shift 2 ;;
        --spreads) SPREADS=$2; shift 2 ;;
        --duration) DURATION=$2; shift 2 ;;
        --nodes) NODES=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --sim-only) SIM_ONLY=1; shift ;;
        --kv-blocks) DEMO_EXTRA+=(--kv-blocks "$2"); shift 2 ;;
        --workload-seed) DEMO_EXTRA+=(--workload-seed "$2"); shift 2 ;;
        --engine-arg) DEMO_EXTRA+=(--engine-arg "$2"); shift 2 ;;
        --engine-arg=*) DEMO_EXTRA+=("$1"); shift ;;
        -h | --help) sed -n '2,38p' "$0"; exit 0 ;;
        *) echo "sim-vs-real.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || { echo "--runs: a positive integer" >&2; exit 2; }
[[ $SPREADS =~ ^[1-9][0-9]*$ ]] || { echo "--spreads: a positive integer" >&2; exit 2; }
IFS=, read -r -a WORKLOAD_LIST <<<"$WORKLOADS"
for w in "${WORKLOAD_LIST[@]}"; do
    case $w in gsp | chat | rag | rag-pressure | vision | trace) ;;
        *) echo "sim-vs-real.sh: workload $w: not one the demo runs with mixed engines" >&2; exit 2 ;;
    esac
done
command -v python3 >/dev/null || { echo "sim-vs-real.sh needs python3" >&2; exit 2; }

if [[ -z $BIN_DIR ]]; then
    (cd "$ROOT" && cargo build --release -p kvmesh-node -p kvmesh-sim --bins)
    BIN_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/release"
fi
BIN_DIR=$(cd "$BIN_DIR" && pwd)
SIM="$BIN_DIR/kvmesh-sim"
[[ -x $BIN_DIR/kvmesh && -x $SIM ]] || { echo "no kvmesh / kvmesh-sim in $BIN_DIR" >&2; exit 1; }
[[ $SIM_ONLY == 0 || -n $OUT ]] || { echo "--sim-only needs --out (the real runs)" >&2; exit 2; }
[[ -n $OUT ]] || OUT=$(mktemp -d "${TMPDIR:-/tmp}/kvmesh-sim-vs-real.XXXXXX")
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

T0=$(date +%s)
log() { printf '[sim-vs-real %4ss] %s\n' "$(($(date +%s) - T0))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# translate_engine FILE: the `simulate` flags of the engine flags in FILE (one a line; a flag
# and its value on two lines, or FLAG=VALUE on one), into the array SIM_ENGINE.
translate_engine() {
    local -a a
    mapfile -t a <"$1"
    SIM_ENGINE=()
    local i=0 flag value
    while ((i < ${#a[@]})); do
        flag=${a[i]}
        if [[ $flag == --*=* ]]; then
            value=${flag#*=}; flag=${flag%%=*}; i=$((i + 1))
        else
            value=${a[i + 1]:-}; i=$((i + 2))
        fi
        case $flag in
            --kv-blocks | --max-num-seqs | --max-num-batched-tokens | --time-scale | \
                --prefill-tokens-per-s | --decode-step-ms | --engine-profile)
                SIM_ENGINE+=("$flag" "$value") ;;
            --block-size)
                # The simulated engines' blocks are the model's default (16 tokens), which
                # the sidecars hash by too.
                [[ $value == 16 ]] || die "engine --block-size $value: the simulator's engines have 16-token blocks"
                ;;
            *) die "engine flag $flag (in $1): the simulator has no counterpart" ;;
        esac
    done
}

# translate_load FILE: the `simulate` flags of the load generator flags in FILE, into the
# array SIM_LOAD; sets HAS_COUNT when they bound the request count (--requests, --duration).
translate_load() {
    local -a a
    mapfile -t a <"$1"
    SIM_LOAD=()
    HAS_COUNT=0
    local i=0 flag value
    while ((i < ${#a[@]})); do
        flag=${a[i]}
        case $flag in
            # The simulator's TTFT is the first token's, the streamed client's the first text
            # chunk's: the same event. A timeout only matters if a request hit it (the table
            # says how many failed). --threads: the load generator's client runtime.
            --stream) i=$((i + 1)); continue ;;
            --timeout | --threads) i=$((i + 2)); continue ;;
        esac
        value=${a[i + 1]:-}
        i=$((i + 2))
        case $flag in
            --workload | --seed | --rate | --gsp-* | --chat-* | --rag-* | --vision-* | --hot-* | \
                --trace | --max-input-tokens | --max-output-tokens)
                # Shared: the workload's own flags (sim/src/workload/), the arrival rate and
                # the seed of prompts, arrivals and entry nodes.
                SIM_LOAD+=("$flag" "$value") ;;
            --requests | --duration) SIM_LOAD+=("$flag" "$value"); HAS_COUNT=1 ;;
            # The load generator multiplies trace timestamps, the simulator divides them.
            --time-scale) SIM_LOAD+=(--trace-speedup "$(awk -v s="$value" 'BEGIN { printf "%.9g", 1 / s }')") ;;
            *) die "load flag $flag (in $1): the simulator has no counterpart" ;;
        esac
    done
}

# The value of FLAG in the one-a-line flags file FILE (empty if absent).
flag_value() { awk -v f="$2" 'prev == f { print; exit } { prev = $0 }' "$1"; }

ROWS=()
for w in "${WORKLOAD_LIST[@]}"; do
    for ((r = 1; r <= RUNS; r++)); do
        real="$OUT/real-$w-$r"
        if [[ $SIM_ONLY == 1 ]]; then
            [[ -s $real/runs/$w-kvmesh.json && -s $real/runs/$w-round-robin.json ]] ||
                die "--sim-only: no real run of $w in $real"
            continue
        fi
        log "[$w] run $r of $RUNS over real processes: scripts/demo.sh --workload $w --no-vllm-router (log: $real.log)"
        "$ROOT/scripts/demo.sh" --bin-dir "$BIN_DIR" --workload "$w" --no-vllm-router \
            --nodes "$NODES" --duration "$DURATION" --out "$real" \
            "${DEMO_EXTRA[@]+"${DEMO_EXTRA[@]}"}" >"$real.log" 2>&1 ||
            { tail -n 20 "$real.log" >&2; die "the demo failed on $w (log: $real.log)"; }
        grep -E '^ +(requests:|cluster prefix-cache hit rate:)' "$real.log" | sed 's/^ */    /' >&2 || true
    done

    # The flags of the first real run (every run of the same workload uses the same ones).
    first="$OUT/real-$w-1/runs"
    [[ -s $first/$w.engine-args && -s $first/$w.load-args ]] ||
        die "the demo wrote no $w.engine-args / $w.load-args in $first"
    translate_engine "$first/$w.engine-args"
    translate_load "$first/$w.load-args"
    count=()
    if [[ $HAS_COUNT == 0 && $w == gsp ]]; then
        # Without --requests or --duration the load generator sends the workload once over
        # (groups × prompts per group); the simulator's default for gsp would be 2,000.
        groups=$(flag_value "$first/$w.load-args" --gsp-groups)
        ppg=$(flag_value "$first/$w.load-args" --gsp-prompts-per-group)
        [[ -n $groups && -n $ppg ]] || die "gsp without --gsp-groups / --gsp-prompts-per-group"
        count=(--requests "$((groups * ppg))")
    fi
    sim_flags=(--nodes "$NODES" "${SIM_ENGINE[@]+"${SIM_ENGINE[@]}"}" "${SIM_LOAD[@]}"
        "${count[@]+"${count[@]}"}" --threads 1)
    printf '%s\n' "${sim_flags[@]}" >"$OUT/sim-$w.flags"
    log "[$w] simulating: kvmesh-sim simulate ${sim_flags[*]} --policy kvmesh | --policy round-robin --entry-nodes 1"
    (cd "$ROOT" && nice "$SIM" simulate "${sim_flags[@]}" --policy kvmesh \
        --json "$OUT/sim-$w-kvmesh.json" --records-dir "$OUT/sim-$w-records" \
        >"$OUT/sim-$w-kvmesh.md") ||
        die "the simulator failed on $w / kvmesh"
    for ((k = 1; k < SPREADS; k++)); do
        (cd "$ROOT" && nice "$SIM" simulate "${sim_flags[@]}" --policy kvmesh --spread-seed "$k" \
            --json "$OUT/sim-$w-kvmesh-spread-$k.json" >/dev/null) ||
            die "the simulator failed on $w / kvmesh / --spread-seed $k"
    done
    (cd "$ROOT" && nice "$SIM" simulate "${sim_flags[@]}" --policy round-robin --entry-nodes 1 \
        --json "$OUT/sim-$w-round-robin.json" --records-dir "$OUT/sim-$w-records" \
        >"$OUT/sim-$w-round-robin.md") ||
        die "the simulator failed on $w / round-robin"
    for ((r = 1; r <= RUNS; r++)); do
        ROWS+=("$w" "$r" "$OUT/real-$w-$r/runs" "$OUT/sim-$w" "$OUT/sim-$w-records/$NODES" "$SPREADS")
    done
done

python3 - "${ROWS[@]}" >"$OUT/table.md" <<'PY'
import json, sys

def real(runs, w, policy):
    d = json.load(open(f"{runs}/{w}-{policy}.json"))
    return {
        "hit": d["cluster"]["hit_rate"],
        "mean": d["ttft_s"]["mean"],
        "p99": d["ttft_s"]["p99"],
        "sent": d["requests"]["sent"],
        "failed": d["requests"]["failed"],
    }

def sim(prefix, policy):
    d = json.load(open(f"{prefix}-{policy}.json"))
    r = d["runs"][0]["results"][0]
    return {"hit": r["hit_rate"], "mean": r["ttft_s"]["mean"], "p99": r["ttft_s"]["p99"],
            "sent": r["requests"], "failed": r["requests"] - r["completed"]}

def lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]

def spread_range(sk, sr, others):
    """The simulated kvmesh hit rate and TTFT ratio over every spread seed: min–max."""
    hits = [sk["hit"]] + [o["hit_rate"] for o in others]
    ratios = [sk["mean"] / sr["mean"]] + [o["ttft_s"]["mean"] / sr["mean"] for o in others]
    return (f"{100 * min(hits):.1f}–{100 * max(hits):.1f}%, "
            f"{min(ratios):.3f}–{max(ratios):.3f} ({len(hits)} seeds)")

args = sys.argv[1:]
ROW = 6
print("| workload | run | kvmesh hit real / sim | Δ points | RR hit real / sim "
      "| kvmesh÷RR mean TTFT real / sim | Δ % | p99 ratio real / sim "
      "| mean TTFT s kvmesh, RR: real / sim | requests (failed) real / sim "
      "| sim over spread seeds: hit, ratio |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for i in range(0, len(args), ROW):
    w, run, runs, prefix, _, spreads = args[i:i + ROW]
    others = [json.load(open(f"{prefix}-kvmesh-spread-{k}.json"))["runs"][0]["results"][0]
              for k in range(1, int(spreads))]
    rk, rr = real(runs, w, "kvmesh"), real(runs, w, "round-robin")
    sk, sr = sim(prefix, "kvmesh"), sim(prefix, "round-robin")
    ratio_real, ratio_sim = rk["mean"] / rr["mean"], sk["mean"] / sr["mean"]
    p99_real, p99_sim = rk["p99"] / rr["p99"], sk["p99"] / sr["p99"]
    pct = lambda x: f"{100 * x:.1f}%"
    print(f"| {w} | {run} | {pct(rk['hit'])} / {pct(sk['hit'])} "
          f"| {100 * (sk['hit'] - rk['hit']):+.1f} "
          f"| {pct(rr['hit'])} / {pct(sr['hit'])} "
          f"| {ratio_real:.3f} / {ratio_sim:.3f} | {100 * (ratio_sim / ratio_real - 1):+.1f}% "
          f"| {p99_real:.3f} / {p99_sim:.3f} "
          f"| {rk['mean']:.3f}, {rr['mean']:.3f} / {sk['mean']:.3f}, {sr['mean']:.3f} "
          f"| {rk['sent']} ({rk['failed']}), {rr['sent']} ({rr['failed']}) "
          f"/ {sk['sent']} ({sk['failed']}), {sr['sent']} ({sr['failed']}) "
          f"| {spread_range(sk, sr, others)} |")

# kvmesh request by request: the same requests enter at the same nodes on both sides.
print()
print("| workload | run | served by the same engine | engines' requests real / sim "
      "| reasons real / sim | mean TTFT ms by reason real / sim "
      "| TTFT real − sim, median ms: kvmesh (same engine) / RR |")
print("|---|---:|---:|---|---|---|---:|")
def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")
for i in range(0, len(args), ROW):
    w, run, runs, _, sim_records, _ = args[i:i + ROW]
    real = {r["index"]: r for r in lines(f"{runs}/{w}-kvmesh.records.jsonl")}
    sim = {r["index"]: r for r in lines(f"{sim_records}-kvmesh.records.jsonl")}
    both = [k for k in real if k in sim and real[k]["node"] and sim[k]["node"]]
    same = sum(real[k]["node"] == sim[k]["node"] for k in both)
    gap = median([1e3 * (real[k]["ttft_s"] - sim[k]["ttft_s"]) for k in both
                  if real[k]["node"] == sim[k]["node"] and real[k]["ttft_s"] is not None])
    real_rr = {r["index"]: r for r in lines(f"{runs}/{w}-round-robin.records.jsonl")}
    sim_rr = {r["index"]: r for r in lines(f"{sim_records}-round-robin.records.jsonl")}
    gap_rr = median([1e3 * (real_rr[k]["ttft_s"] - sim_rr[k]["ttft_s"]) for k in real_rr
                     if k in sim_rr and real_rr[k]["ttft_s"] is not None
                     and sim_rr[k]["ttft_s"] is not None])
    def count(records, key):
        out = {}
        for r in records.values():
            if r.get(key):
                out[r[key]] = out.get(r[key], 0) + 1
        return out
    def ttft_by_reason(records):
        sums = {}
        for r in records.values():
            if r.get("reason") and r.get("ttft_s") is not None:
                s = sums.setdefault(r["reason"], [0.0, 0])
                s[0] += r["ttft_s"]
                s[1] += 1
        return {k: 1e3 * v[0] / v[1] for k, v in sums.items()}
    nodes = sorted(set(count(real, "node")) | set(count(sim, "node")))
    per_node = ", ".join(f"{n} {count(real, 'node').get(n, 0)}/{count(sim, 'node').get(n, 0)}" for n in nodes)
    reasons = sorted(set(count(real, "reason")) | set(count(sim, "reason")))
    per_reason = ", ".join(f"{k} {count(real, 'reason').get(k, 0)}/{count(sim, 'reason').get(k, 0)}" for k in reasons)
    tr, ts = ttft_by_reason(real), ttft_by_reason(sim)
    ttft = ", ".join(f"{k} {tr.get(k, 0):.0f}/{ts.get(k, 0):.0f}" for k in reasons)
    print(f"| {w} | {run} | {same} of {len(both)} ({100 * same / max(len(both), 1):.0f}%) "
          f"| {per_node} | {per_reason} | {ttft} | {gap:.1f} / {gap_rr:.1f} |")
PY
log "done in $(($(date +%s) - T0)) s; reports, the simulator's flags and JSON in $OUT"
cat "$OUT/table.md"
