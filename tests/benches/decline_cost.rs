//! The price of a decline on loopback (BENCHMARKS.md#decline-cost; a measurement, not a check:
//! `cargo build --release --bins && cargo bench -p kvmesh-tests --bench decline_cost`):
//! requests entering at a whose session prefers b, which declines them (its queue is longer),
//! against requests whose session prefers a itself. The difference of the medians is one mesh
//! round trip with a decline in it.

use kvmesh_tests::openai::{completion_body, served_by};
use kvmesh_tests::slow_pair::{finish, queue_three_at_b, sessions_preferring};
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Cluster, NodeSpec, Request, Timing};

fn main() {
    let cluster = Cluster::start(&[
        NodeSpec::new("a", &["shared"]),
        NodeSpec::new("b", &["shared", "only-b"]).timing(Timing::Scaled(20.0)),
    ]);
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);
    cluster.wait_models(&["a", "b"], &["only-b", "shared"], CONVERGENCE_TIMEOUT);
    let busy = queue_three_at_b(&cluster);
    let time = |session: &str, declined: bool| {
        let request = Request::post_json(
            "/v1/completions",
            &completion_body("shared", "hi", 1, false),
        )
        .header("x-session-id", session);
        let started = std::time::Instant::now();
        let response = cluster.sidecar("a").send(request);
        let elapsed = started.elapsed().as_secs_f64() * 1e3;
        assert_eq!(response.status, 200);
        assert_eq!(served_by(&response), "a");
        assert_eq!(
            response.header("x-kvmesh-reason") == Some("declined"),
            declined
        );
        elapsed
    };
    let (mut direct, mut declined) = (Vec::new(), Vec::new());
    // Interleaved, so that the machine's noise falls on both alike.
    let pairs = sessions_preferring("a", "b").zip(sessions_preferring("b", "a"));
    for (a, b) in pairs.take(400) {
        direct.push(time(&a, false));
        declined.push(time(&b, true));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (direct, declined) = (median(&mut direct), median(&mut declined));
    println!(
        "400 requests each: p50 {direct:.3} ms served at the entry directly, {declined:.3} ms \
         after a decline by a peer: a decline adds {:.3} ms",
        declined - direct
    );
    for response in busy {
        finish(response);
    }
}
