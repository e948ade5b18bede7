//! Workloads: what each request of a run asks for.
//!
//! Every workload builds prompts from [`crate::text`] pieces (4 bytes = 1 token for the mock
//! engine), deterministically from the run's seed, so two runs with the same seed send
//! byte-identical requests and shared prefixes are byte-identical prefixes.

pub mod chat;
pub mod gsp;
pub mod hot;
pub mod rag;
pub mod trace;

use std::time::Duration;

use bytes::Bytes;
use serde_json::json;

use crate::rng::mix64;

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

/// A source of requests.
pub trait Workload: Send + Sync {
    /// Short name (`gsp`, `chat`, `rag`, `trace`).
    fn name(&self) -> &'static str;
    /// Number of requests in one pass over the workload, if it has a natural size.
    fn natural_size(&self) -> Option<u64>;
    /// The `index`-th request.
    fn request(&self, index: u64) -> RequestSpec;
    /// Called when request `index` ended; `text` is the generated text on success.
    fn complete(&self, _index: u64, _text: Option<&str>) {}
    /// Whether [`complete`](Self::complete) needs the generated text.
    fn wants_text(&self) -> bool {
        false
    }
    /// Arrival time of request `index` from the workload's own timeline (traces).
    fn arrival(&self, _index: u64) -> Option<Duration> {
        None
    }
}

/// Settings common to every workload's request bodies.
#[derive(Debug, Clone)]
pub struct BodySettings {
    /// `model` field.
    pub model: String,
    /// `stream` (with `stream_options.include_usage` when true).
    pub stream: bool,
    /// Endpoint for prompt-style workloads.
    pub api: Api,
    /// Run seed.
    pub seed: u64,
}

impl BodySettings {
    /// A body for `prompt`, through the configured endpoint (chat wraps it as one user message).
    pub fn prompt_body(&self, prompt: &str, max_tokens: u32) -> Bytes {
        match self.api {
            Api::Completions => self.body(json!({"prompt": prompt}), max_tokens),
            Api::Chat => self.body(
                json!({"messages": [{"role": "user", "content": prompt}]}),
                max_tokens,
            ),
        }
    }

    /// A chat body for `messages` (`(role, content)` pairs), with `user` set when given
    /// (the OpenAI field a router may use for session affinity).
    pub fn chat_body(
        &self,
        messages: &[(&str, &str)],
        max_tokens: u32,
        user: Option<&str>,
    ) -> Bytes {
        let msgs: Vec<_> = messages
            .iter()
            .map(|(r, c)| json!({"role": r, "content": c}))
            .collect();
        let mut v = json!({"messages": msgs});
        if let Some(u) = user {
            v["user"] = json!(u);
        }
        self.body(v, max_tokens)
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

/// A text key from the run seed and a few labels.
pub fn key(seed: u64, parts: &[u64]) -> u64 {
    parts
        .iter()
        .fold(mix64(seed ^ 0x6b76_6d65_7368), |h, &p| mix64(h ^ p))
}

/// A seeded Fisher-Yates permutation of `0..n`.
pub fn permutation(n: usize, seed: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    let mut rng = crate::rng::SplitMix64::new(seed);
    for i in (1..v.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
    v
}
