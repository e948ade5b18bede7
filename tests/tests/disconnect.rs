//! A client that goes away mid-request cancels the upstream request, locally and across the
//! mesh, and leaves the node fully working.

use std::time::Duration;

use kvmesh_tests::{
    CONVERGENCE_TIMEOUT, Call, Cluster, Node, NodeSpec, SseReader, Timing, call, wait_for,
    wait_until,
};

/// Real-time engines: 2000 tokens take ~24 s, so an abandoned request is still running when
/// its client hangs up, and only a cancellation stops it early.
const LONG_ANSWER_TOKENS: u32 = 2000;

fn two_real_time_nodes() -> Cluster {
    let cluster = Cluster::start(&[
        NodeSpec::new("a", &["near"]).timing(Timing::Scaled(1.0)),
        NodeSpec::new("b", &["far"]).timing(Timing::Scaled(1.0)),
    ]);
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);
    cluster.wait_models(&["a", "b"], &["far", "near"], CONVERGENCE_TIMEOUT);
    cluster
}

fn running(node: &Node) -> f64 {
    node.engine.metric("vllm:num_requests_running", &[])
}

fn aborted(node: &Node) -> f64 {
    node.engine.metric(
        "vllm:request_success_total",
        &[("finished_reason", "abort")],
    )
}

/// Waits until neither engine runs anything and each aborted `expected` requests in all.
fn wait_cancelled(cluster: &Cluster, expected: f64) {
    let what = format!("both engines aborted {expected} requests and run none");
    let (_, took) = wait_for(Duration::from_secs(15), &what, || {
        let observed: Vec<(f64, f64)> = cluster
            .nodes()
            .iter()
            .map(|n| (running(n), aborted(n)))
            .collect();
        if observed
            .iter()
            .all(|&(running, aborted)| running == 0.0 && aborted == expected)
        {
            Ok(())
        } else {
            Err(format!("(running, aborted) per engine: {observed:?}"))
        }
    });
    println!("upstream requests cancelled within {took:?}");
}

/// Every kind of call, for both models, through both entries, reaches the right engine.
fn assert_everything_works(cluster: &Cluster) {
    for entry in ["a", "b"] {
        for kind in Call::ALL {
            for (model, owner) in [("near", "a"), ("far", "b")] {
                let served = call(cluster.sidecar(entry), kind, model, "still there?");
                assert_eq!(served.node, owner, "{kind:?} for {model} via {entry}");
            }
        }
    }
}

#[test]
fn a_client_that_hangs_up_mid_stream_cancels_upstream_and_breaks_nothing() {
    let cluster = two_real_time_nodes();
    let entry = cluster.sidecar("a");
    // Three abandoned streams per model, all entering at a: `near` is served by a's own
    // engine, `far` crosses the mesh to b's.
    let mut streams = Vec::new();
    for round in 0..3 {
        for (model, owner) in [("near", "a"), ("far", "b")] {
            let request = Call::StreamedCompletion.request(
                model,
                &format!("long {round}"),
                LONG_ANSWER_TOKENS,
            );
            let open = entry.try_open(request).expect("stream opens");
            assert_eq!(open.status, 200);
            assert_eq!(open.header("x-kvmesh-node"), Some(owner));
            let mut events = SseReader::new(open);
            let first = events.next_event().expect("first event");
            assert!(first.is_some_and(|event| event.data != "[DONE]"));
            streams.push(events);
        }
    }
    for node in cluster.nodes() {
        assert_eq!(
            running(node),
            3.0,
            "engine of {} runs the three streams",
            node.name()
        );
    }
    drop(streams);
    wait_cancelled(&cluster, 3.0);
    assert_everything_works(&cluster);
}

#[test]
fn a_client_that_hangs_up_before_the_answer_cancels_upstream_too() {
    let cluster = two_real_time_nodes();
    let entry = cluster.sidecar("a");
    // Non-streamed requests: nothing comes back before the whole answer, so the client leaves
    // while the engines are still generating.
    let mut pending = Vec::new();
    for (model, kind) in [
        ("near", Call::Completion),
        ("far", Call::Completion),
        ("far", Call::Chat),
    ] {
        let request = kind.request(model, "a long answer, please", LONG_ANSWER_TOKENS);
        pending.push(entry.try_start(request).expect("request sent"));
    }
    wait_until(
        Duration::from_secs(15),
        "the engines run the three requests",
        || running(cluster.node("a")) == 1.0 && running(cluster.node("b")) == 2.0,
    );
    drop(pending);
    let what = "both engines aborted the requests and run none";
    wait_for(Duration::from_secs(15), what, || {
        let observed: Vec<(f64, f64)> = cluster
            .nodes()
            .iter()
            .map(|n| (running(n), aborted(n)))
            .collect();
        if observed == [(0.0, 1.0), (0.0, 2.0)] {
            Ok(())
        } else {
            let finished: Vec<(f64, f64)> = cluster
                .nodes()
                .iter()
                .map(|n| {
                    (
                        n.engine
                            .metric("vllm:request_success_total", &[("finished_reason", "stop")]),
                        n.engine.metric(
                            "vllm:request_success_total",
                            &[("finished_reason", "length")],
                        ),
                    )
                })
                .collect();
            Err(format!(
                "(running, aborted) per engine: {observed:?}, finished by any reason: {finished:?}"
            ))
        }
    });
    assert_everything_works(&cluster);
}
