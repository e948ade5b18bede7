//! What operators scrape: the sidecar's `/metrics` passes `promtool check metrics` with no
//! lint in the format promtool reads, and is OpenMetrics for a scraper that asks for it.
//!
//! Needs `promtool` (Debian's `prometheus` package; scripts/test.sh installs it).

use std::io::Write;
use std::process::{Command, Stdio};

use kvmesh_tests::{CONVERGENCE_TIMEOUT, Call, Cluster, NodeSpec, Request, call};

/// Runs `promtool ARGS` with `input` on stdin; its exit status and everything it printed.
fn promtool(args: &[&str], input: &[u8]) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): install Debian's `prometheus` package (scripts/test.sh does)")
        });
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input)
        .expect("write to promtool");
    let output = child.wait_with_output().expect("promtool");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), printed)
}

/// A two-node mesh that has served requests both locally and across the mesh, so that the
/// labelled families (requests by reason and outcome, latency by target) have samples.
fn busy_mesh() -> Cluster {
    let cluster = Cluster::start(&[NodeSpec::new("a", &["m"]), NodeSpec::new("b", &["m"])]);
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);
    for round in 0..4 {
        for entry in ["a", "b"] {
            for kind in Call::ALL {
                call(
                    cluster.sidecar(entry),
                    kind,
                    "m",
                    &format!("prompt {round}"),
                );
            }
        }
    }
    cluster
}

#[test]
fn metrics_pass_promtool_without_lint_and_openmetrics_is_served_when_asked() {
    let cluster = busy_mesh();
    for node in ["a", "b"] {
        let sidecar = cluster.sidecar(node);
        // What curl and promtool get: the Prometheus text format.
        let text = sidecar.get("/metrics");
        assert_eq!(text.status, 200);
        assert_eq!(
            text.header("content-type"),
            Some("text/plain; version=0.0.4; charset=utf-8")
        );
        let (ok, printed) = promtool(&["check", "metrics"], &text.body);
        assert!(
            ok && printed.trim().is_empty(),
            "{node}: promtool check metrics: {printed}\n{}",
            text.text()
        );
        assert!(
            !text.text().contains("-0.0"),
            "{node}: a negative zero: {}",
            text.text()
        );

        // What Prometheus asks for first.
        let accept = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;q=0.3";
        let openmetrics = sidecar.send(Request::get("/metrics").header("accept", accept));
        assert_eq!(
            openmetrics.header("content-type"),
            Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
        );
        let body = openmetrics.text();
        assert!(body.ends_with("# EOF\n"), "{node}: {body}");
        assert!(
            body.contains("# TYPE kvmesh_requests counter\n"),
            "{node}: {body}"
        );
    }
}
