//! `/ready` (the Kubernetes readiness probe) over real processes: ready once joined and its
//! engine healthy, not ready while it waits for a first peer, while its engine is down, or
//! while it drains; `/health` (the liveness probe) stays 200 through an engine failure.

use std::time::Duration;

use kvmesh_tests::{
    CONVERGENCE_TIMEOUT, Cluster, NodeSpec, Sidecar, holds_during, wait_for, wait_until,
};
use serde_json::Value;

/// The `/ready` answer, with its status; `Err` describes a transport failure.
fn ready(sidecar: &Sidecar) -> Result<(u16, Value), String> {
    let response = sidecar
        .try_send(kvmesh_tests::Request::get("/ready"))
        .map_err(|e| e.to_string())?;
    let body = serde_json::from_slice(&response.body)
        .map_err(|e| format!("{e}: {}", response.describe()))?;
    Ok((response.status, body))
}

/// Waits until `/ready` answers `status` with `reason` among its `not_ready` reasons (or, for
/// 200, with `joined` equal to `reason`).
fn wait_ready(sidecar: &Sidecar, status: u16, reason: &str) -> Value {
    let what = format!("{} /ready answers {status} ({reason})", sidecar.node_id());
    wait_for(CONVERGENCE_TIMEOUT, &what, || {
        let (got, body) = ready(sidecar)?;
        let matches = if status == 200 {
            body["ready"] == true && body["joined"] == reason
        } else {
            body["ready"] == false
                && body["not_ready"]
                    .as_array()
                    .is_some_and(|reasons| reasons.iter().any(|r| r == reason))
        };
        if got == status && matches {
            Ok(body)
        } else {
            Err(format!("{got} {body}"))
        }
    })
    .0
}

#[test]
fn ready_means_joined_with_a_healthy_engine_and_not_draining() {
    let mut cluster = Cluster::empty();
    // Alone by configuration: no seeds, ready as soon as its engine is.
    cluster.join(&NodeSpec::new("a", &["m"]));
    wait_ready(cluster.sidecar("a"), 200, "no-seeds");

    // Seeded with a: ready because it sees a (a join wait far longer than the test). Slow
    // gossip widens the drain's window below, while b still answers HTTP (3 gossip rounds).
    cluster.join_with(&NodeSpec::new("b", &["m"]), |c| {
        c.arg("--join-wait-secs")
            .arg("600")
            .arg("--gossip-interval-ms")
            .arg("500")
    });
    let b = wait_ready(cluster.sidecar("b"), 200, "peer");
    assert!(b["peers"].as_u64() >= Some(1), "{b}");

    // Seeded with an address where nothing answers: not ready while it waits for a peer...
    let lonely = NodeSpec::new("lonely", &["m"]);
    let nobody = "127.0.0.1:9".to_string(); // discard port: no QUIC endpoint there
    let mut lonely_node = Cluster::empty();
    lonely_node.join_with(&lonely, |c| {
        c.arg("--seeds")
            .arg(&nobody)
            .arg("--join-wait-secs")
            .arg("600")
    });
    let sidecar = lonely_node.sidecar("lonely");
    wait_ready(sidecar, 503, "joining the mesh: no peer seen yet");
    holds_during(
        Duration::from_secs(2),
        "lonely stays unready",
        || match ready(sidecar)? {
            (503, _) => Ok(()),
            (status, body) => Err(format!("{status} {body}")),
        },
    );
    // ... and its liveness probe is unaffected.
    assert_eq!(sidecar.get("/health").status, 200);

    // A node whose engine died leaves the client Service but stays alive.
    cluster.node_mut("a").engine.kill9();
    wait_ready(cluster.sidecar("a"), 503, "engine unhealthy");
    assert_eq!(cluster.sidecar("a").get("/health").status, 200);

    // b, its peer a still a member, drains on SIGTERM: unready at once.
    cluster.node_mut("b").sidecar.sigterm();
    wait_ready(cluster.sidecar("b"), 503, "draining");
}

#[test]
fn a_seeded_node_that_finds_no_peer_is_ready_alone_after_its_join_wait() {
    let mut cluster = Cluster::empty();
    cluster.join_with(&NodeSpec::new("solo", &["m"]), |c| {
        c.arg("--seeds")
            .arg("127.0.0.1:9")
            .arg("--join-wait-secs")
            .arg("2")
    });
    let body = wait_ready(cluster.sidecar("solo"), 200, "join-wait-passed");
    assert_eq!(body["peers"], 0, "{body}");
    // Serving alone is allowed, not silent: an error in the log, /health and a metric.
    let sidecar = cluster.sidecar("solo");
    wait_until(
        Duration::from_secs(10),
        "the node to say it is alone",
        || {
            sidecar
                .metric("kvmesh_mesh_unjoined", &[])
                .is_ok_and(|value| value == Some(1.0))
        },
    );
    let health = sidecar.get("/health").json();
    assert_eq!(
        health["mesh"], "alone: no seed answered within the join wait",
        "{health}"
    );
    let logged = cluster
        .node_mut("solo")
        .sidecar
        .process()
        .output_contains("no live peer after the join wait");
    assert!(logged, "an error in the log");
}
