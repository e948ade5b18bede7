//! `kvmesh status` against a running 3-node mesh: from any node, every node with its role,
//! models, engine health and load; a dead engine shows as unhealthy; bad input is a clear
//! error.

use std::process::{Command, Output};

use kvmesh_tests::binaries::KVMESH;
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Cluster, NodeSpec, Sidecar, wait_for};
use serde_json::Value;

const NODES: [&str; 3] = ["a", "b", "c"];

fn status(args: &[&str]) -> Output {
    let mut command = Command::new(KVMESH.path());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("KVMESH_") {
            command.env_remove(name);
        }
    }
    command
        .arg("status")
        .args(args)
        .output()
        .expect("kvmesh status")
}

fn url(sidecar: &Sidecar) -> String {
    format!("http://{}", sidecar.http_addr())
}

/// `kvmesh status --json` from `sidecar`, as rows.
fn rows(sidecar: &Sidecar) -> Result<Vec<Value>, String> {
    let output = status(&["--node", &url(sidecar), "--json"]);
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    let rows: Value = serde_json::from_slice(&output.stdout).map_err(|e| e.to_string())?;
    rows.as_array()
        .cloned()
        .ok_or_else(|| format!("not a list: {rows}"))
}

#[test]
fn status_lists_every_node_from_any_node() {
    let mut cluster = Cluster::start(&[
        NodeSpec::new("a", &["m"]),
        NodeSpec::new("b", &["m"]),
        NodeSpec::new("c", &["m"]),
    ]);
    cluster.wait_membership(&NODES, CONVERGENCE_TIMEOUT);

    for asked in NODES {
        let sidecar = cluster.sidecar(asked);
        let (rows, _) = wait_for(CONVERGENCE_TIMEOUT, "every node healthy", || {
            let rows = rows(sidecar)?;
            let healthy = rows.iter().filter(|r| r["engine"] == "healthy").count();
            if rows.len() == 3 && healthy == 3 {
                Ok(rows)
            } else {
                Err(format!("{rows:?}"))
            }
        });
        assert_eq!(rows[0]["node"], asked, "the asked node comes first");
        assert_eq!(rows[0]["asked"], true);
        assert!(rows[0]["digest_age_ms"].is_u64(), "{:?}", rows[0]);
        let mut names: Vec<&str> = rows.iter().map(|r| r["node"].as_str().unwrap()).collect();
        names.sort();
        assert_eq!(names, NODES);
        for row in &rows {
            assert_eq!(row["models"], serde_json::json!(["m"]), "{row}");
            assert_eq!(row["role"], "mixed", "{row}");
            assert_eq!(row["version"], env!("CARGO_PKG_VERSION"), "{row}");
            assert!(row["kv_capacity_blocks"].as_u64() > Some(0), "{row}");
            assert!(row["running"].is_u64() && row["waiting"].is_u64(), "{row}");
        }

        // The table: a header and one line per node, the asked one marked.
        let table = status(&["--node", &url(sidecar)]);
        assert!(table.status.success());
        let table = String::from_utf8(table.stdout).unwrap();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "{table}");
        assert!(lines[0].starts_with("NODE"), "{table}");
        assert!(lines[1].starts_with(&format!("{asked} *")), "{table}");
    }

    // What a node's engine caches shows up in every node's status, through its summary.
    for round in 0..4 {
        kvmesh_tests::call(
            cluster.sidecar("a"),
            kvmesh_tests::Call::Completion,
            "m",
            // Several 64-byte hash blocks (a shorter prompt has no full block to cache).
            &format!(
                "round {round}: {}",
                "a prompt that fills hash blocks ".repeat(10)
            ),
        );
    }
    for asked in NODES {
        wait_for(CONVERGENCE_TIMEOUT, "cached blocks seen", || {
            let rows = rows(cluster.sidecar(asked))?;
            let cached: Option<u64> = rows.iter().map(|r| r["cached_blocks"].as_u64()).sum();
            match cached {
                Some(total) if total > 0 => Ok(()),
                other => Err(format!("cached blocks {other:?} in {rows:?}")),
            }
        });
    }

    // c's engine dies: every node's status says so.
    cluster.node_mut("c").engine.kill9();
    for asked in NODES {
        wait_for(CONVERGENCE_TIMEOUT, "c's engine shown unhealthy", || {
            let rows = rows(cluster.sidecar(asked))?;
            match rows.iter().find(|r| r["node"] == "c") {
                Some(c) if c["engine"] == "unhealthy" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        });
    }
}

#[test]
fn status_explains_what_it_cannot_do() {
    let unreachable = status(&["--node", "http://127.0.0.1:9"]);
    assert!(!unreachable.status.success());
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    assert!(
        stderr.contains("http://127.0.0.1:9/debug/cluster"),
        "{stderr}"
    );

    let not_http = status(&["--node", "https://example.invalid"]);
    assert!(!not_http.status.success());
    let stderr = String::from_utf8_lossy(&not_http.stderr);
    assert!(stderr.contains("expected http://HOST:PORT"), "{stderr}");

    let cluster = Cluster::empty();
    let engine = kvmesh_tests::EngineConfig::new("engine g", &["m"]).start();
    let sidecar = kvmesh_tests::SidecarConfig::new("g", &engine.url(), cluster.ca())
        .api_key("secret")
        .start();
    let refused = status(&["--node", &url(&sidecar)]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("401") && stderr.contains("--api-key"),
        "{stderr}"
    );
    let allowed = status(&["--node", &url(&sidecar), "--api-key", "secret"]);
    assert!(allowed.status.success(), "{allowed:?}");
}
