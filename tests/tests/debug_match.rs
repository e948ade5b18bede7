//! `POST /debug/match` over real processes: after one request with a new long prefix enters
//! at one node, every node's view lists the engine that served it as holding the whole chain,
//! and nobody else; bad input gets the OpenAI error shape.

use kvmesh_tests::openai::{assert_openai_error, completion_body, served_by};
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Cluster, NodeSpec, Request, wait_for};

const MODEL: &str = "mock-model";

#[test]
fn every_node_learns_who_holds_a_new_prefix() {
    let cluster = Cluster::start(&[
        NodeSpec::new("a", &[MODEL]),
        NodeSpec::new("b", &[MODEL]),
        NodeSpec::new("c", &[MODEL]),
    ]);
    cluster.wait_membership(&["a", "b", "c"], CONVERGENCE_TIMEOUT);
    let prompt: String = (0..400)
        .map(|i| format!("fact {i} about the mesh. "))
        .collect();
    let body = completion_body(MODEL, &prompt, 4, false);

    let (before, blocks) = cluster.sidecar("a").debug_match(&body).expect("a answers");
    assert!(blocks >= 100, "a long prompt is many blocks, got {blocks}");
    assert_eq!(before.len(), 3, "this node and two peers: {before:?}");
    assert!(
        before.iter().all(|(_, matched)| *matched == 0),
        "nobody holds a new prefix: {before:?}"
    );

    let response = cluster.sidecar("a").post_json("/v1/completions", &body);
    assert_eq!(response.status, 200, "{}", response.describe());
    let owner = served_by(&response);

    for entry in ["a", "b", "c"] {
        let what = format!("{entry} lists {owner} as holding the whole prefix");
        let (seen, _) = wait_for(CONVERGENCE_TIMEOUT, &what, || {
            cluster.sidecar(entry).sees_whole_prefix_at(&body, &owner)
        });
        assert!(
            seen.iter()
                .filter(|(node, _)| *node != owner)
                .all(|(_, matched)| *matched == 0),
            "{entry}: only {owner} holds it: {seen:?}"
        );
    }

    let other = completion_body(MODEL, &format!("another story. {prompt}"), 4, false);
    let (nodes, _) = cluster.sidecar("b").debug_match(&other).expect("b answers");
    assert!(
        nodes.iter().all(|(_, matched)| *matched == 0),
        "a prompt that differs from the first block matches nothing: {nodes:?}"
    );

    let malformed = cluster
        .sidecar("c")
        .send(Request::post("/debug/match", "{not json"));
    assert_openai_error(&malformed, 400);
    let not_a_request = cluster
        .sidecar("c")
        .post_json("/debug/match", &serde_json::json!({"model": MODEL}));
    assert_openai_error(&not_a_request, 400);
    let wrong_method = cluster.sidecar("c").get("/debug/match");
    assert_openai_error(&wrong_method, 405);
}
