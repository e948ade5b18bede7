//! One attempt to get a response head for a request, from the local engine or from a peer.

use super::headers::response_headers_from_engine;
use super::relay::{poll_local, poll_remote};
use crate::engine::Progress;
use crate::engine::client::error_chain;
use crate::metrics::{
    ABANDON_ENGINE_UNHEALTHY, ABANDON_PEER_DEAD, ABANDON_PEER_SILENT, NodeMetrics,
};
use crate::serve::engine_queue::HandedOver;
use crate::serve::state::AppState;
use bytes::Bytes;
use http::Method;
use hyper::body::{Body, Incoming};
use kvmesh_protocol::lifecycle::{Failure, LoadReport, Outcome};
use kvmesh_protocol::wire::{Frame, FrameDecoder, RequestHead, WireErrorCode};
use quinn::{RecvStream, SendStream};
use std::net::SocketAddr;
use std::time::Instant;

/// Where an attempt goes.
#[derive(Clone, Debug)]
pub enum Target {
    Local,
    Peer { name: String, addr: SocketAddr },
}

impl Target {
    pub fn name<'a>(&'a self, local_name: &'a str) -> &'a str {
        match self {
            Target::Local => local_name,
            Target::Peer { name, .. } => name,
        }
    }
}

/// A response whose head arrived; the body is still streaming.
pub struct Upstream {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub served_by: String,
    /// The body's length, when the engine declared it (`content-length`).
    pub content_length: Option<u64>,
    pub body: UpstreamBody,
    /// The body's first chunk (`None`: its end), read before the client's head is sent (see
    /// [`first_byte`]); the relay sends it first.
    pub first: Option<Option<Bytes>>,
    /// The serving engine's load as its sidecar reported it with the head (peers only: this
    /// node reads its own engine's live).
    pub report: Option<LoadReport>,
    /// This node's own engine serving it: queued until the body's first byte, in flight until
    /// the relay ends. (A peer serving one counts it itself.)
    pub handed: Option<HandedOver>,
}

pub enum UpstreamBody {
    /// The engine's body, and its progress clock, which each chunk read moves.
    Local(Incoming, Progress),
    Remote {
        recv: RecvStream,
        decoder: FrameDecoder,
        send: SendStream,
    },
}

/// Why an attempt got no response head.
#[derive(Debug)]
pub enum AttemptError {
    /// The serving node declined it (late binding), with its engine's load when it sent it.
    Declined {
        report: Option<LoadReport>,
        message: String,
    },
    /// It failed, in one of the lifecycle's ways.
    Failed { failure: Failure, message: String },
}

impl AttemptError {
    /// A failure before anything was committed to the client: worth the next candidate.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self::failed(Failure::Retryable, message)
    }

    pub fn failed(failure: Failure, message: impl Into<String>) -> Self {
        Self::Failed {
            failure,
            message: message.into(),
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Self::Declined { message, .. } | Self::Failed { message, .. } => message,
        }
    }

    /// The lifecycle's view of it.
    pub fn outcome(&self) -> Outcome {
        match *self {
            Self::Declined { report, .. } => Outcome::Declined(report),
            Self::Failed { failure, .. } => Outcome::Failed(failure),
        }
    }
}

/// Sends the request and waits for the response head.
pub async fn attempt(
    state: &AppState,
    target: &Target,
    head: RequestHead,
    body: Bytes,
    chain: &[u64],
) -> Result<Upstream, AttemptError> {
    let started = Instant::now();
    let result = match target {
        Target::Local => attempt_local(state, head, body, chain).await,
        Target::Peer { name, addr } => attempt_peer(state, name, *addr, head, body).await,
    };
    if result.is_ok() {
        let labels = NodeMetrics::target_labels(matches!(target, Target::Local));
        state
            .metrics
            .forward_latency
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
    }
    result
}

async fn attempt_local(
    state: &AppState,
    head: RequestHead,
    body: Bytes,
    chain: &[u64],
) -> Result<Upstream, AttemptError> {
    if state.refuses_new_requests() {
        return Err(AttemptError::retryable("this node is draining"));
    }
    let handed = state
        .engine_queue
        .admit(&head.admission())
        .map_err(|(reason, _)| AttemptError::Declined {
            // The entry reads this node's own engine live: no report needed.
            report: None,
            message: format!("local engine declined it ({})", reason.as_str()),
        })?;
    // An adapter placed here that the engine lacks is loaded first (see `serving`).
    state
        .ensure_adapter(&head.model)
        .await
        .map_err(|why| AttemptError::retryable(format!("local engine: {why}")))?;
    let method = Method::from_bytes(head.method.as_bytes()).unwrap_or(Method::POST);
    // Until the first byte, an engine that stops answering its poller (frozen, hung) gives
    // the request back to the plan (see `first_byte` for after the head).
    let answer = tokio::select! {
        answer = state.engine.client.send(method, &head.path, &head.headers, body) => answer,
        () = state.engine_stalled() => {
            state.metrics.abandoned(ABANDON_ENGINE_UNHEALTHY, 1);
            return Err(AttemptError::retryable("local engine unhealthy before its first byte"));
        }
    };
    let response = answer.map_err(|e| AttemptError::retryable(format!("local engine: {e}")))?;
    state.engine.client.progress().note();
    state
        .metrics
        .served
        .get_or_create(&NodeMetrics::target_labels(true))
        .inc();
    if response.status().is_success() {
        state.observe_served(chain);
    }
    Ok(Upstream {
        status: response.status().as_u16(),
        headers: response_headers_from_engine(response.headers()),
        served_by: state.node_name.clone(),
        content_length: response.body().size_hint().exact(),
        body: UpstreamBody::Local(response.into_body(), state.engine.client.progress().clone()),
        first: None,
        report: None,
        handed: Some(handed),
    })
}

/// Waits for `upstream`'s first byte (or its end) and keeps it for the relay. Nothing has
/// reached the client before it, so an answer lost until then is a failed attempt the plan
/// may retry elsewhere: the engine turning unhealthy (a frozen or hung engine, here or at
/// the serving peer, which then sends an error frame), the peer declared dead, the upstream
/// breaking, or the request timeout. An engine sends an event stream's head long before its
/// first token, so this is where a stream's request spends its queue and prefill.
pub async fn first_byte(
    state: &AppState,
    target: &Target,
    upstream: &mut Upstream,
) -> Result<(), AttemptError> {
    let body = &mut upstream.body;
    let read = std::future::poll_fn(|cx| match body {
        UpstreamBody::Local(incoming, progress) => poll_local(incoming, progress, cx),
        UpstreamBody::Remote { recv, decoder, .. } => poll_remote(recv, decoder, cx),
    });
    let lost = async {
        match target {
            Target::Local => {
                state.engine_stalled().await;
                ABANDON_ENGINE_UNHEALTHY
            }
            Target::Peer { name, addr } => peer_lost(state, name, *addr).await,
        }
    };
    let first = tokio::select! {
        first = tokio::time::timeout(state.config.request_timeout, read) => first,
        cause = lost => {
            state.metrics.abandoned(cause, 1);
            return Err(AttemptError::retryable(format!("{cause} before the first byte")));
        }
    };
    match first {
        Ok(Ok(first)) => {
            if let Some(handed) = upstream.handed.as_mut() {
                handed.started();
            }
            upstream.first = Some(first);
            Ok(())
        }
        Ok(Err(why)) => Err(AttemptError::retryable(format!(
            "answer broke before its first byte: {why}"
        ))),
        Err(_) => Err(AttemptError::failed(
            Failure::TimedOut,
            "no first byte before the deadline",
        )),
    }
}

/// An attempt on a peer, given up when the peer goes silent or the failure detector declares
/// it dead before it answered: a frozen or partitioned peer holds its requests until the QUIC
/// idle timeout otherwise, while nothing of them has reached the client and another engine
/// can serve them. (A stream that has started is left alone: a peer wrongly declared dead
/// finishes it.)
async fn attempt_peer(
    state: &AppState,
    name: &str,
    addr: SocketAddr,
    head: RequestHead,
    body: Bytes,
) -> Result<Upstream, AttemptError> {
    tokio::select! {
        answered = ask_peer(state, name, addr, head, body) => answered,
        cause = peer_lost(state, name, addr) => {
            state.metrics.abandoned(cause, 1);
            Err(AttemptError::retryable(format!("peer {name}: {cause} before answering")))
        }
    }
}

/// Resolves when the peer `name` at `addr` is lost to a request waiting for it, with why:
/// its connection silent for three keep-alive intervals (`peer_silent`), or declared dead by
/// the failure detector and its connection quiet since (`peer_dead`). The failure detector
/// alone is not enough: on a starved machine it declares busy peers dead, and a request
/// given up on a peer that still works on it is computed twice.
async fn peer_lost(state: &AppState, name: &str, addr: SocketAddr) -> &'static str {
    let mut membership = state.mesh.gossip().watch();
    let dead = async {
        let _ = membership.wait_for(|view| view.get(name).is_none()).await;
        state.mesh.confirm_dead(addr).await;
    };
    tokio::select! {
        () = dead => ABANDON_PEER_DEAD,
        () = state.mesh.peer_silent(addr) => ABANDON_PEER_SILENT,
    }
}

async fn ask_peer(
    state: &AppState,
    name: &str,
    addr: SocketAddr,
    head: RequestHead,
    body: Bytes,
) -> Result<Upstream, AttemptError> {
    let stream = state
        .mesh
        .open_forward_stream(addr)
        .await
        .map_err(|e| AttemptError::retryable(format!("peer {name}: {e}")))?;
    if &*stream.peer_name != name {
        return Err(AttemptError::retryable(format!(
            "peer at {addr} is {} now, not {name}",
            stream.peer_name
        )));
    }
    let (mut send, mut recv) = (stream.send, stream.recv);
    // The body goes to the stream as it is, beside its frame headers: quinn keeps the
    // `Bytes` it is given, so a large body (an image) is not copied into a frame first.
    let mut pieces: Vec<Bytes> = std::iter::once(Frame::RequestHead(head).encode())
        .chain(Frame::data_pieces(body))
        .collect();
    send.write_all_chunks(&mut pieces)
        .await
        .map_err(|e| AttemptError::retryable(format!("peer {name}: {e}")))?;
    send.finish()
        .map_err(|e| AttemptError::retryable(format!("peer {name}: {e}")))?;

    let mut decoder = FrameDecoder::new();
    loop {
        match decoder.next_frame() {
            Ok(Some(Frame::ResponseHead(mut response))) => {
                let content_length = take_content_length(&mut response.headers);
                return Ok(Upstream {
                    status: response.status,
                    headers: response.headers,
                    served_by: response.served_by,
                    content_length,
                    body: UpstreamBody::Remote {
                        recv,
                        decoder,
                        send,
                    },
                    first: None,
                    report: response.load,
                    handed: None,
                });
            }
            Ok(Some(Frame::Error(error))) => {
                let message = format!("peer {name}: {:?}: {}", error.code, error.message);
                if error.code == WireErrorCode::Busy {
                    return Err(AttemptError::Declined {
                        report: error.load,
                        message,
                    });
                }
                let failure = match error.code {
                    WireErrorCode::EngineUnavailable
                    | WireErrorCode::NotAccepting
                    | WireErrorCode::Internal => Failure::Retryable,
                    _ => Failure::Final,
                };
                return Err(AttemptError::failed(failure, message));
            }
            Ok(Some(other)) => {
                return Err(AttemptError::retryable(format!(
                    "peer {name} sent {other:?} before a response head"
                )));
            }
            Ok(None) => {}
            Err(e) => {
                return Err(AttemptError::retryable(format!(
                    "peer {name}: invalid frame: {e}"
                )));
            }
        }
        match recv.read_chunk(64 * 1024, true).await {
            Ok(Some(chunk)) => decoder.push(&chunk.bytes),
            Ok(None) => {
                return Err(AttemptError::retryable(format!(
                    "peer {name} closed the stream without answering"
                )));
            }
            Err(e) => {
                return Err(AttemptError::retryable(format!(
                    "peer {name}: {}",
                    error_chain(&e)
                )));
            }
        }
    }
}

/// Removes the `content-length` the serving peer passes on from its engine and returns it:
/// the relay declares the length itself, from the body it relays.
fn take_content_length(headers: &mut Vec<(String, String)>) -> Option<u64> {
    let mut length = None;
    headers.retain(|(name, value)| {
        if !name.eq_ignore_ascii_case("content-length") {
            return true;
        }
        length = value.trim().parse().ok();
        false
    });
    length
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_length_is_taken_out_of_the_relayed_headers() {
        let mut headers = vec![
            ("content-type".to_owned(), "application/json".to_owned()),
            ("Content-Length".to_owned(), "410".to_owned()),
        ];
        assert_eq!(take_content_length(&mut headers), Some(410));
        assert_eq!(
            headers,
            vec![("content-type".to_owned(), "application/json".to_owned())]
        );
        assert_eq!(take_content_length(&mut headers), None);
        let mut bad = vec![("content-length".to_owned(), "lots".to_owned())];
        assert_eq!(take_content_length(&mut bad), None);
        assert!(bad.is_empty());
    }
}
