//! The Responses API's stored conversations: a request with `previous_response_id` continues
//! a response one engine stored, and only that engine can serve it (any other answers 404).
//!
//! The entry that relayed a response learns its id from the answer's first bytes (the JSON
//! answer's `id`, or the `response.created` event's `response.id` when streamed) and sends
//! its continuations to the engine that answered. A continuation entering at another node
//! searches: every engine serving the model in rank order, an engine's 404 passing it to the
//! next, the last one's answer the client's whatever it is.

use crate::front::body::{BodyError, ResponseBody};
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

/// The Responses API path.
pub const RESPONSES_PATH: &str = "/v1/responses";
/// Responses remembered per entry node (ids of ~40 bytes: a few MB at most).
const REMEMBERED: usize = 100_000;
/// How far into an answer its id is looked for.
const SNIFF_BYTES: usize = 16 * 1024;
/// Longest id taken from an answer.
const MAX_ID_BYTES: usize = 256;

/// The `previous_response_id` a Responses API body continues, if any.
pub fn previous_response_id(body: &Value) -> Option<&str> {
    body.get("previous_response_id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
}

/// Which node's engine stored each response this node relayed, the oldest forgotten first.
#[derive(Debug, Default)]
pub struct ResponseHomes(Mutex<Homes>);

#[derive(Debug, Default)]
struct Homes {
    by_id: HashMap<String, u64>,
    order: VecDeque<String>,
}

impl ResponseHomes {
    pub fn home(&self, id: &str) -> Option<u64> {
        self.lock().by_id.get(id).copied()
    }

    pub fn remember(&self, id: String, node_key: u64) {
        let mut homes = self.lock();
        if homes.by_id.insert(id.clone(), node_key).is_none() {
            homes.order.push_back(id);
        }
        while homes.order.len() > REMEMBERED {
            if let Some(oldest) = homes.order.pop_front() {
                homes.by_id.remove(&oldest);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Homes> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The first `"id"` string value in `bytes`: a response's own id comes first in both of its
/// shapes (`{"id": …, "object": "response"}`, and the `response.created` event's
/// `{"type": …, "response": {"id": …}}`).
fn first_id(bytes: &[u8]) -> Option<String> {
    let key = b"\"id\"";
    let at = bytes.windows(key.len()).position(|w| w == key)? + key.len();
    let rest = &bytes[at..];
    let colon = rest.iter().position(|&b| !b.is_ascii_whitespace())?;
    let rest = rest[colon..].strip_prefix(b":")?;
    let quote = rest.iter().position(|&b| !b.is_ascii_whitespace())?;
    let rest = rest[quote..].strip_prefix(b"\"")?;
    let end = rest
        .iter()
        .take(MAX_ID_BYTES + 1)
        .position(|&b| b == b'"')?;
    let id = std::str::from_utf8(&rest[..end]).ok()?;
    (!id.is_empty() && !id.contains('\\')).then(|| id.to_owned())
}

/// An answer of the Responses API relayed as it comes, whose id is remembered with the node
/// that answered once its first bytes have shown it.
pub struct LearnResponseId {
    inner: ResponseBody,
    seen: Vec<u8>,
    /// `None` once the id was found or the look given up.
    learn: Option<(Arc<ResponseHomes>, u64)>,
}

impl LearnResponseId {
    pub fn new(inner: ResponseBody, homes: Arc<ResponseHomes>, node_key: u64) -> Self {
        Self {
            inner,
            seen: Vec::new(),
            learn: Some((homes, node_key)),
        }
    }

    fn look(&mut self, data: &[u8]) {
        let Some((homes, node_key)) = &self.learn else {
            return;
        };
        self.seen
            .extend_from_slice(&data[..data.len().min(SNIFF_BYTES - self.seen.len())]);
        if let Some(id) = first_id(&self.seen) {
            homes.remember(id, *node_key);
            self.give_up();
        } else if self.seen.len() >= SNIFF_BYTES {
            self.give_up();
        }
    }

    fn give_up(&mut self) {
        self.learn = None;
        self.seen = Vec::new();
    }
}

impl Body for LearnResponseId {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(Ok(frame)) = &frame
            && let Some(data) = frame.data_ref()
        {
            this.look(data);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};
    use serde_json::json;

    #[test]
    fn the_first_id_of_either_shape_is_the_responses() {
        let whole = br#"{"id": "resp_abc", "object": "response", "output": [{"id": "msg_1"}]}"#;
        assert_eq!(first_id(whole).as_deref(), Some("resp_abc"));
        let streamed = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_x\",\"object\":\"response\"}}\n\n";
        assert_eq!(first_id(streamed).as_deref(), Some("resp_x"));
        assert_eq!(first_id(br#"{"id": 7}"#), None);
        assert_eq!(first_id(br#"{"id":"resp_"#), None, "cut before its end");
        assert_eq!(first_id(b"no id here"), None);
    }

    #[test]
    fn continuations_name_their_response_and_homes_forget_the_oldest() {
        let body = json!({"model": "m", "previous_response_id": "resp_1"});
        assert_eq!(previous_response_id(&body), Some("resp_1"));
        assert_eq!(
            previous_response_id(&json!({"previous_response_id": ""})),
            None
        );
        let homes = ResponseHomes::default();
        for i in 0..=REMEMBERED {
            homes.remember(format!("resp_{i}"), i as u64);
        }
        assert_eq!(homes.home("resp_0"), None);
        assert_eq!(homes.home("resp_1"), Some(1));
        homes.remember("resp_1".into(), 9);
        assert_eq!(homes.home("resp_1"), Some(9));
    }

    #[tokio::test]
    async fn an_id_split_across_chunks_is_learned_and_the_body_passes_unchanged() {
        let answer = r#"{"id":"resp_split","object":"response"}"#;
        let chunks: Vec<Result<Frame<Bytes>, BodyError>> = [&answer[..9], &answer[9..]]
            .iter()
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c.as_bytes()))))
            .collect();
        let inner = BodyExt::boxed(StreamBody::new(futures::stream::iter(chunks)));
        let homes = Arc::new(ResponseHomes::default());
        let body = LearnResponseId::new(inner, homes.clone(), 42);
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(bytes, answer.as_bytes());
        assert_eq!(homes.home("resp_split"), Some(42));
    }
}
