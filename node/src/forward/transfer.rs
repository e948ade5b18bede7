//! The bodies of vLLM's NixlConnector protocol, as its proxies build them
//! (`tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`): the prefill leg's request,
//! what its answer carries, and the decode leg's request; and the decode answer's
//! `cached_tokens`, set back to what the prefill engine found cached.

use crate::front::body::{BodyError, ResponseBody};
use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};
use serde_json::{Value, json};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

/// The prefill leg of `request`: one token, not streamed, asking the engine to keep the
/// prompt's KV blocks for a decode engine to pull.
pub fn prefill_body(request: &Value) -> Bytes {
    let mut body = request.clone();
    if let Some(object) = body.as_object_mut() {
        object.insert("stream".into(), Value::Bool(false));
        object.insert("max_tokens".into(), json!(1));
        if object.contains_key("max_completion_tokens") {
            object.insert("max_completion_tokens".into(), json!(1));
        }
        for field in ["stream_options", "min_tokens", "min_completion_tokens"] {
            object.remove(field);
        }
        object.insert(
            "kv_transfer_params".into(),
            json!({
                "do_remote_decode": true,
                "do_remote_prefill": false,
                "remote_engine_id": null,
                "remote_block_ids": null,
                "remote_host": null,
                "remote_port": null,
            }),
        );
    }
    Bytes::from(body.to_string())
}

/// What a prefill leg's answer says.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillAnswer {
    /// Where the decode engine pulls the blocks from; `None` when the engine kept none (the
    /// leg did not stop on its length).
    pub transfer_params: Option<Value>,
    /// Prompt tokens the prefill engine found cached (`usage.prompt_tokens_details`).
    pub cached_tokens: Option<u64>,
}

/// Reads a prefill leg's (non-streamed, JSON) answer.
pub fn read_prefill_answer(body: &[u8]) -> Result<PrefillAnswer, String> {
    let answer: Value =
        serde_json::from_slice(body).map_err(|e| format!("prefill answer is not JSON: {e}"))?;
    let transfer_params = answer
        .get("kv_transfer_params")
        .filter(|params| params.is_object())
        .cloned();
    let cached_tokens = answer
        .pointer("/usage/prompt_tokens_details/cached_tokens")
        .and_then(Value::as_u64);
    Ok(PrefillAnswer {
        transfer_params,
        cached_tokens,
    })
}

/// The decode leg of `request`: the client's request as it came, with the prefill's
/// `kv_transfer_params`.
pub fn decode_body(request: &Value, transfer_params: &Value) -> Bytes {
    let mut body = request.clone();
    if let Some(object) = body.as_object_mut() {
        object.insert("kv_transfer_params".into(), transfer_params.clone());
    }
    Bytes::from(body.to_string())
}

/// Sets `usage.prompt_tokens_details.cached_tokens` in one JSON answer or SSE event to
/// `cached`; anything else is returned as it was.
fn rewrite_cached_tokens(json: &[u8], cached: u64) -> Option<Vec<u8>> {
    let mut value: Value = serde_json::from_slice(json).ok()?;
    let slot = value.pointer_mut("/usage/prompt_tokens_details/cached_tokens")?;
    *slot = json!(cached);
    serde_json::to_vec(&value).ok()
}

/// A decode answer whose `cached_tokens` are the prefill engine's: the decode engine counts
/// every transferred token as cached (vllm-project/router#193), which tells the client
/// nothing about its cache. An event stream passes on event by event (only the one carrying
/// `usage` is rewritten, and nothing waits beyond an event's end); a JSON answer is rewritten
/// whole at its end.
pub struct CachedTokensBody {
    inner: ResponseBody,
    cached: u64,
    sse: bool,
    /// Bytes of an event, or of the JSON answer, not passed on yet.
    pending: BytesMut,
}

impl CachedTokensBody {
    pub fn new(inner: ResponseBody, cached: u64, sse: bool) -> Self {
        Self {
            inner,
            cached,
            sse,
            pending: BytesMut::new(),
        }
    }

    /// The complete events in `pending`, rewritten where they carry usage.
    fn complete_events(&mut self) -> Option<Bytes> {
        let end = self
            .pending
            .windows(2)
            .rposition(|pair| pair == b"\n\n")
            .map(|at| at + 2)?;
        let events = self.pending.split_to(end);
        Some(self.rewrite_events(&events))
    }

    fn rewrite_events(&self, events: &[u8]) -> Bytes {
        if !contains(events, b"cached_tokens") {
            return Bytes::copy_from_slice(events);
        }
        let mut out = Vec::with_capacity(events.len() + 8);
        for line in events.split_inclusive(|&b| b == b'\n') {
            let rewritten = line
                .strip_prefix(b"data: ")
                .filter(|data| contains(data, b"cached_tokens"))
                .and_then(|data| rewrite_cached_tokens(data.trim_ascii_end(), self.cached));
            match rewritten {
                Some(json) => {
                    out.extend_from_slice(b"data: ");
                    out.extend_from_slice(&json);
                    out.push(b'\n');
                }
                None => out.extend_from_slice(line),
            }
        }
        Bytes::from(out)
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

impl Body for CachedTokensBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        loop {
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        this.pending.extend_from_slice(&data);
                        if this.sse
                            && let Some(events) = this.complete_events()
                        {
                            return Poll::Ready(Some(Ok(Frame::data(events))));
                        }
                    }
                    Err(other) => return Poll::Ready(Some(Ok(other))),
                },
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                None if this.pending.is_empty() => return Poll::Ready(None),
                None => {
                    let rest = this.pending.split();
                    let out = match this.sse {
                        true => this.rewrite_events(&rest),
                        false => rewrite_cached_tokens(&rest, this.cached)
                            .map_or_else(|| rest.freeze(), Bytes::from),
                    };
                    return Poll::Ready(Some(Ok(Frame::data(out))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        // Rewriting changes the length.
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    #[test]
    fn the_prefill_leg_asks_for_one_unstreamed_token_and_kept_blocks() {
        let request = json!({"model": "m", "prompt": "hi", "stream": true, "max_tokens": 50,
            "max_completion_tokens": 50, "stream_options": {"include_usage": true},
            "min_tokens": 5, "temperature": 0.2});
        let body: Value = serde_json::from_slice(&prefill_body(&request)).unwrap();
        assert_eq!(body["stream"], false);
        assert_eq!(body["max_tokens"], 1);
        assert_eq!(body["max_completion_tokens"], 1);
        assert_eq!(body["temperature"], 0.2);
        assert!(body.get("stream_options").is_none() && body.get("min_tokens").is_none());
        assert_eq!(body["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(body["kv_transfer_params"]["do_remote_prefill"], false);
        assert!(body["kv_transfer_params"]["remote_block_ids"].is_null());
        let plain = json!({"model": "m", "prompt": "hi"});
        let body: Value = serde_json::from_slice(&prefill_body(&plain)).unwrap();
        assert!(body.get("max_completion_tokens").is_none());
    }

    #[test]
    fn the_decode_leg_is_the_request_with_the_prefills_params() {
        let request = json!({"model": "m", "prompt": "hi", "stream": true, "max_tokens": 50});
        let answer = br#"{"id":"x","choices":[],"usage":{"prompt_tokens":9,
            "prompt_tokens_details":{"cached_tokens":4}},
            "kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e"}}"#;
        let read = read_prefill_answer(answer).unwrap();
        assert_eq!(read.cached_tokens, Some(4));
        let params = read.transfer_params.unwrap();
        let body: Value = serde_json::from_slice(&decode_body(&request, &params)).unwrap();
        assert_eq!(body["stream"], true);
        assert_eq!(body["max_tokens"], 50);
        assert_eq!(body["kv_transfer_params"]["remote_engine_id"], "e");
        let without = read_prefill_answer(br#"{"kv_transfer_params":null}"#).unwrap();
        assert_eq!(without.transfer_params, None);
        assert!(read_prefill_answer(b"<html>").is_err());
    }

    async fn through(chunks: &[&str], sse: bool) -> String {
        let frames: Vec<Result<Frame<Bytes>, BodyError>> = chunks
            .iter()
            .map(|chunk| Ok(Frame::data(Bytes::copy_from_slice(chunk.as_bytes()))))
            .collect();
        let inner = BodyExt::boxed(StreamBody::new(futures::stream::iter(frames)));
        let body = CachedTokensBody::new(inner, 3, sse);
        let bytes = body.collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn cached_tokens_are_the_prefill_engines_in_streams_split_anywhere_and_in_json() {
        let usage = r#"{"choices":[],"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":9}}}"#;
        let stream = format!(
            "data: {{\"choices\":[{{\"text\":\"a\"}}]}}\n\ndata: {usage}\n\ndata: [DONE]\n\n"
        );
        let (head, tail) = stream.split_at(stream.len() / 2 + 7);
        let out = through(&[head, tail], true).await;
        assert!(out.contains(r#""cached_tokens":3"#), "{out}");
        assert!(out.starts_with("data: {\"choices\":[{\"text\":\"a\"}]}\n\n"));
        assert!(out.ends_with("data: [DONE]\n\n"));
        assert_eq!(out.matches("\n\n").count(), 3);
        let json = through(&[&usage[..20], &usage[20..]], false).await;
        let value: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
        // Without usage details, nothing changes.
        let plain = "data: {\"choices\":[]}\n\n";
        assert_eq!(through(&[plain], true).await, plain);
    }
}
