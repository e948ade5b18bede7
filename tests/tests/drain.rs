//! SIGTERM drains a sidecar: requests in flight finish, then it leaves the mesh and exits.

use std::time::{Duration, Instant};

use kvmesh_tests::{CONVERGENCE_TIMEOUT, Call, Cluster, NodeSpec, SseReader, Timing, call};

#[test]
fn sigterm_finishes_in_flight_streams_then_leaves_the_mesh() {
    let mut cluster = Cluster::start(&[
        NodeSpec::new("a", &["near"]).timing(Timing::Scaled(1.0)),
        NodeSpec::new("b", &["far"]).timing(Timing::Scaled(1.0)),
    ]);
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);
    cluster.wait_models(&["a", "b"], &["far", "near"], CONVERGENCE_TIMEOUT);

    // Two streams served by b's engine (~1 s each at 12 ms a token): one entering at b, one
    // forwarded from a.
    const TOKENS: u32 = 80;
    let mut streams = Vec::new();
    for entry in ["b", "a"] {
        let request = Call::StreamedCompletion.request("far", &format!("via {entry}"), TOKENS);
        let open = cluster
            .sidecar(entry)
            .try_open(request)
            .expect("stream opens");
        assert_eq!(open.status, 200);
        assert_eq!(open.header("x-kvmesh-node"), Some("b"));
        let mut events = SseReader::new(open);
        assert!(events.next_event().expect("first event").is_some());
        streams.push((entry, events));
    }

    let signalled = Instant::now();
    cluster.node_mut("b").sidecar.sigterm();
    // Sent before a can have learned of the drain: b still serves it. (Refused, it would be a
    // 502: no other engine serves `far`.)
    let during = call(
        cluster.sidecar("a"),
        Call::Completion,
        "far",
        "during the drain",
    );
    assert_eq!(during.node, "b");

    for (entry, events) in streams {
        let transcript = events
            .read_to_end()
            .unwrap_or_else(|error| panic!("stream via {entry}: {error}"));
        let chunks = transcript.assert_openai_stream("text_completion");
        let last = chunks.last().expect("chunks");
        assert_eq!(
            last["choices"][0]["finish_reason"], "length",
            "the stream via {entry} was cut short: {last}"
        );
    }
    let status = cluster
        .node_mut("b")
        .sidecar
        .process()
        .wait_exit(Duration::from_secs(30))
        .expect("b exits after draining");
    println!(
        "b drained and exited ({status}) {:?} after SIGTERM",
        signalled.elapsed()
    );
    assert!(status.success(), "b exited with {status}");
    cluster.wait_membership(&["a"], CONVERGENCE_TIMEOUT);
    let served = call(
        cluster.sidecar("a"),
        Call::StreamedChat,
        "near",
        "after b left",
    );
    assert_eq!(served.node, "a");
}
