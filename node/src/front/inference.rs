//! The request path of the OpenAI inference endpoints, as a pipeline of named steps:
//! read → parse → hash → decide → forward (with retries) → relay.

use super::body::ResponseBody;
use super::disaggregated::Disaggregated;
use super::errors::ApiError;
use super::hashing::{hash_by_model, hash_for_routing};
use super::recent::RecentRequest;
use super::responses::{LearnResponseId, RESPONSES_PATH, previous_response_id};
use crate::forward::attempts::{self, Leg, Unanswered};
use crate::forward::headers::request_headers_for_engine;
use crate::forward::relay::relay;
use crate::metrics::Outcome as MetricOutcome;
use crate::serve::config::ServeConfig;
use crate::serve::routing::{Placement, RouteFailure, Routed, route, route_continuation};
use crate::serve::state::SharedState;
use crate::view::unix_ms;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response};
use kvmesh_protocol::hashing::Endpoint;
use kvmesh_protocol::lifecycle::PdReason;
use kvmesh_protocol::route::node_key;
use kvmesh_protocol::wire::RequestHead;
use kvmesh_protocol::{RequestHashes, RouteReason};
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::Instrument as _;

/// The reason a request for an adapter no engine served is reported with: it went to the
/// engine chosen to load it.
pub const LOAD_ADAPTER_REASON: &str = "lora-load";

/// Header a client may set to keep a conversation on one engine (a soft preference).
pub const SESSION_HEADER: &str = "x-session-id";

/// What kind of inference request a path carries.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Api {
    /// Completions or chat: hashed into a prefix chain, routed cache-aware, disaggregated
    /// where the cluster does.
    Generation(Endpoint),
    /// Any other inference endpoint: routed by model and load.
    ByModel,
}

pub async fn handle(
    state: SharedState,
    request: Request<Incoming>,
    api: Api,
) -> Response<ResponseBody> {
    let request_id = request_id(&state, &request);
    // Every event of this request carries its id, this node, and once decided the reason and
    // the peer of the current attempt (for `--log-format json` and log pipelines).
    let span = tracing::info_span!(
        "request",
        request_id = %request_id,
        node = %state.node_name,
        reason = tracing::field::Empty,
        peer = tracing::field::Empty,
    );
    let mut response = answer(state, request, api, request_id.clone())
        .instrument(span)
        .await;
    // Every answer names its request, refusals and failures included, so that a client's
    // report can be found in the logs of the node it called.
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response
            .headers_mut()
            .entry(HeaderName::from_static("x-request-id"))
            .or_insert(value);
    }
    response
}

async fn answer(
    state: SharedState,
    request: Request<Incoming>,
    api: Api,
    request_id: String,
) -> Response<ResponseBody> {
    let path = request.uri().path().to_owned();
    let (parts, body) = request.into_parts();
    let prepared = async {
        let body = read_body(&parts.headers, body, &state.config).await?;
        let json = parse_json(&body)?;
        let (body, json) = super::intent::resolve(&state, api, body, json)?;
        let (body, json) = super::media::prepare(&state, api, body, json).await?;
        let hashes = match api {
            Api::Generation(endpoint) => hash_for_routing(&state, endpoint, &json).await?,
            Api::ByModel => hash_by_model(&state, &json, body.len())?,
        };
        let streamed = json.get("stream").and_then(serde_json::Value::as_bool) == Some(true);
        Ok::<_, ApiError>((body, json, hashes, streamed))
    };
    let (body, json, hashes, streamed) = match prepared.await {
        Ok(prepared) => prepared,
        Err(error) => {
            state
                .metrics
                .record_request("none", MetricOutcome::Rejected);
            return error.into_response();
        }
    };
    let session = session_key(&parts.headers, &hashes);
    // A client that brings its own `kv_transfer_params` runs its own disaggregation.
    let disaggregate =
        matches!(api, Api::Generation(_)) && json.get("kv_transfer_params").is_none();
    let continued = match path.as_str() {
        RESPONSES_PATH => previous_response_id(&json).map(str::to_owned),
        _ => None,
    };
    let placed = match &continued {
        Some(id) => {
            let home = state.response_homes.home(id);
            route_continuation(&state, &hashes, session, &request_id, home)
                .map(|routed| Placement::Whole { routed, pd: None })
        }
        None => route(&state, &hashes, session, &request_id, disaggregate, None),
    };
    let placement = match placed {
        Ok(placement) => placement,
        Err(failure) => return route_failure(&state, failure, &hashes.model),
    };
    let leg = match continued {
        Some(_) => Leg::Continuation,
        None => Leg::Whole,
    };
    let head = RequestHead {
        request_id: request_id.clone(),
        hop_count: 1,
        deadline_unix_ms: unix_ms() + state.config.request_timeout.as_millis() as u64,
        model: hashes.model.clone(),
        method: "POST".into(),
        path,
        headers: request_headers_for_engine(&parts.headers, &request_id),
        reason: RouteReason::LeastLoaded,
        entry_node: state.node_name.clone(),
        prefix_key: None,
        new_prefix: false,
        prefill_tokens: 0,
        decline_above_tokens: None,
        streamed,
        prefix_samples: Vec::new(),
    };
    match placement {
        Placement::Whole { routed, pd } => {
            let label = pd.map(PdReason::as_str);
            forward_whole(state, routed, head, body, hashes.chain, label, leg).await
        }
        Placement::LoadAdapter { routed } => {
            let label = Some(LOAD_ADAPTER_REASON);
            forward_whole(state, routed, head, body, hashes.chain, label, leg).await
        }
        Placement::Split { prefill } => {
            let request = Disaggregated {
                state,
                head,
                body,
                json,
                hashes,
                session,
            };
            request.serve(prefill).await
        }
    }
}

/// The answer to a request no engine can be found for.
pub(super) fn route_failure(
    state: &SharedState,
    failure: RouteFailure,
    model: &str,
) -> Response<ResponseBody> {
    match failure {
        RouteFailure::UnknownModel(available) => {
            state
                .metrics
                .record_request("none", MetricOutcome::Rejected);
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "The model `{model}` does not exist. Available models: {}",
                    available.join(", ")
                ),
            )
            .with_param("model")
            .into_response()
        }
        RouteFailure::NoTarget(model) => {
            state
                .metrics
                .record_request("none", MetricOutcome::NoTarget);
            ApiError::unavailable(
                format!("no engine serving `{model}` can take requests now"),
                1,
            )
            .into_response()
        }
    }
}

/// Serves a request on one engine: the plan's attempts in order until one answers, whose
/// answer is relayed. `label`: the reason to report instead of the routing reason (why a
/// request was not disaggregated). `leg`: [`Leg::Whole`], or [`Leg::Continuation`] for a
/// stored response looked for.
pub(super) async fn forward_whole(
    state: SharedState,
    routed: Routed,
    mut head: RequestHead,
    body: Bytes,
    chain: Vec<u64>,
    label: Option<&'static str>,
    leg: Leg,
) -> Response<ResponseBody> {
    let started = std::time::Instant::now();
    let decided = label.unwrap_or(routed.plan.reason().as_str());
    match attempts::run(&state, routed, &mut head, &body, &chain, leg).await {
        Ok(answered) => {
            let reason = label.unwrap_or(answered.reason.as_str());
            state.recent.record(RecentRequest {
                at_unix_ms: unix_ms(),
                request_id: head.request_id.clone(),
                model: head.model.clone(),
                reason,
                served_by: Some(answered.upstream.served_by.clone()),
                outcome: "forwarded",
                attempts: answered.attempts,
                head_ms: started.elapsed().as_millis() as u64,
            });
            let extra = response_headers(&answered.upstream.served_by, reason, &head.request_id);
            // A stored response's continuations go where it was stored.
            let learn = head.path == RESPONSES_PATH && answered.upstream.status == 200;
            let node_key = answered.node_key;
            state.metrics.inflight.inc();
            let response = relay(
                state.clone(),
                answered.upstream,
                answered.plan,
                extra,
                reason,
            );
            match learn {
                true => response.map(|body| {
                    let homes = state.response_homes.clone();
                    LearnResponseId::new(body, homes, node_key).boxed()
                }),
                false => response,
            }
        }
        Err(unanswered) => failed(&state, &head, decided, &unanswered, started),
    }
}

/// The answer to a request every attempt of which failed.
pub(super) fn failed(
    state: &SharedState,
    head: &RequestHead,
    reason: &'static str,
    unanswered: &Unanswered,
    started: std::time::Instant,
) -> Response<ResponseBody> {
    state.metrics.record_request(reason, MetricOutcome::Failed);
    state.recent.record(RecentRequest {
        at_unix_ms: unix_ms(),
        request_id: head.request_id.clone(),
        model: head.model.clone(),
        reason,
        served_by: None,
        outcome: "failed",
        attempts: unanswered.attempts,
        head_ms: started.elapsed().as_millis() as u64,
    });
    let status = if unanswered.timed_out {
        StatusCode::GATEWAY_TIMEOUT
    } else {
        StatusCode::BAD_GATEWAY
    };
    let mut response = ApiError::new(
        status,
        format!("every attempt failed: {}", unanswered.failures.join("; ")),
    )
    .into_response();
    response.headers_mut().insert(
        HeaderName::from_static("x-kvmesh-reason"),
        HeaderValue::from_static(reason),
    );
    response
}

pub(super) fn response_headers(
    served_by: &str,
    reason: &'static str,
    request_id: &str,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut headers = vec![(
        HeaderName::from_static("x-kvmesh-reason"),
        HeaderValue::from_static(reason),
    )];
    if let Ok(value) = HeaderValue::from_str(served_by) {
        headers.push((HeaderName::from_static("x-kvmesh-node"), value));
    }
    if let Ok(value) = HeaderValue::from_str(request_id) {
        headers.push((HeaderName::from_static("x-request-id"), value));
    }
    headers
}

/// Reads the whole body, refusing more than the limit (413) before reading it when the client
/// declares its length, and a body that takes longer than the client timeout (408): a client
/// trickling bytes must not hold a connection and its buffer forever.
pub(super) async fn read_body(
    headers: &http::HeaderMap,
    body: Incoming,
    config: &ServeConfig,
) -> Result<Bytes, ApiError> {
    let limit = config.max_body_bytes;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body exceeds the {limit}-byte limit"),
        )
    };
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(too_large());
    }
    let collect = tokio::time::timeout(config.client_timeout, Limited::new(body, limit).collect());
    let Ok(collected) = collect.await else {
        return Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "request body not received within {} s",
                config.client_timeout.as_secs()
            ),
        ));
    };
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(error) => Err(ApiError::bad_request(format!(
            "reading the request body: {error}"
        ))),
    }
}

pub(super) fn parse_json(body: &[u8]) -> Result<serde_json::Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))
}

/// The session: the `x-session-id` header, else the OpenAI `user` field.
fn session_key(headers: &http::HeaderMap, hashes: &RequestHashes) -> Option<u64> {
    headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .or(hashes.user.as_deref())
        .map(node_key)
}

/// The client's `X-Request-Id`, or a fresh one unique to this node.
fn request_id(state: &SharedState, request: &Request<Incoming>) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    if let Some(id) = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        && !id.is_empty()
        && id.len() <= 128
    {
        return id.to_owned();
    }
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("kvmesh-{}-{:x}-{n}", state.node_name, unix_ms())
}
