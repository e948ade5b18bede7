//! Where a prompt goes over real vLLM: to the server whose cache holds its prefix, known from
//! vLLM's KV events (exact mode, replay included) or from what each node served (approximate
//! mode); checked with vLLM's own prefix-cache counters.

use kvmesh_tests::certs::ClusterCa;
use kvmesh_tests::cluster::wait_meshed;
use kvmesh_tests::openai::{chat_body, completion_body, served_by};
use kvmesh_tests::vllm::{BLOCK_TOKENS, MODEL, prompt};
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Sidecar, VllmServer, wait_for};
use serde_json::{Value, json};

use super::{
    CacheCounters, LEARN_TIMEOUT, PREFIX_TOKENS, assert_served_from_cache, counter, post_ok,
    sidecar,
};

/// A prefix cached on server b behind every sidecar's back (sent to vLLM directly): only b's
/// KV events can tell a about it. A continuation entering at a goes to b, and vLLM b finds the
/// prefix in its cache.
pub(super) fn exact_completion_goes_to_its_prefix(a: &Sidecar, servers: &[VllmServer]) {
    let (server_a, server_b) = (&servers[0], &servers[1]);
    let prefix = prompt("exact completions", PREFIX_TOKENS);
    let warmed = server_b.post_json(
        "/v1/completions",
        &completion_body(MODEL, &prefix, 1, false),
    );
    assert_eq!(warmed.status, 200, "{}", warmed.describe());
    let blocks = (PREFIX_TOKENS as u64) / BLOCK_TOKENS;
    wait_for(LEARN_TIMEOUT, "a learns from b's KV events", || {
        let (nodes, chain) = a.debug_match(&json!({"model": MODEL, "prompt": prefix}))?;
        let at_b = nodes.iter().find(|(node, _)| node == "b").map(|n| n.1);
        match (chain, at_b) {
            (c, Some(held)) if c == blocks && held == blocks => Ok(()),
            _ => Err(format!("{nodes:?} of {chain} blocks")),
        }
    });
    let (before_a, before_b) = (CacheCounters::of(server_a), CacheCounters::of(server_b));
    let continued = format!("{prefix}{}", prompt("exact question", 40));
    let response = post_ok(
        a,
        "/v1/completions",
        &completion_body(MODEL, &continued, 4, false),
    );
    assert_served_from_cache(
        &response,
        ("b", server_b, &before_b),
        (server_a, &before_a),
        PREFIX_TOKENS,
    );
    assert_eq!(counter(a, "kvmesh_tokenize_failures_total", &[]), 0.0);
    assert_eq!(
        counter(a, "kvmesh_kv_event_batches_total", &[("outcome", "lost")]),
        0.0
    );
}

/// A chat with a long system message cached on b (sent to vLLM directly); another chat with the
/// same system message and another question enters at a. Only the tokens of vLLM's chat
/// template (from its `/tokenize` with `messages`) make the two share their first blocks: a
/// routes by those, and vLLM b finds them in its cache.
pub(super) fn exact_chat_routes_by_its_template(a: &Sidecar, servers: &[VllmServer]) {
    let (server_a, server_b) = (&servers[0], &servers[1]);
    let system = prompt("exact chat system", 1500);
    let messages = |question: &str| json!([{"role": "system", "content": system}, {"role": "user", "content": question}]);
    let (first, second) = (
        messages("Hello, world!"),
        messages("Translate this sentence."),
    );
    let tokens = |messages: &Value| -> Vec<u64> {
        let answer = server_a
            .post_json("/tokenize", &json!({"model": MODEL, "messages": messages}))
            .json();
        answer["tokens"]
            .as_array()
            .unwrap_or_else(|| panic!("no tokens in {answer}"))
            .iter()
            .filter_map(Value::as_u64)
            .collect()
    };
    let (first_tokens, second_tokens) = (tokens(&first), tokens(&second));
    let common = first_tokens
        .iter()
        .zip(&second_tokens)
        .take_while(|(x, y)| x == y)
        .count();
    let shared_blocks = common as u64 / BLOCK_TOKENS;
    assert!(
        shared_blocks >= 40,
        "the two chats share {common} tokens only"
    );
    let mut warm = chat_body(MODEL, "", 1, false);
    warm["messages"] = first;
    let warmed = server_b.post_json("/v1/chat/completions", &warm);
    assert_eq!(warmed.status, 200, "{}", warmed.describe());
    let mut body = chat_body(MODEL, "", 4, false);
    body["messages"] = second.clone();
    wait_for(
        LEARN_TIMEOUT,
        "a sees b hold the chat's shared blocks",
        || {
            let (nodes, _) = a.debug_match(&json!({"model": MODEL, "messages": second}))?;
            match nodes.iter().find(|(node, _)| node == "b") {
                Some((_, held)) if *held == shared_blocks => Ok(()),
                _ => Err(format!("{nodes:?}, want {shared_blocks} at b")),
            }
        },
    );
    let (before_a, before_b) = (CacheCounters::of(server_a), CacheCounters::of(server_b));
    let response = post_ok(a, "/v1/chat/completions", &body);
    assert_eq!(response.json()["object"], "chat.completion");
    assert_served_from_cache(
        &response,
        ("b", server_b, &before_b),
        (server_a, &before_a),
        (shared_blocks * BLOCK_TOKENS) as usize,
    );
    assert_eq!(counter(a, "kvmesh_tokenize_failures_total", &[]), 0.0);
}

/// Sidecar b stops; vLLM b caches a prefix meanwhile, its KV events lost to nobody listening.
/// A new sidecar, b2, subscribes: the first batch it receives is numbered past 0, so it asks
/// vLLM's replay socket for the ones before, and a learns of the prefix cached while b2 did not
/// exist. Returns b2, in b's place.
pub(super) fn exact_replay_after_a_restart(
    ca: &ClusterCa,
    a: &Sidecar,
    b: Sidecar,
    servers: &[VllmServer],
) -> Sidecar {
    let server_b = &servers[1];
    drop(b);
    let early = prompt("cached while no sidecar listened", PREFIX_TOKENS);
    let warmed = server_b.post_json("/v1/completions", &completion_body(MODEL, &early, 1, false));
    assert_eq!(warmed.status, 200, "{}", warmed.describe());
    let b2 = sidecar(ca, "b2", server_b, &[a], true);
    wait_meshed(&[a, &b2], CONVERGENCE_TIMEOUT);
    let blocks = (PREFIX_TOKENS as u64) / BLOCK_TOKENS;
    let body = json!({"model": MODEL, "prompt": early});
    let mut sent = 0;
    wait_for(
        LEARN_TIMEOUT,
        "a learns of the early prefix from b2's replay",
        || {
            // Live events show b2 the gap; more of them until one arrives after it subscribed.
            let live = prompt(&format!("after b2 subscribed {sent}"), 64);
            sent += 1;
            let response =
                server_b.post_json("/v1/completions", &completion_body(MODEL, &live, 1, false));
            assert_eq!(response.status, 200, "{}", response.describe());
            let (nodes, _) = a.debug_match(&body)?;
            match nodes.iter().find(|(node, _)| node == "b2") {
                Some((_, held)) if *held == blocks => Ok(()),
                _ => Err(format!("{nodes:?}, want {blocks} at b2")),
            }
        },
    );
    let replayed = counter(
        &b2,
        "kvmesh_kv_event_batches_total",
        &[("outcome", "replayed")],
    );
    assert!(replayed > 0.0, "b2 replayed no batch");
    for outcome in ["lost", "malformed"] {
        let batches = counter(
            &b2,
            "kvmesh_kv_event_batches_total",
            &[("outcome", outcome)],
        );
        assert_eq!(batches, 0.0, "{outcome} batches");
    }
    b2
}

/// Approximate mode: a node learns its engine's cache from what it serves. A prefix sent
/// through c lands on one server; once the other node's view shows it there (gossip), a
/// continuation entering there goes to it, and that vLLM finds the prefix cached.
pub(super) fn approximate_continuation_goes_to_its_prefix(
    c: &Sidecar,
    d: &Sidecar,
    servers: &[VllmServer],
) {
    let prefix = prompt("approximate", PREFIX_TOKENS);
    let warmed = post_ok(
        c,
        "/v1/completions",
        &completion_body(MODEL, &prefix, 1, false),
    );
    let holder = served_by(&warmed);
    let (other, holder_index) = match holder.as_str() {
        "c" => (d, 0),
        _ => (c, 1),
    };
    let match_body = json!({"model": MODEL, "prompt": prefix});
    wait_for(LEARN_TIMEOUT, "the other node sees the prefix", || {
        other.sees_whole_prefix_at(&match_body, &holder)
    });
    let (holder_server, other_server) = (&servers[holder_index], &servers[1 - holder_index]);
    let before = (
        CacheCounters::of(holder_server),
        CacheCounters::of(other_server),
    );
    let continued = format!("{prefix}{}", prompt("approximate question", 40));
    let response = post_ok(
        other,
        "/v1/completions",
        &completion_body(MODEL, &continued, 4, false),
    );
    assert_served_from_cache(
        &response,
        (&holder, holder_server, &before.0),
        (other_server, &before.1),
        PREFIX_TOKENS,
    );
}
