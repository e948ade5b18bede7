//! Two nodes whose engines are slow to prefill ([`two_slow_nodes`]: a 1,000-token prompt takes
//! about 2 s), with a queue built at one of them: the setting of late binding's tests
//! (`tests/late_binding.rs`) and of the price of a decline (`benches/decline_cost.rs`).

use std::time::Duration;

use kvmesh_protocol::route::{node_key, rendezvous_weight};
use serde_json::Value;

use crate::http::SentRequest;
use crate::openai::completion_body;
use crate::{CONVERGENCE_TIMEOUT, Cluster, NodeSpec, Request, Timing, wait_until};

/// Bound on a long prefill's answer.
pub const PREFILL_TIMEOUT: Duration = Duration::from_secs(60);

/// `shared` on both engines; `only-b` on b's alone, to load b through its own sidecar.
pub fn two_slow_nodes() -> Cluster {
    two_nodes(Timing::Scaled(20.0), &[])
}

/// [`two_slow_nodes`]' cluster with its engines at `timing` and `sidecar_args` on both sidecars.
pub fn two_nodes(timing: Timing, sidecar_args: &[&str]) -> Cluster {
    let cluster = Cluster::start(&[
        NodeSpec::new("a", &["shared"])
            .timing(timing)
            .sidecar_args(sidecar_args),
        NodeSpec::new("b", &["shared", "only-b"])
            .timing(timing)
            .sidecar_args(sidecar_args),
    ]);
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);
    cluster.wait_models(&["a", "b"], &["only-b", "shared"], CONVERGENCE_TIMEOUT);
    cluster
}

/// A streamed request with a ~1,000-token prompt of its own.
pub fn long_streamed(model: &str, tag: &str) -> Request {
    let prompt = format!(
        "{tag}: {}",
        "words that take a while to prefill. ".repeat(110)
    );
    Request::post_json("/v1/completions", &completion_body(model, &prompt, 2, true))
        .timeout(PREFILL_TIMEOUT)
}

/// `entry`'s view of `peer` in its `/debug/cluster` (null while it has none).
pub fn estimate_of(cluster: &Cluster, entry: &str, peer: &str) -> Value {
    cluster.sidecar(entry).estimate_of(peer).unwrap_or_default()
}

/// Three long prefills queued at b, through b's own sidecar (its queue counts them), once a
/// knows it: the premise of a decline is a's belief, not luck. The requests are left waiting
/// (a sidecar sends a client the response head with the first token).
pub fn queue_three_at_b(cluster: &Cluster) -> Vec<SentRequest> {
    let busy: Vec<SentRequest> = (0..3)
        .map(|i| {
            cluster
                .sidecar("b")
                .try_start(long_streamed("only-b", &format!("load {i}")))
                .expect("the request sent")
        })
        .collect();
    wait_until(Duration::from_secs(10), "b to count 3 queued", || {
        metric(cluster, "b", "kvmesh_engine_queued") == 3.0
    });
    wait_until(Duration::from_secs(10), "a to see b's queue", || {
        estimate_of(cluster, "a", "b")["waiting"].as_u64() == Some(3)
    });
    busy
}

/// Session ids (`x-session-id`) whose soft affinity prefers node `node` to node `other`.
pub fn sessions_preferring(
    node: &'static str,
    other: &'static str,
) -> impl Iterator<Item = String> {
    (0..).map(|i| format!("session-{i}")).filter(move |s| {
        let key = node_key(s);
        rendezvous_weight(key, node_key(node)) > rendezvous_weight(key, node_key(other))
    })
}

pub fn finish(request: SentRequest) {
    let mut response = request.finish().expect("the response head");
    assert_eq!(response.status, 200);
    let mut body = String::new();
    std::io::Read::read_to_string(&mut response, &mut body).expect("response body");
    assert!(
        body.contains("data: [DONE]"),
        "the stream completes: {body}"
    );
}

/// Sidecar `node`'s unlabelled metric `name` (0 when absent).
pub fn metric(cluster: &Cluster, node: &str, name: &str) -> f64 {
    cluster
        .sidecar(node)
        .metric(name, &[])
        .expect("metrics")
        .unwrap_or(0.0)
}
