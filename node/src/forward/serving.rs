//! The serving side: requests peers forward to this node's engine.
//!
//! A forwarded request is accepted only for this node's own engine, only for the inference
//! paths, and only within the hop limit: a peer can never make this node call another URL or
//! forward again.

use super::forwardable;
use super::headers::response_headers_from_engine;
use crate::engine::client::error_chain;
use crate::mesh::IncomingForward;
use crate::metrics::{ABANDON_ENGINE_UNHEALTHY, NodeMetrics, ReasonLabels};
use crate::serve::state::{InflightGuard, SharedState};
use crate::view::unix_ms;
use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use http::Method;
use http_body_util::BodyExt;
use hyper::body::Body;
use kvmesh_protocol::hashing::{Endpoint, hash_request_seeded};
use kvmesh_protocol::wire::{
    Frame, FrameDecoder, FrameError, MAX_HOPS, RequestHead, ResponseHead, WireError, WireErrorCode,
};
use quinn::{RecvStream, SendStream};
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::Instrument as _;

/// How long a peer may take to send a whole request.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves every forwarded request until the channel closes.
pub async fn serve_forwards(state: SharedState, mut incoming: mpsc::Receiver<IncomingForward>) {
    while let Some(forward) = incoming.recv().await {
        let state = state.clone();
        // The serving side's span carries what the entry's `request` span carries, so that one
        // request can be followed across both nodes' logs by its id.
        let span = tracing::info_span!(
            "forwarded",
            request_id = tracing::field::Empty,
            node = %state.node_name,
            peer = %forward.peer_name,
            reason = tracing::field::Empty,
        );
        let serve = async move {
            if let Err(why) = handle(&state, forward.send, forward.recv).await {
                tracing::debug!(%why, "forwarded request ended early");
            }
        };
        tokio::spawn(serve.instrument(span));
    }
}

async fn handle(
    state: &SharedState,
    mut send: SendStream,
    mut recv: RecvStream,
) -> Result<(), String> {
    let read = tokio::time::timeout(
        REQUEST_READ_TIMEOUT,
        read_request(&mut recv, state.config.max_body_bytes),
    );
    let (head, body) = match read.await {
        Ok(Ok(request)) => {
            let span = tracing::Span::current();
            span.record("request_id", request.0.request_id.as_str());
            span.record("reason", request.0.reason.as_str());
            request
        }
        Ok(Err((reason, error))) => return refuse_bad(state, &mut send, reason, error).await,
        Err(_) => {
            let error = wire_error(WireErrorCode::BadRequest, "request not received in time");
            return refuse_bad(state, &mut send, Some("slow"), error).await;
        }
    };
    if head.hop_count > MAX_HOPS || head.method != "POST" || !forwardable(&head.path) {
        let error = wire_error(
            WireErrorCode::BadRequest,
            &format!(
                "{} {} (hop {}) is not forwardable",
                head.method, head.path, head.hop_count
            ),
        );
        return refuse_bad(state, &mut send, Some("not_forwardable"), error).await;
    }
    if let Some(refusal) = refuse(state, &head) {
        return reply_error(&mut send, refusal).await;
    }
    let _inflight = InflightGuard::new(&state.inflight_forwarded);
    // Counted as queued at this engine until its first byte, in flight until it ends.
    let mut handed = match state.engine_queue.admit(&head.admission()) {
        Ok(handed) => handed,
        Err((reason, report)) => {
            let why = format!("engine queue over the entry's bound ({})", reason.as_str());
            let mut busy = wire_error(WireErrorCode::Busy, &why);
            busy.load = Some(report);
            return reply_error(&mut send, busy).await;
        }
    };
    // An adapter the entry placed here that the engine lacks is loaded first, once for all
    // the requests that need it; the load goes on if this one's entry gives up.
    let loaded = tokio::select! {
        loaded = state.ensure_adapter(&head.model) => loaded,
        _ = send.stopped() => return Err("entry gave up while its adapter loaded".into()),
    };
    if let Err(why) = loaded {
        let error = wire_error(WireErrorCode::EngineUnavailable, &why);
        return reply_error(&mut send, error).await;
    }
    let method = Method::from_bytes(head.method.as_bytes()).unwrap_or(Method::POST);
    let body_for_index = body.clone();
    // The entry may give up while the engine works on the answer (its client hung up):
    // dropping the engine call then closes the engine connection, and vLLM aborts.
    let engine_call = state
        .engine
        .client
        .send(method, &head.path, &head.headers, body);
    // Until the engine's first byte, an engine that stops answering its poller (frozen,
    // hung) gives the request back to the entry, which tries its next engine.
    let answer = tokio::select! {
        answer = engine_call => answer,
        _ = send.stopped() => return Err("entry gave up before the answer".into()),
        () = state.engine_stalled() => return give_back(state, &mut send).await,
    };
    let response = match answer {
        Ok(response) => {
            state.engine.client.progress().note();
            response
        }
        Err(error) => {
            return reply_error(
                &mut send,
                wire_error(WireErrorCode::EngineUnavailable, &error.to_string()),
            )
            .await;
        }
    };
    state
        .metrics
        .served
        .get_or_create(&NodeMetrics::target_labels(false))
        .inc();
    // What the engine now caches is indexed once the answer's first bytes are on their way:
    // hashing the body is not on the request's path.
    let mut to_index = response.status().is_success().then_some(body_for_index);
    let (parts, mut body) = response.into_parts();
    tracing::debug!(status = parts.status.as_u16(), "engine answered");
    let mut headers = response_headers_from_engine(&parts.headers);
    // The entry relays the engine's length to its client (see `relay`).
    if let Some(length) = body.size_hint().exact() {
        headers.push(("content-length".to_owned(), length.to_string()));
    }
    let mut out = BytesMut::new();
    Frame::ResponseHead(ResponseHead {
        status: parts.status.as_u16(),
        headers,
        served_by: state.node_name.clone(),
        load: Some(state.engine_queue.report()),
    })
    .encode_into(&mut out);
    // The head goes at once (its load report is fresh); the entry commits nothing to its
    // client before the first byte, which an unhealthy engine may still give back.
    let mut first_byte = false;
    loop {
        // What the engine has already sent leaves with what is pending in one write (a small
        // answer goes out as one QUIC packet, end of stream included); nothing waits for
        // more: when the engine has nothing ready, what is pending is written first.
        let frame = match body.frame().now_or_never() {
            Some(frame) => frame,
            None if !out.is_empty() => {
                send.write_all(&out).await.map_err(|e| e.to_string())?;
                out.clear();
                index_later(state, &head.path, &mut to_index);
                continue;
            }
            // Stop at once when the entry node stops reading (its client went away):
            // dropping the engine's body closes that connection, and vLLM aborts.
            None => tokio::select! {
                frame = body.frame() => frame,
                _ = send.stopped() => {
                    index_later(state, &head.path, &mut to_index);
                    return Err("entry stopped reading".into());
                }
                () = state.engine_stalled(), if !first_byte => {
                    return give_back(state, &mut send).await;
                }
            },
        };
        first_byte = true;
        handed.started();
        match frame {
            None => break,
            Some(Ok(frame)) => {
                state.engine.client.progress().note();
                if let Ok(data) = frame.into_data() {
                    for frame in Frame::data_frames(data) {
                        frame.encode_into(&mut out);
                    }
                }
            }
            Some(Err(error)) => {
                let error = wire_error(
                    WireErrorCode::Interrupted,
                    &format!("engine: {}", error_chain(&error)),
                );
                let message = error.message.clone();
                Frame::Error(error).encode_into(&mut out);
                let _ = send.write_all(&out).await;
                let _ = send.finish();
                index_later(state, &head.path, &mut to_index);
                return Err(message);
            }
        }
    }
    if !out.is_empty() {
        send.write_all(&out).await.map_err(|e| e.to_string())?;
    }
    let finished = send.finish().map_err(|e| e.to_string());
    index_later(state, &head.path, &mut to_index);
    finished
}

/// Records, in a task of its own, the chain of `body` in this node's cache index (once):
/// spawned after a write, it runs after the QUIC connection has sent that write. In exact mode
/// the engine's own events index it, so the body is not parsed again.
fn index_later(state: &SharedState, path: &str, body: &mut Option<Bytes>) {
    let exact = state.config.kv_events.is_some();
    if let Some(body) = body.take().filter(|_| !exact) {
        let state = state.clone();
        let path = path.to_owned();
        tokio::spawn(async move { state.observe_served(&chain_of(&state, &path, &body)) });
    }
}

/// A forwarded request that could not be read: why, as a reason of `PEER_REFUSAL_REASONS`
/// (`None` when the stream itself was cut, which says nothing of the peer's input), and the
/// error frame the peer gets.
type BadRequest = (Option<&'static str>, WireError);

/// Reads the head and the whole body (the entry node already holds it whole).
async fn read_request(
    recv: &mut RecvStream,
    max_body: usize,
) -> Result<(RequestHead, Bytes), BadRequest> {
    let bad = |reason, message: String| {
        (
            Some(reason),
            wire_error(WireErrorCode::BadRequest, &message),
        )
    };
    let mut decoder = FrameDecoder::new();
    let mut head = None;
    // The data frames as the decoder hands them over, not copied again: the entry sends a
    // body of up to a mebibyte as one frame.
    let mut body = Vec::<Bytes>::new();
    let mut body_len = 0;
    loop {
        while let Some(frame) = decoder.next_frame().map_err(|e| {
            let reason = match e {
                FrameError::TooLarge { .. } => "too_large",
                _ => "malformed",
            };
            bad(reason, format!("invalid frame: {e}"))
        })? {
            match (frame, head.is_some()) {
                (Frame::RequestHead(h), false) => head = Some(h),
                (Frame::Data(data), true) => {
                    body_len += data.len();
                    if body_len > max_body {
                        return Err(bad("too_large", "body over the size limit".into()));
                    }
                    body.push(data);
                }
                (frame, _) => {
                    return Err(bad("malformed", format!("unexpected frame {frame:?}")));
                }
            }
        }
        match recv.read_chunk(64 * 1024, true).await {
            Ok(Some(chunk)) => decoder.push(&chunk.bytes),
            Ok(None) => break,
            Err(e) => {
                let error = wire_error(WireErrorCode::BadRequest, &format!("stream: {e}"));
                return Err((None, error));
            }
        }
    }
    decoder
        .finish()
        .map_err(|e| bad("malformed", e.to_string()))?;
    let head = head.ok_or_else(|| bad("malformed", "no request head".into()))?;
    let body = match body.len() {
        0 | 1 => body.pop().unwrap_or_default(),
        _ => Bytes::from(body.concat()),
    };
    Ok((head, body))
}

/// Refuses a request a peer should not have sent, and counts it by `reason`.
async fn refuse_bad(
    state: &SharedState,
    send: &mut SendStream,
    reason: Option<&'static str>,
    error: WireError,
) -> Result<(), String> {
    if let Some(reason) = reason {
        state
            .metrics
            .peer_requests_refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }
    reply_error(send, error).await
}

/// Why this node will not serve a well-formed `head` now, if it will not.
fn refuse(state: &SharedState, head: &RequestHead) -> Option<WireError> {
    if head.deadline_unix_ms != 0 && head.deadline_unix_ms < unix_ms() {
        return Some(wire_error(
            WireErrorCode::DeadlineExceeded,
            "deadline passed before serving",
        ));
    }
    if state.refuses_new_requests() {
        return Some(wire_error(WireErrorCode::NotAccepting, "node is draining"));
    }
    if !state.engine.state().healthy {
        return Some(wire_error(
            WireErrorCode::EngineUnavailable,
            "engine unhealthy",
        ));
    }
    None
}

/// The chain of a forwarded body, hashed here as the entry hashed it (same cluster config).
fn chain_of(state: &SharedState, path: &str, body: &[u8]) -> Vec<u64> {
    let endpoint = match path {
        "/v1/chat/completions" => Endpoint::ChatCompletions,
        "/v1/completions" => Endpoint::Completions,
        // The other endpoints are routed by model and load: nothing to index.
        _ => return Vec::new(),
    };
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Vec::new();
    };
    // Seeded as the entry seeded it (see `AppState::model_identity`).
    let identity = json
        .get("model")
        .and_then(serde_json::Value::as_str)
        .and_then(|model| state.model_identity(model));
    hash_request_seeded(endpoint, &json, &state.config.hashing, identity.as_deref())
        .map(|hashes| hashes.chain)
        .unwrap_or_default()
}

/// Gives a request whose engine turned unhealthy before its first byte back to the entry,
/// which tries its next engine (nothing has reached the client).
async fn give_back(state: &SharedState, send: &mut SendStream) -> Result<(), String> {
    state.metrics.abandoned(ABANDON_ENGINE_UNHEALTHY, 1);
    let why = "engine unhealthy before its first byte";
    reply_error(send, wire_error(WireErrorCode::EngineUnavailable, why)).await
}

async fn reply_error(send: &mut SendStream, error: WireError) -> Result<(), String> {
    let message = error.message.clone();
    let _ = send.write_all(&Frame::Error(error).encode()).await;
    let _ = send.finish();
    Err(message)
}

fn wire_error(code: WireErrorCode, message: &str) -> WireError {
    WireError {
        code,
        message: message.to_owned(),
        load: None,
    }
}
