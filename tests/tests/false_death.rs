//! Gossip can declare a live peer dead: a sidecar frozen for a second (a starved CPU, a long
//! pause) misses its heartbeats. Its connections must survive that misjudgement, so a stream it
//! is serving completes once it runs again instead of being cut by the entry node.

use std::time::Duration;

use kvmesh_tests::{CONVERGENCE_TIMEOUT, Call, Cluster, NodeSpec, SseReader, Timing, wait_until};

#[test]
fn a_stream_survives_its_serving_peer_being_wrongly_declared_dead() {
    let mut cluster = Cluster::start(&[
        NodeSpec::new("a", &["near"]).timing(Timing::Scaled(1.0)),
        NodeSpec::new("b", &["far"]).timing(Timing::Scaled(1.0)),
    ]);
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);
    cluster.wait_models(&["a", "b"], &["far", "near"], CONVERGENCE_TIMEOUT);

    // ~300 tokens at the modelled 12 ms per step: a stream of about 4 s, served by b.
    let request = Call::StreamedCompletion
        .request("far", "a long answer", 300)
        .timeout(Duration::from_secs(60));
    let open = cluster
        .sidecar("a")
        .try_open(request)
        .expect("stream opens");
    assert_eq!(open.status, 200);
    assert_eq!(open.header("x-kvmesh-node"), Some("b"));
    let mut events = SseReader::new(open);
    events.next_event().expect("first event").expect("an event");

    // Freeze b until a's failure detector gives up on it, then let it run again.
    cluster.node_mut("b").sidecar.process().sigstop();
    wait_until(
        Duration::from_secs(15),
        "a declares the frozen b dead",
        || {
            cluster
                .sidecar("a")
                .peer_ids()
                .is_ok_and(|peers| !peers.iter().any(|p| p == "b"))
        },
    );
    cluster.node_mut("b").sidecar.process().sigcont();

    let mut rest = Vec::new();
    let ended = loop {
        match events.next_event() {
            Ok(Some(event)) => rest.push(event),
            Ok(None) => break Ok(()),
            Err(error) => break Err(error),
        }
    };
    let errors: Vec<_> = rest
        .iter()
        .filter(|event| event.data.contains("\"error\""))
        .collect();
    assert!(
        ended.is_ok() && errors.is_empty() && rest.last().is_some_and(|e| e.data == "[DONE]"),
        "the stream must finish normally; ended {ended:?}, errors {errors:?}, last {:?}",
        rest.last()
    );
    let kept = cluster
        .sidecar("a")
        .metric("kvmesh_mesh_dead_peer_connections_kept_total", &[])
        .unwrap()
        .unwrap_or(0.0);
    assert!(kept >= 1.0, "a kept its connection to b ({kept})");
    wait_until(CONVERGENCE_TIMEOUT, "a sees b alive again", || {
        cluster
            .sidecar("a")
            .peer_ids()
            .is_ok_and(|peers| peers.iter().any(|p| p == "b"))
    });
}
