//! `/dashboard` in a real browser (headless Chromium, which runs the page's script): the page
//! of a running 3-node mesh lists every node, recent requests and decisions, and an open page,
//! never reloaded, drops a node once it is killed.
//!
//! Needs `chromium` (Debian's package) and, for the open page, `playwright-core` (npm, in
//! `target/deploy-tools/browser`): see [`kvmesh_tests::tools`]; scripts/test.sh installs both.

use std::process::Command;
use std::time::Duration;

use kvmesh_tests::binaries::workspace_root;
use kvmesh_tests::process::{ManagedProcess, Pipe};
use kvmesh_tests::tools::skipped_for_lack_of;
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Call, Cluster, NodeSpec, Sidecar, call, wait_for};

/// The page's DOM after its script ran for a few (virtual) seconds.
fn rendered(sidecar: &Sidecar) -> Result<String, String> {
    let output = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox", // tests may run as root, where Chromium refuses its sandbox
            "--disable-gpu",
            "--virtual-time-budget=3000",
            "--dump-dom",
        ])
        .arg(format!("http://{}/dashboard", sidecar.http_addr()))
        .output()
        .map_err(|e| format!("cannot run chromium: {e}"))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The nodes the page lists, in its order.
fn listed_nodes(dom: &str) -> Vec<String> {
    dom.split("data-node=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next().map(str::to_owned))
        .collect()
}

#[test]
fn the_dashboard_lists_the_mesh_and_follows_a_node_dying() {
    if skipped_for_lack_of("chromium") {
        return;
    }
    let mut cluster = Cluster::start(&[
        NodeSpec::new("a", &["m"]),
        NodeSpec::new("b", &["m"]),
        NodeSpec::new("c", &["m"]),
    ]);
    cluster.wait_membership(&["a", "b", "c"], CONVERGENCE_TIMEOUT);
    for round in 0..3 {
        call(
            cluster.sidecar("a"),
            Call::Completion,
            "m",
            &format!("p{round}"),
        );
    }

    let (dom, _) = wait_for(CONVERGENCE_TIMEOUT, "the page lists a, b and c", || {
        let dom = rendered(cluster.sidecar("a"))?;
        if listed_nodes(&dom) == ["a", "b", "c"] {
            Ok(dom)
        } else {
            Err(format!("listed {:?}", listed_nodes(&dom)))
        }
    });
    assert!(dom.contains("a (this node)"), "{dom}");
    assert!(dom.contains(">healthy<"), "{dom}");
    // Recent requests and the decisions they made are on the page.
    let recent = dom
        .split("<tbody id=\"recent\">")
        .nth(1)
        .and_then(|rest| rest.split("</tbody>").next())
        .unwrap_or_default();
    assert_eq!(
        recent.matches("<tr>").count(),
        3,
        "the recent requests: {recent}"
    );
    assert!(dom.contains("peers alive"), "no gossip health in {dom}");
    assert!(
        dom.contains("<span id=\"error\"></span>"),
        "the page shows an error: {dom}"
    );

    // One page, never reloaded, while c dies: the page must update itself.
    if skipped_for_lack_of("playwright") {
        return;
    }
    let mut watcher = watch_dashboard(cluster.sidecar("a"));
    cluster.node_mut("c").sidecar.kill9();
    wait_for(
        CONVERGENCE_TIMEOUT + Duration::from_secs(10),
        "the open page drops c",
        || {
            let lines = watcher.output_lines(Pipe::Stdout);
            if lines.iter().any(|line| line == "nodes a,b") {
                Ok(())
            } else {
                Err(format!("the page listed {lines:?}"))
            }
        },
    );
    // Closing the browser is the script's job on SIGTERM: no Chromium is left behind.
    watcher.sigterm();
    assert!(
        watcher.wait_exit(Duration::from_secs(10)).is_some(),
        "the watcher did not stop"
    );
}

/// tests/browser/watch-dashboard.cjs on `sidecar`'s dashboard, once it lists a, b and c.
fn watch_dashboard(sidecar: &Sidecar) -> ManagedProcess {
    let root = workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .map(|dir| {
            if dir.is_absolute() {
                dir
            } else {
                root.join(dir)
            }
        })
        .unwrap_or_else(|| root.join("target"));
    let mut command = Command::new("node");
    command
        .env(
            "NODE_PATH",
            target.join("deploy-tools/browser/node_modules"),
        )
        .arg(root.join("tests/browser/watch-dashboard.cjs"))
        .arg(format!("http://{}/dashboard", sidecar.http_addr()));
    let (watcher, _) = ManagedProcess::start(
        "dashboard watcher",
        command,
        "nodes a,b,c",
        CONVERGENCE_TIMEOUT,
    );
    watcher
}
