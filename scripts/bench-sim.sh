#!/usr/bin/env bash
# Benchmarks of `kvmesh-sim simulate` (issue 7). Writes markdown, JSON and SVG plots to
# ${OUT:-target/bench-sim}/ and prints the headline tables.
#
#   scripts/bench-sim.sh            # all: quality, scale, sweep
#   scripts/bench-sim.sh quality    # Mooncake trace, 16 nodes, every policy
#   scripts/bench-sim.sh scale      # 1,000 nodes x 200,000 requests (kvmesh), time and memory
#   scripts/bench-sim.sh sweep      # gossip bytes and hit rate against N, up to 10,000 nodes
#   scripts/bench-sim.sh matrix     # kvmesh against least-loaded and the oracle: every
#                                   # workload and both shared traces, 8,192 and 32,768 KV
#                                   # blocks, 16 nodes (issue 14's table); FORM=cost for the
#                                   # cost form
#   scripts/bench-sim.sh large      # gsp at 512 and 1,024 nodes, kvmesh against the oracle
#   scripts/bench-sim.sh pd         # prefill/decode disaggregation (issue 15): 16 nodes, both
#                                   # shared traces, mixed engines against PD (fixed split and
#                                   # skip rule), decode chosen at prefill end or at arrival
#
# Uses a release build; the simulator is single-threaded per policy except for the engines of
# gossiping policies (--threads, default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-target/bench-sim}
mkdir -p "$OUT"
cargo build --release -q -p kvmesh-sim
SIM=target/release/kvmesh-sim
TRACE=sim/data/mooncake_synthetic_trace.jsonl
TRACES=${TRACES:-../shared/data/traces}
FORM=${FORM:-score}
what=${1:-all}

machine() {
  echo "# $(date -u +%FT%TZ) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
}

if [[ $what == all || $what == quality ]]; then
  machine
  # Mooncake's conversation-trace comparison: 16 nodes, every policy, the cost form of
  # decide (queue wait + uncached prefill), engines with 32,768 KV blocks (512k tokens).
  "$SIM" simulate --nodes 16 --trace "$TRACE" --kv-blocks 32768 --route-form cost \
    --jobs 2 --json "$OUT/mooncake16.json" --svg-dir "$OUT/mooncake16" | tee "$OUT/mooncake16.md"
  # The same trace twice as fast (heavier load).
  "$SIM" simulate --nodes 16 --trace "$TRACE" --kv-blocks 32768 --route-form cost \
    --trace-speedup 2 --jobs 2 --json "$OUT/mooncake16x2.json" | tee "$OUT/mooncake16x2.md"
fi

if [[ $what == all || $what == scale ]]; then
  machine
  /usr/bin/time -f "wall %e s, user %U s, max RSS %M KB" \
    "$SIM" simulate --nodes 1000 --requests 200000 --policy kvmesh \
    --json "$OUT/scale1000.json" | tee "$OUT/scale1000.md"
fi

if [[ $what == all || $what == sweep ]]; then
  machine
  # Rate per node fixed (1 req/s), small KV caches so that 10,000 engines fit in memory;
  # kvmesh against the zoned design (zones of 64). First the steady state at 64 nodes (200 s
  # of traffic: per-publisher gossip rates do not depend on N at a fixed rate per node), then
  # short runs (5 requests per node) up to 10,000 nodes.
  "$SIM" simulate --nodes 64 --requests-per-node 200 --rate-per-node 1 --kv-blocks 2048 \
    --gsp-groups 256 --gsp-output-len 64 --policy kvmesh,kvmesh-zoned --zone-size 16 \
    --lag-classes 4 --json "$OUT/steady64.json" | tee "$OUT/steady64.md"
  /usr/bin/time -f "wall %e s, user %U s, max RSS %M KB" \
    "$SIM" simulate --sweep-nodes 8,64,512,1024,4096,10000 --requests-per-node 5 \
    --rate-per-node 1 --kv-blocks 2048 --gsp-groups 256 --gsp-output-len 64 \
    --policy kvmesh,kvmesh-zoned --zone-size 64 --lag-classes 4 \
    --json "$OUT/sweep.json" --svg-dir "$OUT/sweep" | tee "$OUT/sweep.md"
fi

if [[ $what == all || $what == matrix ]]; then
  machine
  # One row per (workload, KV blocks): mean and p99 TTFT of kvmesh over least-loaded's and the
  # oracle's, measured in the same invocation (same seed, same requests).
  echo "| workload | KV blocks | kvmesh mean / least-loaded | / oracle | kvmesh p99 / least-loaded | kvmesh hit rate | declines |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  for kv in 8192 32768; do
    for w in gsp chat rag hot mooncake azure; do
      case $w in
        mooncake) source=(--trace "$TRACES/mooncake_synthetic_trace.jsonl") ;;
        azure) source=(--trace "$TRACES/azure_llm_2023_conv.csv") ;;
        *) source=(--workload "$w") ;;
      esac
      json="$OUT/matrix-$w-$kv-$FORM.json"
      "$SIM" simulate --nodes 16 "${source[@]}" --kv-blocks "$kv" --route-form "$FORM" \
        --policy least-loaded,oracle,kvmesh --jobs 2 --threads 1 --json "$json" > /dev/null
      python3 - "$json" "$w" "$kv" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
by = {r["policy"]: r for r in report["runs"][0]["results"]}
k, ll, o = by["kvmesh"], by["least-loaded"], by["oracle"]
ratio = lambda a, b: a / b if b else float("nan")
print(f"| {sys.argv[2]} | {sys.argv[3]} | {ratio(k['ttft_s']['mean'], ll['ttft_s']['mean']):.3f} "
      f"| {ratio(k['ttft_s']['mean'], o['ttft_s']['mean']):.3f} "
      f"| {ratio(k['ttft_s']['p99'], ll['ttft_s']['p99']):.3f} | {k['hit_rate']*100:.1f}% | {k['declines']} |")
PY
    done
  done
fi

if [[ $what == all || $what == large ]]; then
  machine
  for n in 512 1024; do
    /usr/bin/time -f "wall %e s, user %U s, max RSS %M KB" \
      "$SIM" simulate --nodes "$n" --workload gsp --requests-per-node 20 --rate-per-node 1 \
      --kv-blocks 8192 --route-form "$FORM" --policy oracle,kvmesh --jobs 2 --lag-classes 4 \
      --json "$OUT/large$n-$FORM.json" | tee "$OUT/large$n-$FORM.md"
  done
fi

if [[ $what == pd ]]; then
  machine
  # Per trace: its load (trace speed-up), KV blocks, prefill engines (of 16; the best of 4, 6,
  # 8 and 10 in a sweep of the skip rule, BENCHMARKS.md#pd-simulator) and its objectives: a chat
  # trace of ~1.2k-token prompts (TTFT <= 1 s), a long-context one of ~15k-token prompts (TTFT
  # <= 5 s); both ITL <= 50 ms (mean gap per request). kvmesh runs mixed and four PD variants; the
  # central routers split every request: power-of-two with both engines chosen at arrival
  # (vllm-router's --decode-policy power_of_two), round-robin with the decode engine chosen at
  # prefill end (vLLM's toy proxy), least-loaded both ways.
  echo "| trace | policy | engines | split | decode chosen | TTFT mean s | p50 | p99 | ITL p50 ms | ITL p99 ms | E2E mean s | goodput req/s | met | goodput, ITL ≤ 20 ms | prompt tokens computed | pd / skip-short / skip-busy | pulls (handshake waits) | mean pull s |"
  echo "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"
  for trace in azure mooncake; do
    case $trace in
      azure) source=(--trace "$TRACES/azure_llm_2023_conv.csv" --trace-speedup 8)
        prefill=${AZURE_PREFILL:-8}; slo=(--slo-ttft-ms 1000 --slo-itl-ms 50) ;;
      mooncake) source=(--trace "$TRACES/mooncake_synthetic_trace.jsonl" --trace-speedup 2
        --kv-blocks 32768)
        prefill=${MOONCAKE_PREFILL:-10}; slo=(--slo-ttft-ms 5000 --slo-itl-ms 50) ;;
    esac
    for setup in kvmesh:mixed least-loaded:mixed kvmesh:fixed:prefill-end kvmesh:skip:prefill-end \
        kvmesh:fixed:arrival kvmesh:skip:arrival power-of-two:fixed:arrival \
        round-robin:fixed:prefill-end least-loaded:fixed:arrival least-loaded:fixed:prefill-end; do
      IFS=: read -r policy split decode <<< "$setup"
      if [[ $split == mixed ]]; then
        pd=(--prefill-nodes 0); split=-; decode=-
      else
        [[ $split == fixed ]] && rule=always || rule=skip
        pd=(--prefill-nodes "$prefill" --pd-split "$rule" --pd-decode "$decode")
      fi
      json="$OUT/pd-$trace-${setup//:/-}.json"
      "$SIM" simulate --nodes 16 "${source[@]}" "${slo[@]}" "${pd[@]}" --policy "$policy" \
        --threads 1 --json "$json" > /dev/null
      python3 - "$json" "$trace" "$prefill" "$split" "$decode" <<'PY'
import json, sys
_, path, trace, prefill, split, decode = sys.argv
r = json.load(open(path))["runs"][0]["results"][0]
engines = "16 mixed" if split == "-" else f"{prefill} P + {16 - int(prefill)} D"
reasons = r["pd_reasons"]
pd = "-" if split == "-" else "/".join(
    str(reasons.get(k, 0)) for k in ("pd", "pd-skip-short", "pd-skip-busy"))
t = r["transfers"]
tight = next(rps for itl, rps in r["goodput_by_itl"] if abs(itl - 0.020) < 1e-9)
print(f"| {trace} | {r['policy']} | {engines} | {split} | {decode} | {r['ttft_s']['mean']:.3f} "
      f"| {r['ttft_s']['p50']:.3f} | {r['ttft_s']['p99']:.3f} | {r['itl_s']['p50']*1e3:.1f} "
      f"| {r['itl_s']['p99']*1e3:.1f} | {r['e2e_s']['mean']:.2f} | {r['goodput_rps']:.2f} "
      f"| {r['slo_attainment']*100:.1f}% | {tight:.2f} "
      f"| {r['computed_prompt_tokens']/1e6:.1f}M | {pd} | {t['pulls']} ({t['handshake_waits']}) | {t['mean_s']:.3f} |")
PY
    done
  done
fi
