//! Renders a workload's request (`crate::workload`) as an HTTP request: text, JSON body and
//! session header.
//!
//! A segment becomes its [`crate::text`] (4 bytes = 1 token for the mock engine), so two
//! prompts that share their first segments share their first bytes, and the mock engine's
//! tokens of a prompt are exactly the simulator's tokens of the same request
//! (`crate::workload::segment::tokens`).

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
        let max_tokens = request.output_tokens;
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
                        json!({"role": role, "content": segment::text(&[*s])})
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
        RequestSpec {
            api,
            body: self.body(body, max_tokens),
            session,
            input_tokens: request.prompt_tokens(),
            output_tokens: max_tokens,
        }
    }

    fn body(&self, mut v: serde_json::Value, max_tokens: u32) -> Bytes {
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
        Bytes::from(serde_json::to_vec(&v).expect("JSON values serialize"))
    }
}
