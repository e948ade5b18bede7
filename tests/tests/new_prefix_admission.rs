//! A node whose engine is computing one new prefix declines a second, different one (its queue
//! is longer than the entry believes the other engine's to be), and the entry sends it to the
//! prefix's next choice (`protocol::lifecycle`); a request with the prefix being computed
//! counts only what its prompt has beyond the first copy's, so it still lands on one engine,
//! where it waits for the first copy's prefill to cache the prefix rather than computing it
//! again beside it.
//!
//! Two slow modelled engines (a 1,000-token prefill takes about 2 s) and two sidecars with plain
//! rendezvous cold placement (`cold_choices = 1`), so that where a new prefix goes first is
//! known in advance: the test computes it with the protocol crate's own hashing and rendezvous
//! functions, as every sidecar does.

use std::io::Read;
use std::time::Duration;

use kvmesh_protocol::HashConfig;
use kvmesh_protocol::hashing::{Endpoint, hash_request};
use kvmesh_protocol::route::{node_key, rendezvous_weight};
use kvmesh_tests::http::OpenResponse;
use kvmesh_tests::openai::{completion_body, served_by};
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Cluster, NodeSpec, Request, Sidecar, Timing, wait_until};
use serde_json::Value;

const MODEL: &str = "mock-model";
/// Long enough for any request of the test to be sent while the first prefill runs.
const PREFILL_TIMEOUT: Duration = Duration::from_secs(60);

/// A prompt of ~1,000 tokens (4 bytes each) whose first block is set by `head`.
fn prompt(head: &str, tail: &str) -> String {
    format!(
        "{head}: {} {tail}",
        "a long shared system prompt. ".repeat(140)
    )
}

/// The node a new prefix goes to first: the highest rendezvous weight on its first block.
fn first_choice<'a>(body: &Value, nodes: &'a [&'a str]) -> &'a str {
    let hashes =
        hash_request(Endpoint::Completions, body, &HashConfig::default()).expect("hashable body");
    let first_block = hashes.chain[0];
    nodes
        .iter()
        .max_by_key(|name| rendezvous_weight(first_block, node_key(name)))
        .expect("nodes")
}

/// Two nodes over slow engines, sharing a configuration file with a `[route]` table.
struct Mesh {
    cluster: Cluster,
    _dir: tempfile::TempDir,
}

impl Mesh {
    fn start() -> Self {
        Self::with_route("cold_choices = 1\n")
    }

    /// Two nodes whose `[route]` table is `route`.
    fn with_route(route: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("kvmesh.toml");
        std::fs::write(&config, format!("[route]\n{route}")).expect("config file");
        let config = config.to_str().expect("utf-8 path");
        let specs: Vec<NodeSpec> = ["n0", "n1"]
            .map(|name| {
                NodeSpec::new(name, &[MODEL])
                    .timing(Timing::Scaled(20.0))
                    .sidecar_args(&["--config", config])
            })
            .into();
        let cluster = Cluster::start(&specs);
        cluster.wait_membership(&["n0", "n1"], CONVERGENCE_TIMEOUT);
        Mesh { cluster, _dir: dir }
    }

    fn node(&self, name: &str) -> &Sidecar {
        self.cluster.sidecar(name)
    }

    /// Prompt tokens node `name`'s engine found in its prefix cache so far.
    fn engine_cache_hits(&self, name: &str) -> f64 {
        self.cluster
            .node(name)
            .engine
            .metric("vllm:prefix_cache_hits_total", &[])
    }

    fn metric(&self, name: &str, metric: &str) -> f64 {
        self.labelled_metric(name, metric, &[])
    }

    /// How many requests `entry` believes queued at `peer` (its `/debug/cluster` estimate),
    /// or `None` while it has no digest of it; a node sees its own engine exactly.
    fn estimated_queue(&self, entry: &str, peer: &str) -> Option<u64> {
        if entry == peer {
            return Some(self.metric(peer, "kvmesh_engine_queued") as u64);
        }
        let estimate = self.node(entry).estimate_of(peer)?;
        Some(estimate["waiting"].as_u64()? + estimate["pending"].as_u64()?)
    }

    fn labelled_metric(&self, name: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
        self.node(name)
            .metric(metric, labels)
            .expect("metrics")
            .unwrap_or(0.0)
    }
}

/// Reads a response to its end; returns the body.
fn finish(mut response: OpenResponse) -> String {
    let mut body = String::new();
    response.read_to_string(&mut body).expect("response body");
    body
}

/// One round: a new prefix A enters at `a_entry` and its prefill runs on its first choice X;
/// meanwhile a different new prefix B whose first choice is also X, entering at the same node
/// as A, is served by the other node, and a request sharing A's prefix still goes to X.
fn round(cluster: &Mesh, tag: &str, a_entry_is_x: bool) {
    let names = ["n0", "n1"];
    let a_body = completion_body(
        MODEL,
        &prompt(&format!("{tag} A"), "first question"),
        2,
        true,
    );
    let x = first_choice(&a_body, &names);
    let y = names.iter().copied().find(|n| *n != x).expect("two nodes");
    // A different new prefix that also goes to X first.
    let b_body = (0..)
        .map(|i| completion_body(MODEL, &prompt(&format!("{tag} B{i}"), "q"), 1, false))
        .find(|body| first_choice(body, &names) == x)
        .expect("half of all prefixes go to X first");
    let (a_entry, b_entry) = if a_entry_is_x { (x, x) } else { (y, y) };
    let declined = [("reason", "new-prefix")];
    let declined_before = cluster.labelled_metric(x, "kvmesh_declined_total", &declined);
    let reports_before = cluster.metric(a_entry, "kvmesh_load_reports_total");

    // A's response head comes with its first token: it is sent now and read at the end.
    let a = cluster
        .node(a_entry)
        .try_start(Request::post_json("/v1/completions", &a_body).timeout(PREFILL_TIMEOUT))
        .expect("A sent");
    wait_until(Duration::from_secs(10), "A to be counted on X", || {
        cluster.metric(x, "kvmesh_new_prefixes_in_flight") == 1.0
    });
    // Until A's attempt has its answer head, its entry counts it at its next in rank too (it
    // might be declined and come back): forwarded, the head brings X's load report.
    if a_entry != x {
        wait_until(
            Duration::from_secs(10),
            "A's head to reach its entry",
            || cluster.metric(a_entry, "kvmesh_load_reports_total") > reports_before,
        );
    }
    // B's entry declines only in favour of an engine it believes idler: wait until gossip has
    // told it that Y is idle (Y may have been busy with the previous round).
    wait_until(Duration::from_secs(10), "B's entry to see Y idle", || {
        cluster.estimated_queue(b_entry, y) == Some(0)
    });

    let b = cluster
        .node(b_entry)
        .send(Request::post_json("/v1/completions", &b_body));
    assert_eq!(b.status, 200, "{}", b.describe());
    assert_eq!(
        served_by(&b),
        y,
        "B moves to its next choice while X computes A"
    );
    assert_eq!(b.header("x-kvmesh-reason"), Some("declined"));
    assert_eq!(
        cluster.labelled_metric(x, "kvmesh_declined_total", &declined),
        declined_before + 1.0
    );

    // A's prefix keeps going to X while A is computed there (whether X's router already sees
    // it as held or still as new: a copy adds only its own question to X's queue).
    let c_body = completion_body(
        MODEL,
        &prompt(&format!("{tag} A"), "second question"),
        1,
        false,
    );
    let c = cluster
        .node(x)
        .send(Request::post_json("/v1/completions", &c_body));
    assert_eq!(c.status, 200, "{}", c.describe());
    assert_eq!(served_by(&c), x, "A's prefix stays where it is computed");

    let a = a.finish().expect("A's response head");
    assert_eq!(a.status, 200);
    assert_eq!(
        a.header("x-kvmesh-node"),
        Some(x),
        "A goes to its first choice"
    );
    assert_eq!(a.header("x-kvmesh-reason"), Some("cold-hash"));
    let a_text = finish(a);
    assert!(
        a_text.contains("data: [DONE]"),
        "A's stream completes: {a_text}"
    );
    wait_until(
        Duration::from_secs(10),
        "X to count nothing in flight",
        || cluster.metric(x, "kvmesh_new_prefixes_in_flight") == 0.0,
    );
}

#[test]
fn a_busy_engine_declines_a_second_new_prefix_and_the_next_choice_serves_it() {
    let cluster = Mesh::start();
    // A forwarded: X's sidecar declines B on the wire, and B's entry serves it itself.
    round(&cluster, "forwarded", false);
    // A local to X's sidecar: it declines B before its own engine and forwards it.
    round(&cluster, "local", true);
}

/// Two copies of a new prefix reach its engine while that engine computes something else, so
/// that it schedules both in one step: both go to the engine at once, and the second meets
/// the first's blocks there (vLLM caches a block when a step is planned to fill it, so
/// copies scheduled together compute their prefix once).
#[test]
fn two_copies_of_a_new_prefix_at_a_busy_engine_compute_it_once() {
    // No declines: everything goes to its rendezvous first choice.
    let cluster =
        Mesh::with_route("cold_choices = 1\nmax_declines = 0\nmax_new_prefix_declines = 0\n");
    let names = ["n0", "n1"];
    let body = |tag: &str, question: &str| completion_body(MODEL, &prompt(tag, question), 1, true);
    let a = body("copies A", "first question");
    let x = first_choice(&a, &names);
    // Something else, also new, that keeps X's engine busy when the copies arrive.
    let busy = (0..)
        .map(|i| body(&format!("copies busy {i}"), "q"))
        .find(|b| first_choice(b, &names) == x)
        .expect("half of all prefixes go to X first");
    let hits_before = cluster.engine_cache_hits(x);
    // Response heads come with the first token: the requests are sent, then read at the end.
    let start = |body: &Value, in_flight: f64, what: &str| {
        let sent = cluster
            .node(x)
            .try_start(Request::post_json("/v1/completions", body).timeout(PREFILL_TIMEOUT))
            .expect("request sent");
        wait_until(Duration::from_secs(10), what, || {
            cluster.metric(x, "kvmesh_new_prefixes_in_flight") == in_flight
        });
        sent
    };
    let busy = start(&busy, 1.0, "X to compute the other prefix");
    let first = start(&a, 2.0, "X to compute the first copy");
    let second = cluster
        .node(x)
        .try_start(
            Request::post_json("/v1/completions", &body("copies A", "second question"))
                .timeout(PREFILL_TIMEOUT),
        )
        .expect("request sent");
    for sent in [busy, first, second] {
        let response = sent.finish().expect("response head");
        assert_eq!(response.status, 200);
        assert_eq!(response.header("x-kvmesh-node"), Some(x));
        let text = finish(response);
        assert!(text.contains("data: [DONE]"), "{text}");
    }
    let cached = cluster.engine_cache_hits(x) - hits_before;
    assert!(
        cached >= 512.0,
        "the second copy found {cached} tokens of the prefix cached"
    );
}
