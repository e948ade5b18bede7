//! Relaying an upstream body to the client as it arrives.
//!
//! The client's response body reads the upstream (the engine's body, or the peer's QUIC
//! stream) directly when hyper polls it: no task or channel in between, so an SSE chunk goes
//! out as soon as it arrives and a small answer already complete upstream leaves with its
//! head in one write. When the upstream declared its length, the client gets that
//! `content-length` (a chunked encoding would cost a second write and a second wake-up of
//! the client). If the upstream breaks after the response started, an event stream ends with
//! an OpenAI-style error event (`data: {"error": ...}`); any other body is aborted, which the
//! client sees as a truncated response rather than a silently short one. An upstream silent
//! for longer than the request timeout counts as broken too: an engine that hangs mid-stream
//! must not hold the client forever. If the client goes away, hyper drops the body, which
//! drops the upstream and cancels the engine's request.

use super::entry::{Upstream, UpstreamBody};
use super::headers::is_event_stream;
use crate::engine::Progress;
use crate::front::body::{BodyError, ResponseBody};
use crate::front::errors::ApiError;
use crate::metrics::Outcome;
use crate::serve::engine_queue::HandedOver;
use crate::serve::state::{SharedState, lock};
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame as BodyFrame, SizeHint};
use kvmesh_protocol::lifecycle::Plan;
use kvmesh_protocol::wire::{Frame, FrameDecoder};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// Bytes read from the peer's stream per poll.
const READ_BUFFER: usize = 16 * 1024;

/// Builds the client response for `upstream`; its body relays the upstream. The `inflight`
/// gauge is decremented when the relay ends, and the request's `plan` told that it ended;
/// `reason` labels the outcome metric.
pub fn relay(
    state: SharedState,
    mut upstream: Upstream,
    plan: Plan,
    extra_headers: Vec<(HeaderName, HeaderValue)>,
    reason: &'static str,
) -> Response<ResponseBody> {
    let status = StatusCode::from_u16(upstream.status).unwrap_or(StatusCode::BAD_GATEWAY);
    // Read before the headers are taken for the client's response.
    let sse = is_event_stream(&upstream.headers);
    let upstream_headers = std::mem::take(&mut upstream.headers);
    let body = relay_body(state, upstream, sse, plan, Some(reason));
    let mut response = Response::new(BodyExt::boxed(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for (name, value) in &upstream_headers {
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
    response
}

/// The body of one leg of a disaggregated request that this node reads itself (a prefill's
/// answer): it relays the upstream as [`relay`] does, and tells `plan` when it ended, but it
/// is no client's answer and counts in no request metric.
pub fn leg_body(state: SharedState, upstream: Upstream, plan: Plan) -> ResponseBody {
    let sse = is_event_stream(&upstream.headers);
    BodyExt::boxed(relay_body(state, upstream, sse, plan, None))
}

/// `sse`: the upstream is an event stream (a break then ends it with an error event);
/// `reason`: the request's reason label, when the body is a client's answer.
fn relay_body(
    state: SharedState,
    upstream: Upstream,
    sse: bool,
    plan: Plan,
    reason: Option<&'static str>,
) -> RelayBody {
    let silence_limit = state.config.request_timeout;
    RelayBody {
        silence: Box::pin(tokio::time::sleep(silence_limit)),
        silence_limit,
        sse,
        source: Some(upstream.body),
        first: upstream.first,
        handed: upstream.handed,
        first_byte: false,
        remaining: upstream.content_length,
        ledger: Some(Ledger {
            state,
            plan,
            reason,
            served_by: upstream.served_by,
        }),
    }
}

/// How a relay ended.
enum End {
    Complete,
    ClientGone,
    Broken(String),
}

/// Records the outcome of a relay, once.
struct Ledger {
    state: SharedState,
    plan: Plan,
    /// The request's reason label; `None`: not a client's answer, not counted.
    reason: Option<&'static str>,
    served_by: String,
}

impl Ledger {
    fn close(mut self, end: &End) {
        self.plan.ended(&mut lock(&self.state.entry));
        let outcome = match end {
            End::Complete => Outcome::Answered,
            End::ClientGone => {
                tracing::debug!(
                    served_by = self.served_by,
                    "client went away; upstream cancelled"
                );
                Outcome::Cancelled
            }
            End::Broken(why) => {
                tracing::warn!(served_by = self.served_by, %why, "response broke after it started");
                Outcome::Interrupted
            }
        };
        if let Some(reason) = self.reason {
            self.state.metrics.record_request(reason, outcome);
            self.state.metrics.inflight.dec();
        }
    }
}

struct RelayBody {
    /// Fires when the upstream has sent nothing for `silence_limit`; reset by every chunk.
    silence: Pin<Box<Sleep>>,
    silence_limit: Duration,
    /// `None` once the upstream ended (or broke).
    source: Option<UpstreamBody>,
    /// The first chunk, read before the response started (see `entry::first_byte`).
    first: Option<Option<Bytes>>,
    /// This node's own engine serving it: queued until the answer's first byte, in flight
    /// until the relay ends.
    handed: Option<HandedOver>,
    /// The upstream's first byte came (the request's queue and plan were told).
    first_byte: bool,
    /// Bytes still to come when the upstream declared its length.
    remaining: Option<u64>,
    sse: bool,
    /// `None` once the outcome is recorded.
    ledger: Option<Ledger>,
}

impl RelayBody {
    fn end(&mut self, end: End) {
        self.handed = None;
        if let Some(ledger) = self.ledger.take() {
            ledger.close(&end);
        }
    }

    fn broke(&mut self, why: String) -> Poll<Option<Result<BodyFrame<Bytes>, BodyError>>> {
        self.source = None;
        self.end(End::Broken(why.clone()));
        // An event stream of unknown length can still carry an error event; anything else
        // must look truncated to the client.
        if self.sse && self.remaining.is_none() {
            let event = ApiError::new(
                StatusCode::BAD_GATEWAY,
                format!("upstream failed mid-stream: {why}"),
            );
            return Poll::Ready(Some(Ok(BodyFrame::data(Bytes::from(format!(
                "data: {}\n\n",
                event.body_json()
            ))))));
        }
        Poll::Ready(Some(Err(why.into())))
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<BodyFrame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let Some(source) = this.source.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = match (this.first.take(), source) {
            (Some(first), _) => Poll::Ready(Ok(first)),
            (None, UpstreamBody::Local(incoming, progress)) => poll_local(incoming, progress, cx),
            (None, UpstreamBody::Remote { recv, decoder, .. }) => poll_remote(recv, decoder, cx),
        };
        let Poll::Ready(next) = polled else {
            if this.silence.as_mut().poll(cx).is_ready() {
                let secs = this.silence_limit.as_secs();
                return this.broke(format!("upstream sent nothing for {secs} s"));
            }
            return Poll::Pending;
        };
        let limit = this.silence_limit;
        this.silence.as_mut().reset(Instant::now() + limit);
        if !std::mem::replace(&mut this.first_byte, true) {
            if let Some(handed) = this.handed.as_mut() {
                handed.started();
            }
            if let Some(ledger) = this.ledger.as_mut() {
                ledger.plan.first_byte(&mut lock(&ledger.state.entry));
            }
        }
        match next {
            Ok(Some(data)) => {
                if let Some(remaining) = this.remaining.as_mut() {
                    let Some(left) = remaining.checked_sub(data.len() as u64) else {
                        return this.broke("upstream sent more than its declared length".into());
                    };
                    *remaining = left;
                    if *remaining == 0 {
                        // hyper stops polling once the declared length is written.
                        this.end(End::Complete);
                    }
                }
                Poll::Ready(Some(Ok(BodyFrame::data(data))))
            }
            Ok(None) => {
                if this.remaining.is_some_and(|left| left > 0) {
                    return this.broke("upstream ended before its declared length".into());
                }
                this.source = None;
                this.end(End::Complete);
                Poll::Ready(None)
            }
            Err(why) => this.broke(why),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.source.is_none() || self.remaining == Some(0)
    }

    fn size_hint(&self) -> SizeHint {
        match self.remaining {
            Some(remaining) => SizeHint::with_exact(remaining),
            None => SizeHint::default(),
        }
    }
}

impl Drop for RelayBody {
    fn drop(&mut self) {
        let complete = self.remaining == Some(0);
        if let Some(UpstreamBody::Remote {
            mut recv, mut send, ..
        }) = self.source.take()
        {
            if complete {
                // Take the peer's end-of-stream if it is here already, so dropping the stream
                // does not ask the peer to stop a stream it has finished.
                let mut cx = Context::from_waker(std::task::Waker::noop());
                let _ = recv.poll_read(&mut cx, &mut [0u8; 1]);
            } else {
                // Tell the serving peer at once, so it cancels the engine's request.
                let _ = recv.stop(quinn::VarInt::from_u32(1));
                let _ = send.reset(quinn::VarInt::from_u32(1));
            }
        }
        self.end(End::ClientGone);
    }
}

/// The next data chunk of the engine's body; `None` at its end. Each chunk is a sign that the
/// engine works, noted on `progress`.
pub(super) fn poll_local(
    incoming: &mut hyper::body::Incoming,
    progress: &Progress,
    cx: &mut Context<'_>,
) -> Poll<Result<Option<Bytes>, String>> {
    loop {
        match ready!(Pin::new(&mut *incoming).poll_frame(cx)) {
            None => return Poll::Ready(Ok(None)),
            Some(Err(e)) => return Poll::Ready(Err(format!("engine: {e}"))),
            Some(Ok(frame)) => {
                progress.note();
                if let Ok(data) = frame.into_data() {
                    return Poll::Ready(Ok(Some(data)));
                }
            }
        }
    }
}

/// The next data frame of the peer's stream; `None` when the peer finished it cleanly.
pub(super) fn poll_remote(
    recv: &mut quinn::RecvStream,
    decoder: &mut FrameDecoder,
    cx: &mut Context<'_>,
) -> Poll<Result<Option<Bytes>, String>> {
    loop {
        match decoder.next_frame() {
            Ok(Some(Frame::Data(data))) => return Poll::Ready(Ok(Some(data))),
            Ok(Some(Frame::Error(error))) => {
                return Poll::Ready(Err(format!("{:?}: {}", error.code, error.message)));
            }
            Ok(Some(other)) => return Poll::Ready(Err(format!("unexpected frame {other:?}"))),
            Ok(None) => {}
            Err(e) => return Poll::Ready(Err(format!("invalid frame: {e}"))),
        }
        let mut buffer = [0u8; READ_BUFFER];
        match ready!(recv.poll_read(cx, &mut buffer)) {
            Ok(0) => {
                return Poll::Ready(decoder.finish().map(|()| None).map_err(|e| e.to_string()));
            }
            Ok(read) => decoder.push(&buffer[..read]),
            Err(e) => return Poll::Ready(Err(format!("peer stream: {e}"))),
        }
    }
}
