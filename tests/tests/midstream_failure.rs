//! A failure after the first byte reached the client cannot be retried: the stream must end
//! with an SSE error event (not hang, not end silently, not pretend success), and the entry
//! keeps working. An engine that goes silent mid-stream counts as failed after the request
//! timeout.

use std::io;
use std::time::{Duration, Instant};

use kvmesh_tests::{
    CONVERGENCE_TIMEOUT, Call, Cluster, NodeSpec, SseEvent, SseReader, Timing, call,
};

/// Real-time engines; 2000 tokens take ~24 s, so the stream is still running at the failure.
fn two_real_time_nodes() -> Cluster {
    let cluster = Cluster::start(&[
        NodeSpec::new("a", &["near"]).timing(Timing::Scaled(1.0)),
        NodeSpec::new("b", &["far"]).timing(Timing::Scaled(1.0)),
    ]);
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);
    cluster.wait_models(&["a", "b"], &["far", "near"], CONVERGENCE_TIMEOUT);
    cluster
}

/// Opens a long stream for `far` entering at a (served by b) and reads its first event.
fn open_long_stream(cluster: &Cluster) -> SseReader {
    let request = Call::StreamedCompletion
        .request("far", "a very long answer", 2000)
        .timeout(Duration::from_secs(40));
    let open = cluster
        .sidecar("a")
        .try_open(request)
        .expect("stream opens");
    assert_eq!(open.status, 200);
    assert_eq!(open.header("x-kvmesh-node"), Some("b"));
    let mut events = SseReader::new(open);
    let first = events.next_event().expect("first event").expect("an event");
    assert_ne!(first.data, "[DONE]");
    events
}

/// Reads the rest of the stream; the events, and how it ended (`Err` if the connection broke
/// instead of the chunked body ending cleanly).
fn read_rest(mut events: SseReader) -> (Vec<SseEvent>, io::Result<()>) {
    let mut rest = Vec::new();
    loop {
        match events.next_event() {
            Ok(Some(event)) => rest.push(event),
            Ok(None) => return (rest, Ok(())),
            Err(error) => return (rest, Err(error)),
        }
    }
}

fn assert_ends_with_error_event(rest: &[SseEvent], ended: &io::Result<()>, took: Duration) {
    println!(
        "stream ended {took:?} after the failure ({ended:?}); last events: {:?}",
        rest.iter().rev().take(2).collect::<Vec<_>>()
    );
    let error_at = rest.iter().position(|event| {
        serde_json::from_str::<serde_json::Value>(&event.data)
            .is_ok_and(|chunk| chunk.get("error").is_some_and(|error| error.is_object()))
    });
    let Some(error_at) = error_at else {
        panic!("no SSE error event after the failure; ended {ended:?}; events: {rest:?}");
    };
    // Nothing but an optional [DONE] may follow the error.
    let after: Vec<&SseEvent> = rest[error_at + 1..].iter().collect();
    assert!(
        after.iter().all(|event| event.data == "[DONE]") && after.len() <= 1,
        "events after the error: {after:?}"
    );
}

#[test]
fn an_engine_dying_mid_stream_ends_the_stream_with_an_error_event() {
    let mut cluster = two_real_time_nodes();
    let events = open_long_stream(&cluster);
    let failed_at = Instant::now();
    cluster.node_mut("b").engine.kill9();
    let (rest, ended) = read_rest(events);
    assert_ends_with_error_event(&rest, &ended, failed_at.elapsed());
    call(
        cluster.sidecar("a"),
        Call::StreamedChat,
        "near",
        "still fine",
    );
}

#[test]
fn a_serving_sidecar_dying_mid_stream_ends_the_stream_with_an_error_event() {
    let mut cluster = two_real_time_nodes();
    let events = open_long_stream(&cluster);
    let failed_at = Instant::now();
    cluster.node_mut("b").sidecar.kill9();
    let (rest, ended) = read_rest(events);
    assert_ends_with_error_event(&rest, &ended, failed_at.elapsed());
    call(
        cluster.sidecar("a"),
        Call::StreamedChat,
        "near",
        "still fine",
    );
}

#[test]
fn an_engine_silent_mid_stream_ends_the_stream_after_the_request_timeout() {
    const TIMEOUT_SECS: u64 = 3;
    let with_timeout = |config: kvmesh_tests::SidecarConfig| {
        config
            .arg("--request-timeout-secs")
            .arg(&TIMEOUT_SECS.to_string())
    };
    let mut cluster = Cluster::empty();
    cluster.join_with(
        &NodeSpec::new("a", &["near"]).timing(Timing::Scaled(1.0)),
        with_timeout,
    );
    cluster.join_with(
        &NodeSpec::new("b", &["far"]).timing(Timing::Scaled(1.0)),
        with_timeout,
    );
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);
    cluster.wait_models(&["a", "b"], &["far", "near"], CONVERGENCE_TIMEOUT);
    let events = open_long_stream(&cluster);
    // The engine's process stops: its connection stays open, nothing more comes.
    let silent_at = Instant::now();
    cluster.node_mut("b").engine.process().sigstop();
    let (rest, ended) = read_rest(events);
    let took = silent_at.elapsed();
    cluster.node_mut("b").engine.process().sigcont();
    assert_ends_with_error_event(&rest, &ended, took);
    assert!(
        took >= Duration::from_secs(TIMEOUT_SECS - 1) && took < Duration::from_secs(20),
        "the stream ended {took:?} after the engine went silent"
    );
}
