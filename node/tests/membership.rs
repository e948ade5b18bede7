//! Gossip over real QUIC with real certificates: convergence, failure detection, joins,
//! restarts. Times are logged (run with `--nocapture`) and asserted only with generous
//! bounds; the measured figures live in `MESH-NOTES.md`.

mod common;

use std::time::{Duration, Instant};

use common::{TestCa, start, wait_for_peers};
use kvmesh_node::mesh::GossipError;
use kvmesh_node::mesh::gossip::MAX_VALUE_LEN;

/// Bound on every convergence wait: typically under 2 s, generous for a loaded machine.
const CONVERGE: Duration = Duration::from_secs(30);
/// Target is 2 s; the bound is loose so a loaded 2-core machine does not flake.
const DETECT_BOUND: Duration = Duration::from_secs(6);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_converge_with_key_values() {
    let ca = TestCa::new();
    let t0 = Instant::now();
    let n1 = start(&ca, "n1", &[]).await;
    let seeds = [n1.advertise_addr()];
    let n2 = start(&ca, "n2", &seeds).await;
    let n3 = start(&ca, "n3", &seeds).await;
    for node in [&n1, &n2, &n3] {
        node.gossip().set("role", node.node_name()).await.unwrap();
    }
    wait_for_peers(&n1, &["n2", "n3"], true, CONVERGE).await;
    wait_for_peers(&n2, &["n1", "n3"], true, CONVERGE).await;
    wait_for_peers(&n3, &["n1", "n2"], true, CONVERGE).await;
    eprintln!("MEASURE converge_3_nodes_ms={}", t0.elapsed().as_millis());

    // Addresses and generations are those the nodes announce.
    let view = n1.gossip().membership();
    let p2 = view.get("n2").unwrap();
    assert_eq!(p2.mesh_addr, n2.advertise_addr());
    assert_eq!(p2.generation, n2.gossip().self_node().generation);

    // Updates and deletions propagate.
    n2.gossip().set("load", "7").await.unwrap();
    n2.gossip().delete("role").await.unwrap();
    let seen = n1
        .gossip()
        .wait_for(CONVERGE, |view| {
            view.get("n2").is_some_and(|p| {
                p.key_values.get("load").map(String::as_str) == Some("7")
                    && !p.key_values.contains_key("role")
            })
        })
        .await;
    assert!(seen.is_some(), "update of n2 not seen by n1");

    // Gossip really flowed over QUIC, and the gauge tracks live peers.
    let metrics = n1.metrics();
    assert!(metrics.gossip_bytes_sent.get() > 0);
    assert!(metrics.gossip_bytes_received.get() > 0);
    assert_eq!(metrics.peers_alive.get(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_node_is_detected_dead() {
    let ca = TestCa::new();
    let n1 = start(&ca, "n1", &[]).await;
    let seeds = [n1.advertise_addr()];
    let n2 = start(&ca, "n2", &seeds).await;
    let n3 = start(&ca, "n3", &seeds).await;
    wait_for_peers(&n1, &["n2", "n3"], false, CONVERGE).await;
    wait_for_peers(&n2, &["n1", "n3"], false, CONVERGE).await;
    // Let the failure detector collect a few heartbeat intervals, as in a running cluster.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let stopped_at = Instant::now();
    drop(n3);
    let (d1, d2) = tokio::join!(
        wait_for_peers(&n1, &["n2"], false, DETECT_BOUND),
        wait_for_peers(&n2, &["n1"], false, DETECT_BOUND),
    );
    eprintln!(
        "MEASURE dead_detection_ms n1={} n2={} (since stop: {})",
        d1.as_millis(),
        d2.as_millis(),
        stopped_at.elapsed().as_millis()
    );
    assert!(d1.max(d2) < DETECT_BOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fourth_node_joins_through_seeds() {
    let ca = TestCa::new();
    let n1 = start(&ca, "n1", &[]).await;
    let seeds = [n1.advertise_addr()];
    let n2 = start(&ca, "n2", &seeds).await;
    let n3 = start(&ca, "n3", &seeds).await;
    wait_for_peers(&n1, &["n2", "n3"], false, CONVERGE).await;
    wait_for_peers(&n2, &["n1", "n3"], false, CONVERGE).await;
    wait_for_peers(&n3, &["n1", "n2"], false, CONVERGE).await;

    // The newcomer knows only one seed, and not the first node.
    let joined_at = Instant::now();
    let n4 = start(&ca, "n4", &[n2.advertise_addr()]).await;
    n4.gossip().set("role", "n4").await.unwrap();
    let (a, b, c, d) = tokio::join!(
        n1.gossip().wait_for(CONVERGE, |v| v
            .get("n4")
            .is_some_and(|p| p.key_values.contains_key("role"))),
        n2.gossip().wait_for(CONVERGE, |v| v.get("n4").is_some()),
        n3.gossip().wait_for(CONVERGE, |v| v.get("n4").is_some()),
        wait_for_peers(&n4, &["n1", "n2", "n3"], false, CONVERGE),
    );
    assert!(
        a.is_some() && b.is_some() && c.is_some(),
        "n4 not seen by all"
    );
    eprintln!(
        "MEASURE join_4th_node_ms={} (n4 sees all after {} ms)",
        joined_at.elapsed().as_millis(),
        d.as_millis()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_node_is_a_new_generation() {
    let ca = TestCa::new();
    let n1 = start(&ca, "n1", &[]).await;
    let n2 = start(&ca, "n2", &[n1.advertise_addr()]).await;
    n2.gossip().set("epoch", "first").await.unwrap();
    let seen = n1
        .gossip()
        .wait_for(CONVERGE, |v| {
            v.get("n2")
                .is_some_and(|p| p.key_values.contains_key("epoch"))
        })
        .await
        .expect("n2 seen");
    let first_generation = seen.get("n2").unwrap().generation;
    drop(n2);
    tokio::time::sleep(Duration::from_millis(5)).await;

    let n2 = start(&ca, "n2", &[n1.advertise_addr()]).await;
    assert!(n2.gossip().self_node().generation > first_generation);
    let seen = n1
        .gossip()
        .wait_for(CONVERGE, |v| {
            v.get("n2").is_some_and(|p| p.generation > first_generation)
        })
        .await
        .expect("restarted n2 seen");
    // The new incarnation starts with fresh state: the old key is not carried over.
    assert!(!seen.get("n2").unwrap().key_values.contains_key("epoch"));
    assert_eq!(seen.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_values_and_bad_keys_are_refused() {
    let ca = TestCa::new();
    let n1 = start(&ca, "n1", &[]).await;
    let too_big = "x".repeat(MAX_VALUE_LEN + 1);
    let err = n1.gossip().set("summary", &too_big).await.unwrap_err();
    assert!(
        matches!(err, GossipError::ValueTooLarge { len, .. } if len == MAX_VALUE_LEN + 1),
        "{err}"
    );
    assert!(matches!(
        n1.gossip().set("", "v").await,
        Err(GossipError::InvalidKey { .. })
    ));
    n1.gossip()
        .set("summary", &"x".repeat(MAX_VALUE_LEN))
        .await
        .unwrap();
}

/// Convergence of a larger cluster, for calibration (issue 7). Nodes join through two seeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_nodes_converge() {
    let ca = TestCa::new();
    let t0 = Instant::now();
    let n0 = start(&ca, "n0", &[]).await;
    let n1 = start(&ca, "n1", &[n0.advertise_addr()]).await;
    let seeds = [n0.advertise_addr(), n1.advertise_addr()];
    let mut nodes = vec![n0, n1];
    for i in 2..8 {
        nodes.push(start(&ca, &format!("n{i}"), &seeds).await);
    }
    let names: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
    for node in &nodes {
        node.gossip().set("role", node.node_name()).await.unwrap();
    }
    for node in &nodes {
        let others: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|name| *name != node.node_name())
            .collect();
        wait_for_peers(node, &others, true, CONVERGE).await;
    }
    let connect_failures: u64 = nodes
        .iter()
        .map(|n| n.metrics().connect_failures.get())
        .sum();
    let dropped: u64 = nodes
        .iter()
        .map(|n| n.metrics().gossip_datagrams_dropped.get())
        .sum();
    eprintln!(
        "MEASURE converge_8_nodes_ms={} (connect failures {connect_failures}, datagrams dropped {dropped})",
        t0.elapsed().as_millis()
    );
}
