//! Relaying an upstream body to the client as it arrives.
//!
//! A pump task moves chunks from the engine (or the peer's QUIC stream) into the client's
//! response body through a small channel, so SSE chunks are never held back. If the upstream
//! breaks after the response started, an event stream ends with an OpenAI-style error event
//! (`data: {"error": ...}`); any other body is aborted, which the client sees as a truncated
//! response rather than a silently short one. If the client goes away, the pump stops and
//! drops the upstream, which cancels the engine's request.

use super::entry::{Upstream, UpstreamBody};
use super::headers::is_event_stream;
use crate::front::body::{BodyError, ResponseBody};
use crate::front::errors::ApiError;
use crate::metrics::Outcome;
use crate::serve::state::SharedState;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame as BodyFrame;
use kvmesh_protocol::wire::Frame;
use tokio::sync::mpsc;

type Chunk = Result<BodyFrame<Bytes>, BodyError>;

/// How a relay ended.
enum End {
    Complete,
    ClientGone,
    Broken(String),
}

/// Builds the client response for `upstream` and starts the pump. `inflight` is decremented
/// when the relay ends; `reason` labels the outcome metric.
pub fn relay(
    state: SharedState,
    upstream: Upstream,
    extra_headers: Vec<(HeaderName, HeaderValue)>,
    reason: &'static str,
) -> Response<ResponseBody> {
    let sse = is_event_stream(&upstream.headers);
    let (tx, rx) = mpsc::channel::<Chunk>(16);
    let body = StreamBody::new(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    }));
    let mut response = Response::new(BodyExt::boxed(body));
    *response.status_mut() =
        StatusCode::from_u16(upstream.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let headers = response.headers_mut();
    for (name, value) in &upstream.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            headers.append(name, value);
        }
    }
    for (name, value) in extra_headers {
        headers.insert(name, value);
    }
    let served_by = upstream.served_by.clone();
    tokio::spawn(async move {
        let end = pump(upstream.body, &tx).await;
        let outcome = match &end {
            End::Complete | End::ClientGone => Outcome::Answered,
            End::Broken(why) => {
                tracing::warn!(served_by, %why, "response broke after it started");
                if sse {
                    let event = ApiError::new(
                        StatusCode::BAD_GATEWAY,
                        format!("upstream failed mid-stream: {why}"),
                    );
                    let text = format!("data: {}\n\n", event.body_json());
                    let _ = tx.send(Ok(BodyFrame::data(Bytes::from(text)))).await;
                } else {
                    let _ = tx.send(Err(why.clone().into())).await;
                }
                Outcome::Interrupted
            }
        };
        if let End::ClientGone = end {
            tracing::debug!(served_by, "client went away; upstream cancelled");
        }
        state.metrics.record_request(reason, outcome);
        state.metrics.inflight.dec();
    });
    response
}

async fn pump(body: UpstreamBody, tx: &mpsc::Sender<Chunk>) -> End {
    match body {
        UpstreamBody::Local(mut incoming) => loop {
            match incoming.frame().await {
                None => return End::Complete,
                Some(Err(e)) => return End::Broken(format!("engine: {e}")),
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    if tx.send(Ok(BodyFrame::data(data))).await.is_err() {
                        return End::ClientGone;
                    }
                }
            }
        },
        UpstreamBody::Remote {
            mut recv,
            mut decoder,
            mut send,
        } => {
            let end = pump_remote(&mut recv, &mut decoder, tx).await;
            if let End::ClientGone = end {
                // Tell the serving peer at once, so it cancels the engine's request.
                let _ = recv.stop(quinn::VarInt::from_u32(1));
                let _ = send.reset(quinn::VarInt::from_u32(1));
            }
            end
        }
    }
}

async fn pump_remote(
    recv: &mut quinn::RecvStream,
    decoder: &mut kvmesh_protocol::wire::FrameDecoder,
    tx: &mpsc::Sender<Chunk>,
) -> End {
    loop {
        loop {
            match decoder.next_frame() {
                Ok(Some(Frame::Data(data))) => {
                    if tx.send(Ok(BodyFrame::data(data))).await.is_err() {
                        return End::ClientGone;
                    }
                }
                Ok(Some(Frame::Error(error))) => {
                    return End::Broken(format!("{:?}: {}", error.code, error.message));
                }
                Ok(Some(other)) => return End::Broken(format!("unexpected frame {other:?}")),
                Ok(None) => break,
                Err(e) => return End::Broken(format!("invalid frame: {e}")),
            }
        }
        let read = tokio::select! {
            read = recv.read_chunk(64 * 1024, true) => read,
            _ = tx.closed() => return End::ClientGone,
        };
        match read {
            Ok(Some(chunk)) => decoder.push(&chunk.bytes),
            Ok(None) => {
                return match decoder.finish() {
                    Ok(()) => End::Complete,
                    Err(e) => End::Broken(e.to_string()),
                };
            }
            Err(e) => return End::Broken(format!("peer stream: {e}")),
        }
    }
}
