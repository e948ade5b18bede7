//! External tools some end-to-end tests need besides the workspace binaries: `kubectl` (to
//! render the Kubernetes manifests), `promtool` (to check `/metrics`), `chromium` (to run
//! `/dashboard`'s script), `playwright` (playwright-core, to watch an open page), `nft` (network
//! faults) and `vllm-router` (the PD protocol against vLLM's own router).
//!
//! `scripts/test.sh` installs them and fails when it cannot, unless a local run asks to skip
//! with `KVMESH_ALLOW_SKIP=1`: then it names the missing ones in `KVMESH_TESTS_SKIP_TOOLS`, and
//! the tests that need them skip with a message. Anywhere else a missing tool fails the test
//! with a hint, so that a check is never dropped unseen.

/// Whether the caller must skip for lack of `tool`; says so on stderr when it must.
pub fn skipped_for_lack_of(tool: &str) -> bool {
    let skip = std::env::var("KVMESH_TESTS_SKIP_TOOLS").unwrap_or_default();
    let skipped = skip.split([' ', ',']).any(|listed| listed == tool);
    if skipped {
        eprintln!("SKIPPED: this test needs {tool}, which scripts/test.sh could not install");
    }
    skipped
}
