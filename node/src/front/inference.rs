//! The request path of the OpenAI inference endpoints, as a pipeline of named steps:
//! read → parse → hash → decide → forward (with retries) → relay.

use super::body::ResponseBody;
use super::errors::ApiError;
use super::hashing::hash_for_routing;
use super::recent::RecentRequest;
use crate::forward::entry;
use crate::forward::headers::request_headers_for_engine;
use crate::forward::relay::relay;
use crate::metrics::Outcome as MetricOutcome;
use crate::serve::config::ServeConfig;
use crate::serve::routing::{RouteFailure, Routed, route};
use crate::serve::state::{SharedState, lock};
use crate::view::unix_ms;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response};
use kvmesh_protocol::hashing::Endpoint;
use kvmesh_protocol::lifecycle::{Outcome, Progress};
use kvmesh_protocol::route::node_key;
use kvmesh_protocol::wire::RequestHead;
use kvmesh_protocol::{RequestHashes, RouteReason};
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::Instrument as _;

/// Header a client may set to keep a conversation on one engine (a soft preference).
pub const SESSION_HEADER: &str = "x-session-id";

pub async fn handle(
    state: SharedState,
    request: Request<Incoming>,
    endpoint: Endpoint,
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
    let mut response = answer(state, request, endpoint, request_id.clone())
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
    endpoint: Endpoint,
    request_id: String,
) -> Response<ResponseBody> {
    let path = request.uri().path().to_owned();
    let (parts, body) = request.into_parts();
    let prepared = async {
        let body = read_body(&parts.headers, body, &state.config).await?;
        let json = parse_json(&body)?;
        let hashes = hash_for_routing(&state, endpoint, &json).await?;
        let streamed = json.get("stream").and_then(serde_json::Value::as_bool) == Some(true);
        Ok::<_, ApiError>((body, hashes, streamed))
    };
    let (body, hashes, streamed) = match prepared.await {
        Ok(prepared) => prepared,
        Err(error) => {
            state
                .metrics
                .record_request("none", MetricOutcome::Rejected);
            return error.into_response();
        }
    };
    let session = session_key(&parts.headers, &hashes);
    let routed = match route(&state, &hashes, session, &request_id) {
        Ok(routed) => routed,
        Err(RouteFailure::UnknownModel(available)) => {
            state
                .metrics
                .record_request("none", MetricOutcome::Rejected);
            return ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "The model `{}` does not exist. Available models: {}",
                    hashes.model,
                    available.join(", ")
                ),
            )
            .with_param("model")
            .into_response();
        }
        Err(RouteFailure::NoTarget(model)) => {
            state
                .metrics
                .record_request("none", MetricOutcome::NoTarget);
            return ApiError::unavailable(
                format!("no engine serving `{model}` can take requests now"),
                1,
            )
            .into_response();
        }
    };
    let head = RequestHead {
        request_id: request_id.clone(),
        hop_count: 1,
        deadline_unix_ms: unix_ms() + state.config.request_timeout.as_millis() as u64,
        model: hashes.model.clone(),
        method: "POST".into(),
        path,
        headers: request_headers_for_engine(&parts.headers, &request_id),
        reason: routed.plan.reason(),
        entry_node: state.node_name.clone(),
        first_block: None,
        new_prefix: false,
        prefill_tokens: 0,
        decline_above_tokens: None,
        streamed,
    };
    forward(state, routed, head, body, hashes.chain, request_id).await
}

/// Makes the plan's attempts in order until one answers with a response head.
async fn forward(
    state: SharedState,
    routed: Routed,
    mut head: RequestHead,
    body: Bytes,
    chain: Vec<u64>,
    request_id: String,
) -> Response<ResponseBody> {
    let Routed { mut plan, targets } = routed;
    let decided = plan.reason();
    let mut failures = Vec::new();
    let mut timed_out = false;
    let started = std::time::Instant::now();
    let mut attempts = 0;
    let model = head.model.clone();
    let recent = |reason: RouteReason, served_by: Option<String>, attempts: u32| RecentRequest {
        at_unix_ms: unix_ms(),
        request_id: request_id.clone(),
        model: model.clone(),
        reason: reason.as_str(),
        served_by,
        outcome: "forwarded",
        attempts,
        head_ms: started.elapsed().as_millis() as u64,
    };
    loop {
        let attempt = plan.next_attempt(&mut lock(&state.entry), &chain, state.now_ms());
        let Some(attempt) = attempt else { break };
        attempts += 1;
        let target = &targets[attempt.candidate];
        let name = target.name(&state.node_name);
        let span = tracing::Span::current();
        span.record("reason", attempt.reason.as_str());
        span.record("peer", name);
        head.reason = attempt.reason;
        head.first_block = attempt.first_block;
        head.new_prefix = attempt.new_prefix;
        head.prefill_tokens = attempt.prefill_tokens;
        head.decline_above_tokens = attempt.decline_above_tokens;
        let sent = tokio::time::timeout(
            state.config.request_timeout,
            entry::attempt(&state, target, head.clone(), body.clone(), &chain),
        );
        let result = match sent.await {
            Ok(result) => result,
            Err(_) => Err(entry::AttemptError::timed_out("deadline exceeded")),
        };
        let outcome = match &result {
            Ok(upstream) => Outcome::Started(upstream.report),
            Err(error) => error.outcome(),
        };
        if matches!(
            outcome,
            Outcome::Started(Some(_)) | Outcome::Declined(Some(_))
        ) {
            state.metrics.load_reports.inc();
        }
        let progress = plan.on_outcome(&mut lock(&state.entry), &chain, outcome, state.now_ms());
        let error = match result {
            Ok(upstream) => {
                tracing::debug!(
                    request_id,
                    served_by = upstream.served_by,
                    reason = attempt.reason.as_str(),
                    matched = plan.matched_blocks(),
                    "forwarded"
                );
                state.recent.record(recent(
                    attempt.reason,
                    Some(upstream.served_by.clone()),
                    attempts,
                ));
                let extra = response_headers(&upstream.served_by, attempt.reason, &request_id);
                state.metrics.inflight.inc();
                return relay(
                    state.clone(),
                    upstream,
                    plan,
                    extra,
                    attempt.reason.as_str(),
                );
            }
            Err(error) => error,
        };
        match &error {
            entry::AttemptError::Declined { message, .. } => {
                state.metrics.attempts_declined.inc();
                tracing::debug!(request_id, target = name, error = message, "declined");
            }
            entry::AttemptError::Failed {
                timed_out: deadline,
                message,
                ..
            } => {
                timed_out |= *deadline;
                tracing::warn!(request_id, target = name, error = message, "attempt failed");
                failures.push(format!("{name}: {message}"));
                if progress == Progress::TryNext {
                    state.metrics.retries.inc();
                }
            }
        }
        if progress != Progress::TryNext {
            break;
        }
    }
    state
        .metrics
        .record_request(decided.as_str(), MetricOutcome::Failed);
    state.recent.record(RecentRequest {
        outcome: "failed",
        ..recent(decided, None, attempts)
    });
    let status = if timed_out {
        StatusCode::GATEWAY_TIMEOUT
    } else {
        StatusCode::BAD_GATEWAY
    };
    let mut response = ApiError::new(
        status,
        format!("every attempt failed: {}", failures.join("; ")),
    )
    .into_response();
    response.headers_mut().insert(
        HeaderName::from_static("x-kvmesh-reason"),
        HeaderValue::from_static(decided.as_str()),
    );
    response
}

fn response_headers(
    served_by: &str,
    reason: RouteReason,
    request_id: &str,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut headers = vec![(
        HeaderName::from_static("x-kvmesh-reason"),
        HeaderValue::from_static(reason.as_str()),
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
