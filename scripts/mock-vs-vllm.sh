#!/usr/bin/env bash
# The mock engine checked against real vLLM (issue 45 §3): the same requests, token for token
# (the load generator replays a workload from a seed), sent round-robin to N real vLLM CPU
# servers (scripts/lib/vllm.sh, one pinned core each) and then to N mock engines
# (`kvmesh-sim engine --engine-profile cpu-tiny`, the profile fitted to those servers by
# scripts/lib/fit-engine-profile.py), each with the same KV capacity and block size; with
# --kvmesh, then again through a kvmesh sidecar beside each engine (requests enter at random
# sidecars, as in scripts/demo.sh; the engines' caches reset first). Then one table, a row per
# workload and routing:
#
#   workload | routing | engines | vLLM stretch | mock time scale | requests | TTFT mean, p50,
#   p99 real / mock and Δ % | per request: median of mock/real TTFT | hit rate real / mock and
#   Δ points
#
# "vLLM stretch" is (CPU time + time runnable but waiting for a core) / CPU time of the real
# servers' processes over the round-robin run (/proc/PID/schedstat): 1.0 on an idle core.
#
# The hit rates are the engines' own counters (vllm:prefix_cache_hits_total / _queries_total,
# which the mock exposes under the same names) over the run. Issue 45's targets: TTFT within
# 15%, hit rate within 3 points, on workloads that were not used to fit the profile.
#
# Usage: scripts/mock-vs-vllm.sh [--workload gsp,rag-pressure] [--engines 1] [--cores 1]
#            [--port 18200] [--out DIR] [--bin-dir DIR] [--workload-seed 7] [--mock-only]
#            [--real-only] [--time-scale 1] [--calibrate] [--kvmesh]
#   --engines N      servers of each kind (default 1; at most one real server per core)
#   --cores C,...    the cores the real servers are pinned to, one each (default: 1, or 0,1)
#   --port P         first port (real servers P, P+1, ...; mock engines P+10, ...)
#   --out DIR        where the reports and table.md go (default: a kept temporary directory)
#   --mock-only      run the mock engines only, against the real runs already in --out
#   --real-only      run the real servers only
#   --time-scale S   the mock's --time-scale (1 = the profile as fitted)
#   --calibrate      probe the real server's speed right before each real run
#                    (fit-engine-profile.py --probe: a few prefill and decode points, none of
#                    them the workload's) and run the mock at that --time-scale: the shared
#                    cores' speed drifts by 2x over minutes with the other servers' load
#   --kvmesh         also route through kvmesh sidecars (needs the kvmesh binary)
# Needs python3. vLLM starts in ~40 s per workload (a fresh server: an empty cache).
# Every process it starts is in a process group of its own, killed on exit, error or Ctrl-C.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

WORKLOADS=gsp,rag-pressure; ENGINES=1; CORES=; PORT=18200; OUT=; BIN_DIR=; SEED=7
MOCK=1; REAL=1; TIME_SCALE=1; CALIBRATE=0; KVMESH_TOO=0
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
        --calibrate) CALIBRATE=1; shift ;;
        --kvmesh) KVMESH_TOO=1; shift ;;
        -h | --help) sed -n '2,/^set -euo/{/^set/!p}' "$0"; exit 0 ;;
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
    (cd "$ROOT" && cargo build --release -p kvmesh-sim -p kvmesh-node --bins)
    BIN_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/release"
fi
SIM="$(cd "$BIN_DIR" && pwd)/kvmesh-sim"
KVMESH="$(cd "$BIN_DIR" && pwd)/kvmesh"
[[ -x $SIM ]] || { echo "no kvmesh-sim in $BIN_DIR" >&2; exit 1; }
[[ $KVMESH_TOO == 0 || -x $KVMESH ]] || { echo "--kvmesh: no kvmesh in $BIN_DIR" >&2; exit 1; }
[[ $REAL == 1 || -n $OUT ]] || { echo "--mock-only needs --out (the real runs)" >&2; exit 2; }
[[ -n $OUT ]] || OUT=$(mktemp -d "${TMPDIR:-/tmp}/kvmesh-mock-vs-vllm.XXXXXX")
mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
WORK=$OUT
# shellcheck source=lib/processes.sh
source "$ROOT/scripts/lib/processes.sh"
# shellcheck source=lib/vllm.sh
source "$ROOT/scripts/lib/vllm.sh"
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

# run_load W KIND PICK ENGINES TARGET...: the workload against the targets (the engines' URLs,
# or their sidecars'), hit rates from ENGINES (comma-separated); JSON in $OUT/W-KIND.json.
run_load() {
    local w=$1 kind=$2 pick=$3 engines=$4
    shift 4
    local targets
    targets=$(IFS=,; echo "$*")
    printf '%s\n' "${LOAD_ARGS[@]}" >"$OUT/$w.load-args"
    "$SIM" load --targets "$targets" --pick "$pick" --engines "$engines" "${LOAD_ARGS[@]}" \
        --json "$OUT/$w-$kind.json" --records "$OUT/$w-$kind.records.jsonl" \
        >"$OUT/logs/$w-$kind-load.log" 2>&1 ||
        { tail -n 20 "$OUT/logs/$w-$kind-load.log" >&2; die "the load generator failed on $w / $kind"; }
    grep -E '^(requests:|TTFT|cluster prefix-cache hit rate:)' "$OUT/logs/$w-$kind-load.log" |
        sed 's/^/    /' >&2 || true
}

# Certificates for the sidecars (made once).
make_certs() {
    [[ -s $OUT/tls/.done ]] && return 0
    "$KVMESH" cert init --dir "$OUT/tls" >/dev/null
    local i
    for ((i = 1; i <= ENGINES; i++)); do
        "$KVMESH" cert issue --dir "$OUT/tls" --node "node-$i" >/dev/null
    done
    echo done >"$OUT/tls/.done"
}

# Waits until $1 (a log) has a line matching $2, up to $3 s, while pid $4 lives; prints it.
wait_line() {
    local deadline=$(($(date +%s) + $3)) line
    while :; do
        line=$(grep -m1 -E "$2" "$1" 2>/dev/null || true)
        [[ -n $line ]] && { printf '%s\n' "$line"; return 0; }
        kill -0 "$4" 2>/dev/null && (($(date +%s) < deadline)) || return 1
        sleep 0.2
    done
}

# through_kvmesh W KIND ENGINE_URL...: resets the real engines' caches (the mock's are fresh:
# it has no /reset_prefix_cache, so run_mock restarts it), starts a sidecar beside
# each (the first is the others' seed), lets the mesh see every node, runs the workload into
# random sidecars, and stops them.
through_kvmesh() {
    local w=$1 kind=$2
    shift 2
    local engines=("$@") urls=() pids=() seed= i line
    if [[ $kind == real ]]; then
        for url in "${engines[@]}"; do
            vllm_reset "$url" || die "cannot reset the cache of $url"
        done
    fi
    make_certs
    for ((i = 1; i <= ENGINES; i++)); do
        local args=(serve --backend "${engines[i - 1]}" --listen 127.0.0.1:0 --mesh 127.0.0.1:0
            --node-id "node-$i" --tls-dir "$OUT/tls")
        [[ -n $seed ]] && args+=(--seeds "$seed")
        spawn "$w-$kind-node-$i" "$KVMESH" "${args[@]}"
        pids+=("$SPAWNED_PID")
        line=$(wait_line "$OUT/logs/$w-$kind-node-$i.log" 'kvmesh listening on http://' 30 "$SPAWNED_PID") ||
            die "sidecar node-$i did not start (log: $OUT/logs/$w-$kind-node-$i.log)"
        urls+=("http://$(sed -E 's/.*listening on http:\/\/([^ ]+).*/\1/' <<<"$line")")
        [[ -n $seed ]] || seed=$(sed -E 's/.* mesh ([^ ]+).*/\1/' <<<"$line")
    done
    # Every sidecar sees the others (gossip), then a few digests go round.
    local deadline=$(($(date +%s) + 30)) n
    for url in "${urls[@]}"; do
        while :; do
            n=$({ curl -sf "$url/debug/cluster" || true; } | grep -o '"age_ms"' | wc -l || true)
            ((n >= ENGINES - 1)) && break
            (($(date +%s) < deadline)) || die "the mesh did not converge within 30 s"
            sleep 0.2
        done
    done
    sleep 2
    log "[$w] $kind engines through kvmesh: the same requests into random sidecars"
    run_load "$w" "$kind-kvmesh" random "$(IFS=,; echo "${engines[*]}")" "${urls[@]}"
    kill_groups "${pids[@]}"
}

# The CPU time the processes of the groups $@ ran and waited runnable (ns, "RUN WAIT"):
# /proc/PID/schedstat. Over a run, (run + wait) / run is how much the other load on the core
# stretched the server's work: the machine is shared, and this says how much it was.
sched_ns() {
    local pid run=0 wait=0 a b
    for pid in $(for g in "$@"; do pgrep -g "$g"; done); do
        read -r a b _ <"/proc/$pid/schedstat" 2>/dev/null || continue
        run=$((run + a)) wait=$((wait + b))
    done
    echo "$run $wait"
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
    if [[ $CALIBRATE == 1 ]]; then
        python3 "$ROOT/scripts/lib/fit-engine-profile.py" "${urls[0]}" \
            --probe "$ROOT/docs/engine-model-fit.json" >"$OUT/$w.scale" 2>"$OUT/logs/$w-probe.log" ||
            die "the speed probe failed (log: $OUT/logs/$w-probe.log)"
        for url in "${urls[@]}"; do vllm_reset "$url" || die "cannot reset the cache of $url"; done
        log "[$w] the server runs at $(cat "$OUT/$w.scale")x the fitted profile's times now"
    fi
    log "[$w] real vLLM x$ENGINES (cores ${CORES}): kvmesh-sim load ${LOAD_ARGS[*]}"
    local before after
    before=$(sched_ns "${pids[@]}")
    run_load "$w" real round-robin "$(IFS=,; echo "${urls[*]}")" "${urls[@]}"
    after=$(sched_ns "${pids[@]}")
    read -r b_run b_wait <<<"$before"
    read -r a_run a_wait <<<"$after"
    awk -v r=$((a_run - b_run)) -v w=$((a_wait - b_wait)) 'BEGIN { printf "%.2f\n", (r + w) / (r > 0 ? r : 1) }' \
        >"$OUT/$w.real-stretch"
    log "[$w] vLLM ran $(((a_run - b_run) / 1000000)) ms of CPU and waited $(((a_wait - b_wait) / 1000000)) ms for a core: stretch $(cat "$OUT/$w.real-stretch")"
    [[ $KVMESH_TOO == 1 ]] && through_kvmesh "$w" real "${urls[@]}"
    kill_groups "${pids[@]}"
}

# start_mocks W: N fresh mock engines; sets MOCK_URLS and MOCK_PIDS.
start_mocks() {
    local w=$1 i
    MOCK_URLS=() MOCK_PIDS=()
    for ((i = 0; i < ENGINES; i++)); do
        local port=$((PORT + 10 + i))
        # Not pinned: the mock's steps are timers, which a core shared with busy servers
        # would fire late (a 1.3 s stall in one run pinned to core 1).
        spawn "$w-mock-$i" "$SIM" engine --port "$port" \
            --engine-profile cpu-tiny --block-size 32 --kv-blocks "$BLOCKS" --model tiny \
            --max-model-len 8192 --time-scale "$MOCK_SCALE" --engine-index "$i"
        MOCK_PIDS+=("$SPAWNED_PID")
        MOCK_URLS+=("http://127.0.0.1:$port")
    done
    for url in "${MOCK_URLS[@]}"; do
        wait_ready "$url" 30 || die "the mock engine at $url did not start"
    done
}

run_mock() {
    local w=$1
    MOCK_SCALE=$TIME_SCALE
    if [[ $CALIBRATE == 1 ]]; then
        [[ -s $OUT/$w.scale ]] || die "--calibrate: no probe of the real run in $OUT/$w.scale"
        MOCK_SCALE=$(cat "$OUT/$w.scale")
    fi
    echo "$MOCK_SCALE" >"$OUT/$w.mock-time-scale"
    start_mocks "$w"
    log "[$w] mock engines x$ENGINES (--engine-profile cpu-tiny --time-scale $MOCK_SCALE): the same requests"
    run_load "$w" mock round-robin "$(IFS=,; echo "${MOCK_URLS[*]}")" "${MOCK_URLS[@]}"
    kill_groups "${MOCK_PIDS[@]}"
    if [[ $KVMESH_TOO == 1 ]]; then
        start_mocks "$w"
        through_kvmesh "$w" mock "${MOCK_URLS[@]}"
        kill_groups "${MOCK_PIDS[@]}"
    fi
}

for w in "${WORKLOAD_LIST[@]}"; do
    configure "$w"
    [[ $REAL == 1 ]] && run_real "$w"
    [[ $MOCK == 1 ]] && run_mock "$w"
done

python3 - "$OUT" "$ENGINES" "${WORKLOAD_LIST[@]}" >"$OUT/table.md" <<'EOF'
import json, os, sys
out, engines, workloads = sys.argv[1], sys.argv[2], sys.argv[3:]
print("| workload | routing | engines | vLLM stretch | mock time scale | requests real / mock "
      "| TTFT mean real / mock (ms) | Δ | TTFT p50 real / mock (ms) | Δ "
      "| TTFT p99 real / mock (ms) | Δ | per request: median mock/real | hit rate real / mock "
      "| Δ points |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for w in workloads:
    for routing, suffix in (("round-robin", ""), ("kvmesh", "-kvmesh")):
        real_f, mock_f = f"{out}/{w}-real{suffix}.json", f"{out}/{w}-mock{suffix}.json"
        if suffix and not (os.path.exists(real_f) or os.path.exists(mock_f)):
            continue
        try:
            real, mock = json.load(open(real_f)), json.load(open(mock_f))
            scale = open(f"{out}/{w}.mock-time-scale").read().strip()
            stretch = "-"
            if not suffix and os.path.exists(f"{out}/{w}.real-stretch"):
                stretch = open(f"{out}/{w}.real-stretch").read().strip()
        except FileNotFoundError as e:
            print(f"| {w} | {routing} | {engines} | missing: {e.filename} |" + " |" * 11)
            continue
        row = [w, routing, engines, stretch, scale,
               f"{real['requests']['ok']} / {mock['requests']['ok']}"]
        for q in ("mean", "p50", "p99"):
            r, m = real["ttft_s"][q] * 1e3, mock["ttft_s"][q] * 1e3
            row += [f"{r:.0f} / {m:.0f}", f"{(m - r) / r * 100:+.1f}%"]
        # The same request (by index) on both: the median of its TTFT ratio, which a stall of
        # either engine's host moves little.
        def ttfts(f):
            recs = (json.loads(line) for line in open(f))
            return {r["index"]: r["ttft_s"] for r in recs if r.get("ttft_s")}
        rt = ttfts(f"{out}/{w}-real{suffix}.records.jsonl")
        mt = ttfts(f"{out}/{w}-mock{suffix}.records.jsonl")
        ratios = sorted(mt[i] / rt[i] for i in rt.keys() & mt.keys())
        row.append(f"{ratios[len(ratios) // 2]:.2f}" if ratios else "-")
        rh, mh = real["cluster"]["hit_rate"] * 100, mock["cluster"]["hit_rate"] * 100
        row += [f"{rh:.1f}% / {mh:.1f}%", f"{mh - rh:+.1f}"]
        print("| " + " | ".join(row) + " |")
EOF
cat "$OUT/table.md"
log "reports in $OUT"
