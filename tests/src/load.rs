//! Running the real load generator (`kvmesh-sim load`) and reading its JSON report
//! (`kvmesh-sim.load.v1`).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::binaries::KVMESH_SIM;
use crate::cluster::Node;
use crate::process::run_to_completion;

/// A list of URLs as the load generator's `--targets` and `--engines` take it.
pub fn url_list(urls: impl IntoIterator<Item = String>) -> String {
    urls.into_iter().collect::<Vec<_>>().join(",")
}

/// The client URLs of the sidecars of `nodes`, as `--targets`.
pub fn sidecar_urls(nodes: &[Node]) -> String {
    url_list(
        nodes
            .iter()
            .map(|node| format!("http://{}", node.sidecar.http_addr())),
    )
}

/// The URLs of the engines of `nodes`, as `--engines` (or round-robin's `--targets`).
pub fn engine_urls(nodes: &[Node]) -> String {
    url_list(nodes.iter().map(|node| node.engine.url()))
}

/// Runs `kvmesh-sim load --targets TARGETS --pick PICK --engines ENGINES --json OUT ARGS…` to
/// completion within `timeout`, prints its table and returns its JSON report. Panics (with the
/// generator's output) if it fails.
pub fn run_load(
    targets: &str,
    pick: &str,
    engines: &str,
    out: &Path,
    args: &[&str],
    timeout: Duration,
) -> Value {
    let mut command = Command::new(KVMESH_SIM.path());
    command.env("NO_COLOR", "1").args([
        "load",
        "--targets",
        targets,
        "--pick",
        pick,
        "--engines",
        engines,
    ]);
    command.arg("--json").arg(out).args(args);
    let finished = run_to_completion(command, timeout);
    assert!(
        finished.status.success(),
        "kvmesh-sim load failed:\n{}\n{}",
        finished.stdout,
        finished.stderr
    );
    println!("{}", finished.stdout);
    serde_json::from_slice(&std::fs::read(out).expect("load report")).expect("report JSON")
}

/// The number at `pointer` (JSON pointer) in a load report; panics if there is none.
pub fn number(report: &Value, pointer: &str) -> f64 {
    report
        .pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no number at {pointer} in the load report"))
}
