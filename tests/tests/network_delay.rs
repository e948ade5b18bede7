//! The real QUIC mesh with 50 ms added each way between nodes (a user-space relay in front of
//! every node's mesh port, [`kvmesh_tests::udp_delay`]; the kernel here has no `netem`):
//! gossip converges, and requests forwarded across it, streamed or not, all succeed, slower
//! by what the delay costs. The measured times are printed; RELIABILITY.md has them.

use std::time::{Duration, Instant};

use kvmesh_tests::udp_delay::{DelayRelay, free_udp_address};
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Call, Cluster, NodeSpec, call, try_call, wait_for};

/// Added to every datagram, each way: a round trip between two nodes gains 100 ms.
const DELAY: Duration = Duration::from_millis(50);
const NODES: [&str; 3] = ["a", "b", "c"];
const REQUESTS: usize = 20;

/// The median of `times`.
fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

#[test]
fn gossip_converges_and_forwarded_requests_succeed_over_a_slow_network() {
    // a serves a model of its own, so that requests for b's model entering at a cross the
    // mesh; b and c serve the same one.
    let specs = [
        NodeSpec::new("a", &["only-a"]),
        NodeSpec::new("b", &["shared"]),
        NodeSpec::new("c", &["shared"]),
    ];
    let mut relays = Vec::new();
    let mut cluster = Cluster::empty();
    let started = Instant::now();
    for spec in &specs {
        let bind = free_udp_address();
        let relay = DelayRelay::start(bind, DELAY);
        let advertise = relay.address();
        relays.push(relay);
        cluster.join_with(spec, |config| config.mesh_behind(bind, advertise));
    }
    let joined = cluster.wait_membership(&NODES, CONVERGENCE_TIMEOUT);
    let models = cluster.wait_models(&NODES, &["only-a", "shared"], CONVERGENCE_TIMEOUT);
    println!(
        "with {DELAY:?} each way: membership after {joined:?}, every model everywhere {models:?} \
         after the last node started ({:?} since the first)",
        started.elapsed()
    );

    // Every request entering at a crosses the mesh to b or c, and succeeds.
    let (mut crossing, mut local) = (Vec::new(), Vec::new());
    for i in 0..REQUESTS {
        for (call_kind, streamed) in [(Call::Completion, false), (Call::StreamedChat, true)] {
            let prompt = format!("request {i} over a slow network, streamed {streamed}");
            let sent = Instant::now();
            let served = call(cluster.sidecar("a"), call_kind, "shared", &prompt);
            crossing.push(sent.elapsed());
            assert!(
                matches!(served.node.as_str(), "b" | "c"),
                "served by {}",
                served.node
            );
            let sent = Instant::now();
            try_call(cluster.sidecar("b"), call_kind, "only-a", &prompt)
                .expect("a request crossing the other way");
            local.push(sent.elapsed());
        }
    }
    let (crossing, local) = (median(crossing), median(local));
    println!(
        "median of {} crossing requests a -> b|c: {crossing:?}; b -> a: {local:?}",
        2 * REQUESTS
    );
    // One round trip at least (the request and its answer cross the relay once each way).
    assert!(
        crossing >= 2 * DELAY,
        "{crossing:?} is under one round trip"
    );

    // Still converged: nobody was declared dead by the slow network.
    wait_for(CONVERGENCE_TIMEOUT, "the membership to hold", || {
        for node in NODES {
            let peers = cluster.sidecar(node).peer_ids()?;
            if peers.len() != NODES.len() - 1 {
                return Err(format!("{node} sees {peers:?}"));
            }
        }
        Ok(())
    });
    drop(cluster);
    drop(relays);
}
