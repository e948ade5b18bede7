//! The Responses API (`POST /v1/responses`, `GET /v1/responses/{id}`): the request, the
//! stored conversations that `previous_response_id` continues, and the response object and
//! its SSE events.
//!
//! Shapes follow vLLM: the request and `ResponsesResponse` in
//! `vllm/entrypoints/openai/responses/protocol.py`; the conversation (`instructions` first,
//! then the stored turn's messages less its system ones, its output as an assistant message,
//! then the new input) in `construct_input_messages` of `responses/utils.py`; the output
//! message, usage, status and errors in `responses/serving.py`; the streamed events of a
//! plain text answer in `responses/simple_streaming_events.py`, written by
//! `responses/api_router.py` as `event: <type>\ndata: <json>\n\n` (no `[DONE]`).
//!
//! vLLM stores responses only with `VLLM_ENABLE_RESPONSES_API_STORE=1`; the mock always
//! does (so `store`, default true, is honoured), keeping the newest [`STORE_CAPACITY`].

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use bytes::{BufMut, Bytes, BytesMut};
use http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::chat_parts::input_image;
use super::errors::ApiError;
use super::openai::{Models, ResolvedModel};
use crate::engine::model::chat_prompt::{ChatTurn, ContentPart};
use crate::engine::model::media::MediaConfig;

/// Responses kept for `previous_response_id`; the oldest goes first (vLLM keeps every one,
/// which it warns is a memory leak).
pub const STORE_CAPACITY: usize = 10_000;

/// `invalid_request_error`: the `type` vLLM's Responses API gives its own errors.
const INVALID_REQUEST: &str = "invalid_request_error";

/// A parsed `/v1/responses` request.
#[derive(Debug, Clone)]
pub struct ResponsesRequest {
    /// Model and adapter.
    pub model: ResolvedModel,
    /// `input` as chat messages (images as media items).
    pub input: Vec<ChatTurn>,
    /// `instructions`: the system message of this turn only.
    pub instructions: Option<String>,
    /// `max_output_tokens`.
    pub max_output_tokens: Option<u32>,
    /// `stream`.
    pub stream: bool,
    /// `store` (default true).
    pub store: bool,
    /// `previous_response_id`.
    pub previous_response_id: Option<String>,
    /// `request_id` (vLLM's extra field, `resp_<uuid>` by default): the response's id.
    pub request_id: Option<String>,
    /// `temperature` and `top_p`, echoed (default 1.0 each, vLLM's defaults).
    pub temperature: f64,
    /// See `temperature`.
    pub top_p: f64,
    /// `metadata`, `user`: echoed.
    pub metadata: Value,
    /// See `metadata`.
    pub user: Value,
    /// `cache_salt`.
    pub cache_salt: Option<String>,
    /// `ignore_eos`.
    pub ignore_eos: bool,
}

#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    model: Option<String>,
    input: Value,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    max_output_tokens: Option<i64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    store: Option<bool>,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    user: Option<Value>,
    #[serde(default)]
    cache_salt: Option<String>,
    #[serde(default)]
    ignore_eos: Option<bool>,
    #[serde(default)]
    background: Option<bool>,
    #[serde(default)]
    prompt: Option<Value>,
}

/// Parses a `/v1/responses` body; `media` sizes its images.
pub fn parse(
    body: &[u8],
    models: &Models,
    media: &MediaConfig,
) -> Result<ResponsesRequest, ApiError> {
    let b: Body = serde_json::from_slice(body)?;
    let model = models.resolve(b.model.as_deref())?;
    if b.prompt.as_ref().is_some_and(|p| !p.is_null()) {
        return Err(ApiError::bad_param(
            "prompt",
            "prompt template is not supported",
        ));
    }
    // vLLM runs background requests only with its store enabled, which the mock does not
    // model as a separate switch: refuse them as a default vLLM does.
    if b.background == Some(true) {
        return Err(ApiError::bad_param(
            "background",
            "kvmesh-sim does not support background responses",
        )
        .with_kind(INVALID_REQUEST));
    }
    let max_output_tokens = match b.max_output_tokens {
        None => None,
        Some(n) if n < 1 => {
            return Err(ApiError::bad_param(
                "max_output_tokens",
                format!("max_tokens must be at least 1, got {n}."),
            ));
        }
        Some(n) => Some(u32::try_from(n).unwrap_or(u32::MAX)),
    };
    Ok(ResponsesRequest {
        model,
        input: input_messages(b.input, &models.served[0], media)?,
        instructions: b.instructions.filter(|s| !s.is_empty()),
        max_output_tokens,
        stream: b.stream.unwrap_or(false),
        store: b.store.unwrap_or(true),
        previous_response_id: b.previous_response_id,
        request_id: b.request_id,
        temperature: b.temperature.unwrap_or(1.0),
        top_p: b.top_p.unwrap_or(1.0),
        metadata: b.metadata.unwrap_or(Value::Null),
        user: b.user.unwrap_or(Value::Null),
        cache_salt: b.cache_salt,
        ignore_eos: b.ignore_eos.unwrap_or(false),
    })
}

/// `input` as messages: a string is one user message; a list holds message items
/// (`{"role", "content"}`, `type` `"message"` or absent) whose content is a string or a list
/// of `input_text` / `output_text` / `input_image` parts.
/// Images are named under `base_model` and sized by `media`, as chat images are.
fn input_messages(
    input: Value,
    base_model: &str,
    media: &MediaConfig,
) -> Result<Vec<ChatTurn>, ApiError> {
    let bad = |m: &str| ApiError::bad_param("input", m.to_owned());
    match input {
        Value::String(s) => Ok(vec![ChatTurn::text("user", s)]),
        Value::Array(items) => items
            .iter()
            .map(|item| {
                let kind = item
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("message");
                if kind != "message" {
                    return Err(bad(&format!(
                        "kvmesh-sim supports only message input items, not {kind:?}"
                    )));
                }
                let role = item
                    .get("role")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("an input message needs a `role`"))?;
                Ok(ChatTurn {
                    role: role.to_owned(),
                    parts: content_parts(item.get("content"), base_model, media)?,
                })
            })
            .collect(),
        _ => Err(bad("input must be a string or a list of input items")),
    }
}

fn content_parts(
    content: Option<&Value>,
    base_model: &str,
    media: &MediaConfig,
) -> Result<Vec<ContentPart>, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![ContentPart::Text(s.clone())]),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|part| match part.get("type").and_then(Value::as_str) {
                Some("input_text" | "output_text" | "text") => {
                    let text = part.get("text").and_then(Value::as_str).unwrap_or("");
                    Ok(ContentPart::Text(text.to_owned()))
                }
                Some("input_image") => input_image(part, base_model, media),
                _ => Err(ApiError::bad_param(
                    "input",
                    "unsupported content part (expected `input_text`, `output_text` or \
                     `input_image`)",
                )),
            })
            .collect(),
        Some(_) => Err(ApiError::bad_param(
            "input",
            "content must be a string or a list of parts",
        )),
    }
}

/// What a stored response leaves for the next turn.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The messages that turn rendered (its system messages included; they are dropped when
    /// continuing, as instructions do not carry over).
    pub messages: Vec<ChatTurn>,
    /// Its output text.
    pub output: String,
    /// The whole response object, for `GET /v1/responses/{id}`.
    pub body: Value,
}

/// Stored responses by id, bounded.
#[derive(Default)]
pub struct ResponseStore {
    inner: Mutex<(HashMap<String, Stored>, VecDeque<String>)>,
}

impl ResponseStore {
    /// Keeps `stored` under `id`, dropping the oldest response beyond [`STORE_CAPACITY`].
    pub fn insert(&self, id: String, stored: Stored) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (map, order) = &mut *g;
        if map.insert(id.clone(), stored).is_none() {
            order.push_back(id);
        }
        while order.len() > STORE_CAPACITY {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
    }

    /// The stored response `id`.
    pub fn get(&self, id: &str) -> Option<Stored> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.0.get(id).cloned()
    }
}

/// vLLM's 400 for a `previous_response_id` not shaped like a response id.
fn invalid_id(id: &str) -> ApiError {
    ApiError::bad_param(
        "response_id",
        format!("Invalid 'response_id': '{id}'. Expected an ID that begins with 'resp'."),
    )
    .with_kind(INVALID_REQUEST)
}

/// vLLM's 404 for a response id it does not hold.
pub fn not_found(id: &str) -> ApiError {
    ApiError {
        param: Some("response_id".into()),
        ..ApiError::not_found(format!("Response with id '{id}' not found."))
    }
    .with_kind(INVALID_REQUEST)
}

/// The stored response `previous_response_id` names, if any.
pub fn previous(store: &ResponseStore, req: &ResponsesRequest) -> Result<Option<Stored>, ApiError> {
    let Some(id) = &req.previous_response_id else {
        return Ok(None);
    };
    if !id.starts_with("resp") {
        return Err(invalid_id(id));
    }
    store.get(id).map(Some).ok_or_else(|| not_found(id))
}

/// The conversation this turn renders: its instructions, then the previous turn's messages
/// less their system ones and its output, then this turn's input. A continued conversation
/// therefore starts with the previous prompt and answer, whose KV the prefix cache holds.
pub fn conversation(req: &ResponsesRequest, prev: Option<&Stored>) -> Vec<ChatTurn> {
    let mut messages = Vec::new();
    if let Some(instructions) = &req.instructions {
        messages.push(ChatTurn::text("system", instructions.clone()));
    }
    if let Some(prev) = prev {
        messages.extend(prev.messages.iter().filter(|m| m.role != "system").cloned());
        if !prev.output.is_empty() {
            messages.push(ChatTurn::text("assistant", prev.output.clone()));
        }
    }
    messages.extend(req.input.iter().cloned());
    messages
}

/// vLLM's 400 for a prompt that leaves no room to generate.
pub fn prompt_too_long(prompt_len: usize, max_model_len: u32) -> ApiError {
    ApiError {
        status: StatusCode::BAD_REQUEST,
        message: format!(
            "The engine prompt length {prompt_len} exceeds the max_model_len {max_model_len}. \
             Please reduce prompt."
        ),
        param: Some("input".into()),
        kind_override: Some(INVALID_REQUEST),
    }
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Prompt tokens.
    pub input: u32,
    /// Prompt tokens served from the prefix cache.
    pub cached: u32,
    /// Generated tokens.
    pub output: u32,
}

/// Everything a response object needs besides its output.
#[derive(Debug, Clone)]
pub struct Meta {
    /// `resp_…`.
    pub id: String,
    /// The output message's id, `msg_…`.
    pub message_id: String,
    /// Unix seconds.
    pub created_at: u64,
    /// The generation's `max_tokens` (vLLM reports the sampling value).
    pub max_output_tokens: u32,
}

/// The response object. `finish` is the engine's finish reason (`None` while in progress);
/// `counts` are `None` until it finished.
pub fn response_object(
    req: &ResponsesRequest,
    meta: &Meta,
    text: &str,
    finish: Option<&str>,
    counts: Option<Counts>,
) -> Value {
    let (status, output) = match finish {
        None => ("in_progress", Vec::new()),
        Some(f) => (
            if f == "length" {
                "incomplete"
            } else {
                "completed"
            },
            vec![message_item(meta, text, "completed")],
        ),
    };
    let incomplete_details = if status == "incomplete" {
        json!({"reason": "max_output_tokens"})
    } else {
        Value::Null
    };
    let usage = counts.map_or(Value::Null, |c| {
        json!({
            "input_tokens": c.input,
            "input_tokens_details": {
                "cached_tokens": c.cached, "input_tokens_per_turn": [c.input],
                "cached_tokens_per_turn": [c.cached],
            },
            "output_tokens": c.output,
            "output_tokens_details": {
                "reasoning_tokens": 0, "tool_output_tokens": 0,
                "output_tokens_per_turn": [c.output], "tool_output_tokens_per_turn": [0],
            },
            "total_tokens": c.input + c.output,
        })
    });
    json!({
        "id": meta.id, "created_at": meta.created_at, "incomplete_details": incomplete_details,
        "instructions": req.instructions, "metadata": req.metadata, "model": req.model.name,
        "object": "response", "output": output, "parallel_tool_calls": true,
        "temperature": req.temperature, "tool_choice": "auto", "tools": [], "top_p": req.top_p,
        "background": false, "max_output_tokens": meta.max_output_tokens,
        "max_tool_calls": null, "previous_response_id": req.previous_response_id,
        "prompt": null, "reasoning": null, "service_tier": "auto", "status": status,
        "text": null, "top_logprobs": null, "truncation": "disabled", "usage": usage,
        "user": req.user, "input_messages": null, "output_messages": null,
    })
}

/// The assistant message holding the output (vLLM's fallback `ResponseOutputMessage`: no
/// content part when the text is empty).
fn message_item(meta: &Meta, text: &str, status: &str) -> Value {
    let content = if text.is_empty() && status == "completed" {
        Vec::new()
    } else {
        vec![json!({"annotations": [], "text": text, "type": "output_text", "logprobs": null})]
    };
    json!({
        "id": meta.message_id, "content": content, "role": "assistant", "status": status,
        "type": "message",
    })
}

/// Writes the SSE events of one streamed response, numbering them in order.
#[derive(Debug, Default)]
pub struct EventWriter {
    next: u64,
}

impl EventWriter {
    fn event(&mut self, out: &mut BytesMut, kind: &str, mut body: Value) {
        if let Value::Object(m) = &mut body {
            m.insert("type".into(), Value::String(kind.to_owned()));
            m.insert("sequence_number".into(), json!(self.next));
        }
        self.next += 1;
        out.put_slice(b"event: ");
        out.put_slice(kind.as_bytes());
        out.put_slice(b"\ndata: ");
        out.put_slice(body.to_string().as_bytes());
        out.put_slice(b"\n\n");
    }

    /// `response.created`, `response.in_progress`, then the output message and its text
    /// part opening.
    pub fn start(&mut self, req: &ResponsesRequest, meta: &Meta) -> Bytes {
        let mut out = BytesMut::new();
        let obj = response_object(req, meta, "", None, None);
        self.event(&mut out, "response.created", json!({"response": obj}));
        self.event(&mut out, "response.in_progress", json!({"response": obj}));
        self.event(
            &mut out,
            "response.output_item.added",
            json!({"output_index": 0, "item": {
                "id": meta.message_id, "type": "message", "role": "assistant", "content": [],
                "status": "in_progress",
            }}),
        );
        self.event(
            &mut out,
            "response.content_part.added",
            json!({"output_index": 0, "item_id": meta.message_id, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
        );
        out.freeze()
    }

    /// One `response.output_text.delta`.
    pub fn delta(&mut self, meta: &Meta, text: &str, out: &mut BytesMut) {
        self.event(
            out,
            "response.output_text.delta",
            json!({"content_index": 0, "output_index": 0, "item_id": meta.message_id,
                "delta": text, "logprobs": []}),
        );
    }

    /// The closing events, ending with `response.completed` carrying `done` (the finished
    /// response object).
    pub fn finish(&mut self, meta: &Meta, text: &str, done: &Value, out: &mut BytesMut) {
        let part =
            json!({"text": text, "type": "output_text", "annotations": [], "logprobs": null});
        self.event(
            out,
            "response.output_text.done",
            json!({"item_id": meta.message_id, "output_index": 0, "content_index": 0,
                "text": text, "logprobs": []}),
        );
        self.event(
            out,
            "response.content_part.done",
            json!({"item_id": meta.message_id, "output_index": 0, "content_index": 0,
                "part": part}),
        );
        self.event(
            out,
            "response.output_item.done",
            json!({"output_index": 0, "item": {
                "id": meta.message_id, "type": "message", "role": "assistant",
                "content": [part], "status": "completed",
            }}),
        );
        self.event(out, "response.completed", json!({"response": done}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models() -> Models {
        Models::new(vec!["m".into()], &[])
    }

    fn meta() -> Meta {
        Meta {
            id: "resp_1".into(),
            message_id: "msg_1".into(),
            created_at: 5,
            max_output_tokens: 16,
        }
    }

    #[test]
    fn input_forms_and_defaults() {
        let r = parse(
            br#"{"input":"hi","model":"m"}"#,
            &models(),
            &MediaConfig::default(),
        )
        .unwrap();
        assert!(r.store && !r.stream);
        assert_eq!(r.input, vec![ChatTurn::text("user", "hi")]);
        let r = parse(
            br#"{"input":[{"role":"developer","content":"be terse"},{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]}],"store":false}"#,
            &models(),
            &MediaConfig::default(),
        )
        .unwrap();
        assert!(!r.store);
        assert_eq!(
            r.input[1].parts,
            [ContentPart::Text("a".into()), ContentPart::Text("b".into())]
        );
        assert_eq!(r.input[0].role, "developer");
    }

    #[test]
    fn input_image_is_a_media_item() {
        let media = MediaConfig {
            tokens_per_item: Some(4),
        };
        let r = parse(
            br#"{"input":[{"role":"user","content":[{"type":"input_text","text":"what?"},
                {"type":"input_image","image_url":"https://x/a.png","uuid":"u"}]}]}"#,
            &models(),
            &media,
        )
        .unwrap();
        match &r.input[0].parts[1] {
            ContentPart::Media(m) => assert_eq!((m.identifier.as_str(), m.tokens), ("u", 4)),
            other => panic!("not media: {other:?}"),
        }
        let e = parse(
            br#"{"input":[{"role":"user","content":[{"type":"input_image"}]}]}"#,
            &models(),
            &media,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input"));
    }

    #[test]
    fn errors_have_vllm_shapes() {
        let e = |b: &[u8]| parse(b, &models(), &MediaConfig::default()).unwrap_err();
        assert_eq!(e(br#"{"input":"a","model":"x"}"#).status, 404);
        assert_eq!(e(br#"{"model":"m"}"#).status, 400);
        assert_eq!(e(br#"{"input":7}"#).param.as_deref(), Some("input"));
        assert_eq!(
            e(br#"{"input":[{"type":"function_call","name":"f"}]}"#).status,
            400
        );
        assert_eq!(
            e(br#"{"input":"a","max_output_tokens":0}"#)
                .param
                .as_deref(),
            Some("max_output_tokens")
        );
        let store = ResponseStore::default();
        let req = parse(
            br#"{"input":"a","previous_response_id":"resp_nope"}"#,
            &models(),
            &MediaConfig::default(),
        )
        .unwrap();
        let e = previous(&store, &req).unwrap_err();
        assert_eq!(e.status, 404);
        assert_eq!(e.kind(), "invalid_request_error");
        assert_eq!(e.message, "Response with id 'resp_nope' not found.");
        let req = parse(
            br#"{"input":"a","previous_response_id":"abc"}"#,
            &models(),
            &MediaConfig::default(),
        )
        .unwrap();
        assert_eq!(previous(&store, &req).unwrap_err().status, 400);
    }

    #[test]
    fn continuation_prepends_the_stored_turn_without_its_instructions() {
        let store = ResponseStore::default();
        let first = parse(
            br#"{"input":"q1","instructions":"sys"}"#,
            &models(),
            &MediaConfig::default(),
        )
        .unwrap();
        let msgs = conversation(&first, None);
        assert_eq!(msgs.len(), 2);
        store.insert(
            "resp_a".into(),
            Stored {
                messages: msgs.clone(),
                output: " the fox".into(),
                body: Value::Null,
            },
        );
        let second = parse(
            br#"{"input":"q2","instructions":"sys","previous_response_id":"resp_a"}"#,
            &models(),
            &MediaConfig::default(),
        )
        .unwrap();
        let prev = previous(&store, &second).unwrap();
        let msgs2 = conversation(&second, prev.as_ref());
        let roles: Vec<&str> = msgs2.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert_eq!(msgs2[..2], msgs[..]);
    }

    #[test]
    fn store_is_bounded() {
        let store = ResponseStore::default();
        for i in 0..STORE_CAPACITY + 3 {
            store.insert(
                format!("resp_{i}"),
                Stored {
                    messages: vec![],
                    output: String::new(),
                    body: Value::Null,
                },
            );
        }
        assert!(store.get("resp_0").is_none());
        assert!(store.get(&format!("resp_{}", STORE_CAPACITY + 2)).is_some());
    }

    #[test]
    fn object_and_events() {
        let req = parse(
            br#"{"input":"hi","max_output_tokens":2}"#,
            &models(),
            &MediaConfig::default(),
        )
        .unwrap();
        let counts = Counts {
            input: 3,
            cached: 0,
            output: 2,
        };
        let done = response_object(&req, &meta(), " the fox", Some("length"), Some(counts));
        assert_eq!(done["status"], "incomplete");
        assert_eq!(done["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(done["output"][0]["content"][0]["text"], " the fox");
        assert_eq!(done["usage"]["total_tokens"], 5);
        let mut w = EventWriter::default();
        let mut all = BytesMut::from(&w.start(&req, &meta())[..]);
        w.delta(&meta(), " the", &mut all);
        w.finish(&meta(), " the", &done, &mut all);
        let text = String::from_utf8(all.to_vec()).unwrap();
        let kinds: Vec<&str> = text
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("event: "))
            .map(|e| e.split('\n').next().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let last: Value =
            serde_json::from_str(text.trim_end().rsplit("data: ").next().unwrap()).unwrap();
        assert_eq!(last["sequence_number"], 8);
        assert_eq!(last["response"]["status"], "incomplete");
    }
}
