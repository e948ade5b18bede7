//! One function per endpoint.

use super::body::{ResponseBody, full};
use super::errors::ApiError;
use super::inference::Api;
use super::ready::{ReadinessInputs, evaluate};
use super::{dashboard, debug_match, exposition, inference, intent};
use crate::engine::models;
use crate::forward::forwardable;
use crate::metrics::Outcome;
use crate::serve::routing::served_models;
use crate::serve::state::{SharedState, lock};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use kvmesh_protocol::hashing::Endpoint;
use kvmesh_protocol::lifecycle::{Estimated, PeerInput};
use std::convert::Infallible;

pub async fn handle(
    state: SharedState,
    request: Request<Incoming>,
) -> Result<Response<ResponseBody>, Infallible> {
    let path = request.uri().path().to_owned();
    let response = match (request.method(), path.as_str()) {
        (&Method::GET, "/health") => health(&state),
        (&Method::GET, "/ready") => ready(&state),
        // The page itself holds no data: what it shows comes from the authorized endpoints.
        (&Method::GET, "/dashboard") => dashboard::page(),
        (&Method::GET, "/metrics") => metrics(&state, &request),
        (
            method,
            "/v1/completions"
            | "/v1/chat/completions"
            | "/v1/models"
            | "/debug/cluster"
            | "/debug/recent"
            | "/debug/match",
        ) => match authorize(&state, &request) {
            Err(error) => {
                state.metrics.record_request("none", Outcome::Rejected);
                error.into_response()
            }
            Ok(()) => match (method, path.as_str()) {
                (&Method::POST, "/v1/completions") => {
                    let api = Api::Generation(Endpoint::Completions);
                    intent::tagged(inference::handle(state, request, api)).await
                }
                (&Method::POST, "/v1/chat/completions") => {
                    let api = Api::Generation(Endpoint::ChatCompletions);
                    intent::tagged(inference::handle(state, request, api)).await
                }
                (&Method::GET, "/v1/models") => models(&state),
                (&Method::GET, "/debug/cluster") => debug_cluster(&state),
                (&Method::GET, "/debug/recent") => {
                    json(StatusCode::OK, serde_json::json!(state.recent.snapshot()))
                }
                (&Method::POST, "/debug/match") => debug_match::handle(state, request).await,
                _ => ApiError::new(
                    StatusCode::METHOD_NOT_ALLOWED,
                    format!("{method} is not allowed on {path}"),
                )
                .into_response(),
            },
        },
        // vLLM's other inference endpoints, by model and load.
        (method, path) if forwardable(path) => match authorize(&state, &request) {
            Err(error) => {
                state.metrics.record_request("none", Outcome::Rejected);
                error.into_response()
            }
            Ok(()) if method == Method::POST => {
                inference::handle(state, request, Api::ByModel).await
            }
            Ok(()) => ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{method} is not allowed on {path}"),
            )
            .into_response(),
        },
        _ => ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no route for {} {path}", request.method()),
        )
        .into_response(),
    };
    Ok(response)
}

/// With `--api-key`, the OpenAI endpoints and the debug view need `Authorization: Bearer KEY`.
/// `/health`, `/ready` and `/metrics` stay open for probes and scrapers.
fn authorize(state: &SharedState, request: &Request<Incoming>) -> Result<(), ApiError> {
    let Some(expected) = &state.config.api_key else {
        return Ok(());
    };
    let presented = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        Some(key) if constant_time_eq(key.as_bytes(), expected.as_bytes()) => Ok(()),
        Some(_) => Err(ApiError::new(StatusCode::UNAUTHORIZED, "invalid API key")),
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing API key (Authorization: Bearer ...)",
        )),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub(super) fn json(status: StatusCode, value: serde_json::Value) -> Response<ResponseBody> {
    let mut response = Response::new(full(value.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// 200 while this sidecar accepts requests (even if its engine is down: it still routes
/// elsewhere); 503 while draining.
fn health(state: &SharedState) -> Response<ResponseBody> {
    let engine = state.engine.state();
    let status = if state.is_draining() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    json(
        status,
        serde_json::json!({
            "status": if state.is_draining() { "draining" } else { "ok" },
            "node": state.node_name,
            "engine_healthy": engine.healthy,
            "peers": state.view.load().peers.len(),
            // Seeds given, no live peer ever seen after the join wait (see `watch_join`).
            "mesh": match state.metrics.mesh_unjoined.get() {
                1 => "alone: no seed answered within the join wait",
                _ if state.peer_seen.load(std::sync::atomic::Ordering::Relaxed) => "joined",
                _ if state.config.seeds.is_empty() => "no seeds",
                _ => "joining",
            },
        }),
    )
}

/// 200 when this sidecar should get client traffic (see [`super::ready`]), 503 with the reasons
/// when not.
fn ready(state: &SharedState) -> Response<ResponseBody> {
    let engine_healthy = state.engine.state().healthy;
    let peers_alive = state.view.load().peers.len();
    let verdict = evaluate(&ReadinessInputs {
        draining: state.is_draining(),
        engine_healthy,
        peers_alive,
        peer_seen: state.peer_seen.load(std::sync::atomic::Ordering::Relaxed),
        has_seeds: !state.config.seeds.is_empty(),
        uptime: state.start.elapsed(),
        join_wait: state.config.join_wait,
    });
    let status = if verdict.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(
        status,
        serde_json::json!({
            "ready": verdict.is_ready(),
            "node": state.node_name,
            "not_ready": verdict.not_ready,
            "joined": verdict.joined.map(|joined| joined.as_str()),
            "engine_healthy": engine_healthy,
            "peers": peers_alive,
        }),
    )
}

/// OpenMetrics when the scraper accepts it (Prometheus does), the text format 0.0.4 otherwise.
fn metrics(state: &SharedState, request: &Request<Incoming>) -> Response<ResponseBody> {
    let mut text = String::new();
    if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &state.registry) {
        return ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {error}"),
        )
        .into_response();
    }
    let accept = request
        .headers()
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    let (text, content_type) = if exposition::wants_openmetrics(accept) {
        (text, exposition::OPENMETRICS)
    } else {
        (
            exposition::to_prometheus_text(&text),
            exposition::PROMETHEUS_TEXT,
        )
    };
    let mut response = Response::new(full(text));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    response
}

/// The union of the models served by live nodes, in vLLM's list shape (`root`, `parent`,
/// `max_model_len`, `created`, `owned_by` as the engines report them).
fn models(state: &SharedState) -> Response<ResponseBody> {
    let view = state.view.load();
    let engine = state.engine.state();
    let own = state.self_digest();
    let digests = own
        .iter()
        .map(|(digest, _)| digest.as_ref())
        .chain(view.peers.iter().filter_map(|p| p.digest.as_deref()));
    let names = served_models(digests);
    // Each name as the node first in name order describes it, so that every node lists the
    // same cards (two engines of one model were created at different times).
    let mut by_node: Vec<(&str, &[models::ModelCard])> = view
        .peers
        .iter()
        .filter(|peer| peer.digest.is_some())
        .map(|peer| (peer.name.as_str(), peer.models.as_slice()))
        .collect();
    by_node.push((&state.node_name, &engine.cards));
    by_node.sort_by_key(|(name, _)| *name);
    let cards = by_node.iter().flat_map(|(_, cards)| cards.iter());
    let mut data = models::union(cards, names.iter().map(String::as_str))
        .into_iter()
        // A card only a peer without a digest (not a target) lists is not served.
        .filter(|card| {
            card["id"]
                .as_str()
                .is_some_and(|id| names.iter().any(|n| n == id))
        })
        .collect::<Vec<_>>();
    // With intent routing, the name that picks a model by the prompt is a model too.
    if let Some(intents) = &state.config.intents {
        let auto = &intents.router.file().auto_name;
        data.push(
            serde_json::json!({"id": auto, "object": "model", "created": 0,
            "owned_by": "kvmesh", "root": null, "parent": null, "max_model_len": null,
            "permission": []}),
        );
    }
    json(
        StatusCode::OK,
        serde_json::json!({"object": "list", "data": data}),
    )
}

/// This node and every live peer with its digest and the age of its last update, and the
/// load a routing decision now would judge it by (`estimate`: the digest's, or the fresher
/// one its sidecar reported on the return path, plus this node's pending sends).
fn debug_cluster(state: &SharedState) -> Response<ResponseBody> {
    let now = state.now_ms();
    let view = state.view.load();
    let engine = state.engine.state();
    let entry = lock(&state.entry);
    let peers: Vec<serde_json::Value> = view
        .peers
        .iter()
        .map(|peer| {
            let estimate = peer.digest.as_deref().map(|digest| {
                let input = PeerInput {
                    key: peer.key,
                    digest,
                    digest_received_ms: peer.digest_received_ms,
                    summary: None,
                    offload: None,
                    live: None,
                };
                estimate_json(&entry.estimate(&input, now), now)
            });
            serde_json::json!({
                "node": peer.name,
                "mesh_addr": peer.mesh_addr.to_string(),
                "http_addr": peer.http_addr,
                "version": peer.version,
                "intents": peer.intents,
                "summary_bytes": peer.summary.encoded_bytes(),
                // What its summary advertises: counted, or estimated from a filter's fill.
                "cached_blocks": peer.summary.estimated_blocks(),
                "age_ms": now.saturating_sub(peer.digest_received_ms),
                "digest": peer.digest.as_deref().map(digest_json),
                "estimate": estimate,
            })
        })
        .collect();
    drop(entry);
    let own_intents = state.config.intents.as_deref();
    // Peers whose intents configuration differs from this node's (one of the two may have
    // none): `model: "auto"` gets different models depending on the node a client calls.
    let intents_mismatch: Vec<&str> = view
        .peers
        .iter()
        .filter(|peer| peer.intents.as_deref() != own_intents.map(|i| i.hash.as_str()))
        .map(|peer| peer.name.as_str())
        .collect();
    json(
        StatusCode::OK,
        serde_json::json!({
            "node": state.node_name,
            "mesh_addr": state.mesh.advertise_addr().to_string(),
            "version": env!("CARGO_PKG_VERSION"),
            "cached_blocks": lock(&state.prefixes).blocks(),
            "draining": state.is_draining(),
            "engine": {
                "url": state.engine.client.base_url(),
                "healthy": engine.healthy,
                "last_error": engine.last_error,
            },
            "digest": state.self_digest().map(|(d, _)| digest_json(&d)),
            // Not `age_ms`: scripts count that key to tell how many peers a node sees.
            "digest_age_ms": state.self_digest().map(|(_, built)| now.saturating_sub(built)),
            "intents": own_intents.map(|i| i.describe()),
            "intents_mismatch": intents_mismatch,
            "peers": peers,
        }),
    )
}

fn estimate_json(estimate: &Estimated, now: u64) -> serde_json::Value {
    let report = estimate.last_report.map(|(report, received)| {
        serde_json::json!({
            "digest_version": report.digest_version,
            "running": report.running,
            "waiting": report.waiting,
            "kv_usage": report.kv_usage,
            "queued_tokens": report.queued_tokens,
            "inflight": report.inflight,
            "age_ms": now.saturating_sub(received),
        })
    });
    serde_json::json!({
        "source": estimate.source.as_str(),
        "running": estimate.gauges.running,
        "waiting": estimate.gauges.waiting,
        "kv_usage": estimate.gauges.kv_usage,
        "queued_tokens": estimate.gauges.queued_tokens,
        "pending": estimate.pending,
        "last_report": report,
    })
}

fn digest_json(digest: &kvmesh_protocol::LoadDigest) -> serde_json::Value {
    serde_json::json!({
        "version": digest.version,
        "running": digest.running,
        "waiting": digest.waiting,
        "kv_usage": digest.kv_usage,
        "queued_tokens": digest.queued_tokens,
        "kv_capacity_blocks": digest.kv_capacity_blocks,
        "block_size": digest.block_size,
        "ttft_ewma_ms": digest.ttft_ewma_ms,
        "prefill_tokens_per_s": digest.prefill_tokens_per_s,
        "inflight_forwarded": digest.inflight_forwarded,
        "role": format!("{:?}", digest.role).to_lowercase(),
        "healthy": digest.healthy,
        "models": digest.models,
        "loras": digest.loras,
        "lora_use": {
            "running": digest.lora_use.running,
            "waiting": digest.lora_use.waiting,
            "max_loras": digest.lora_use.max_loras,
        },
    })
}
