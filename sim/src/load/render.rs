//! Renders a workload's request (`crate::workload`) as an HTTP request: text, JSON body and
//! session header.
//!
//! A segment becomes its [`crate::text`] (4 bytes = 1 token for the mock engine), so two
//! prompts that share their first segments share their first bytes, and the mock engine's
//! tokens of a prompt are exactly the simulator's tokens of the same request
//! (`crate::workload::segment::tokens`).
//!
//! A message with an attachment (the vision workload) sends a content array: its caption as a
//! text part, the picture as an `image_url` part holding a `data:image/png;base64,…` URL, and
//! its segment as a text part.

use bytes::Bytes;
use serde_json::json;

use crate::workload::{Form, Request, segment, session_id};

/// Which OpenAI endpoint a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// `/v1/completions` with a text prompt.
    Completions,
    /// `/v1/chat/completions` with messages.
    Chat,
}

impl Api {
    /// The request path.
    pub fn path(self) -> &'static str {
        match self {
            Api::Completions => "/v1/completions",
            Api::Chat => "/v1/chat/completions",
        }
    }
}

/// One request to send.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    /// Endpoint.
    pub api: Api,
    /// JSON body.
    pub body: Bytes,
    /// Session id, sent as the `x-session-id` header.
    pub session: Option<String>,
    /// Prompt tokens by construction (the mock engine's count; usage wins when reported).
    pub input_tokens: u64,
    /// Requested output tokens.
    pub output_tokens: u32,
}

/// Settings common to every request body.
#[derive(Debug, Clone)]
pub struct BodySettings {
    /// `model` field.
    pub model: String,
    /// `stream` (with `stream_options.include_usage` when true).
    pub stream: bool,
    /// Endpoint of [`Form::Prompt`] requests (conversations always go to chat completions).
    pub api: Api,
}

impl BodySettings {
    /// The HTTP request for `request`.
    pub fn render(&self, request: &Request) -> RequestSpec {
        let (api, body) = self.body_value(request);
        RequestSpec {
            api,
            body: Bytes::from(serde_json::to_vec(&body).expect("JSON values serialize")),
            session: request.session.map(session_id),
            input_tokens: request.prompt_tokens(),
            output_tokens: request.output_tokens,
        }
    }

    /// The endpoint and JSON body of `request` (what [`Self::render`] serializes).
    pub fn body_value(&self, request: &Request) -> (Api, serde_json::Value) {
        let session = request.session.map(session_id);
        let (api, body) = match request.form {
            Form::Prompt => {
                let prompt = segment::text(&request.segments);
                let body = match self.api {
                    Api::Completions => json!({"prompt": prompt}),
                    Api::Chat => json!({"messages": [{"role": "user", "content": prompt}]}),
                };
                (self.api, body)
            }
            Form::Chat => {
                let messages: Vec<_> = request
                    .segments
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let role = match i {
                            0 => "system",
                            i if i % 2 == 1 => "user",
                            _ => "assistant",
                        };
                        let text = segment::text(&[*s]);
                        let content = match request.attachment(i) {
                            None => json!(text),
                            Some(a) => json!([
                                {"type": "text", "text": segment::text(&[a.caption])},
                                {"type": "image_url", "image_url": {"url": &*a.image.data_url()}},
                                {"type": "text", "text": text},
                            ]),
                        };
                        json!({"role": role, "content": content})
                    })
                    .collect();
                let mut body = json!({"messages": messages});
                if let Some(s) = &session {
                    // The OpenAI field a router may use for session affinity.
                    body["user"] = json!(s);
                }
                (Api::Chat, body)
            }
        };
        (api, self.with_settings(body, request.output_tokens))
    }

    fn with_settings(&self, mut v: serde_json::Value, max_tokens: u32) -> serde_json::Value {
        let obj = v.as_object_mut().expect("constructed as an object");
        obj.insert("model".into(), json!(self.model));
        obj.insert("max_tokens".into(), json!(max_tokens));
        // Fixed output lengths, as benchmark tools do with vLLM.
        obj.insert("ignore_eos".into(), json!(true));
        obj.insert("temperature".into(), json!(0.0));
        obj.insert("stream".into(), json!(self.stream));
        if self.stream {
            obj.insert("stream_options".into(), json!({"include_usage": true}));
        }
        v
    }
}
