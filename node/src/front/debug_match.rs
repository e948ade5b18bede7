//! `POST /debug/match`: which nodes this node believes hold a request's prefix.
//!
//! Read-only. The body is an inference request as a client would send it (a body with
//! `messages` is hashed as a chat completion, any other as a completion); nothing is routed or
//! forwarded. The answer lists, for this node and every live peer, the longest leading run of
//! the request's chain its gossiped summary holds (this node's own summary as last published,
//! i.e. as its peers see it), on the GPU and, in exact mode, in offload tiers. Optimistic matches from this node's recent sends are left out:
//! the endpoint shows what gossip has taught this node, which is what an operator (or the
//! convergence benchmark, `scripts/bench-prefix.sh`) wants to observe.

use super::body::ResponseBody;
use super::errors::ApiError;
use super::hashing::hash_for_routing;
use super::inference::{parse_json, read_body};
use crate::serve::state::{SharedState, lock};
use http::StatusCode;
use hyper::body::Incoming;
use hyper::{Request, Response};
use kvmesh_protocol::hashing::{Endpoint, pin_media_uuids};

pub async fn handle(state: SharedState, request: Request<Incoming>) -> Response<ResponseBody> {
    match matches(&state, request).await {
        Ok(value) => super::handlers::json(StatusCode::OK, value),
        Err(error) => error.into_response(),
    }
}

async fn matches(
    state: &SharedState,
    request: Request<Incoming>,
) -> Result<serde_json::Value, ApiError> {
    let (parts, body) = request.into_parts();
    let body = read_body(&parts.headers, body, &state.config).await?;
    let mut json = parse_json(&body)?;
    let endpoint = if json.get("messages").is_some() {
        Endpoint::ChatCompletions
    } else {
        Endpoint::Completions
    };
    // Media identities as routing would pin them (no fetching, no metrics: read-only).
    pin_media_uuids(&mut json);
    let hashes = hash_for_routing(state, endpoint, &json).await?;
    let (own, own_offload) = {
        let prefixes = lock(&state.prefixes);
        (prefixes.own_summary(), prefixes.own_offload())
    };
    let view = state.view.load();
    let mut nodes = vec![serde_json::json!({
        "node": state.node_name,
        "self": true,
        "matched_blocks": own.longest_match(&hashes.chain),
        "offload_matched_blocks": own_offload.longest_match(&hashes.chain),
    })];
    nodes.extend(view.peers.iter().map(|peer| {
        serde_json::json!({
            "node": peer.name,
            "self": false,
            "matched_blocks": peer.summary.longest_match(&hashes.chain),
            "offload_matched_blocks": peer.offload.longest_match(&hashes.chain),
        })
    }));
    Ok(serde_json::json!({
        "node": state.node_name,
        "model": hashes.model,
        "blocks": hashes.chain.len(),
        "nodes": nodes,
    }))
}
