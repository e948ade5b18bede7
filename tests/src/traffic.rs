//! Client traffic through a sidecar: the four kinds of inference call, each checked for a
//! well-formed answer and for the node that served it.

use std::collections::BTreeMap;
use std::io::Read;
use std::time::Duration;

use serde_json::Value;

use crate::http::Request;
use crate::openai::{CHAT_COMPLETIONS, COMPLETIONS, chat_body, completion_body};
use crate::sidecar::Sidecar;
use crate::sse::SseReader;

/// Bound of one inference call (a small answer from an instant or fast engine).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// One kind of inference call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Completion,
    Chat,
    StreamedCompletion,
    StreamedChat,
}

impl Call {
    pub const ALL: [Call; 4] = [
        Call::Completion,
        Call::Chat,
        Call::StreamedCompletion,
        Call::StreamedChat,
    ];

    pub fn path(self) -> &'static str {
        match self {
            Call::Completion | Call::StreamedCompletion => COMPLETIONS,
            Call::Chat | Call::StreamedChat => CHAT_COMPLETIONS,
        }
    }

    pub fn streamed(self) -> bool {
        matches!(self, Call::StreamedCompletion | Call::StreamedChat)
    }

    /// The `object` of the answer (of each chunk, when streamed).
    pub fn object(self) -> &'static str {
        match self {
            Call::Completion | Call::StreamedCompletion => "text_completion",
            Call::Chat => "chat.completion",
            Call::StreamedChat => "chat.completion.chunk",
        }
    }

    /// The request body. It asks for exactly `max_tokens` tokens (`ignore_eos`, a vLLM
    /// extension the mock engine honours), so an answer's length and duration are known.
    pub fn body(self, model: &str, prompt: &str, max_tokens: u32) -> Value {
        let mut body = match self {
            Call::Completion | Call::StreamedCompletion => {
                completion_body(model, prompt, max_tokens, self.streamed())
            }
            Call::Chat | Call::StreamedChat => {
                chat_body(model, prompt, max_tokens, self.streamed())
            }
        };
        body["ignore_eos"] = Value::Bool(true);
        body
    }

    pub fn request(self, model: &str, prompt: &str, max_tokens: u32) -> Request {
        Request::post_json(self.path(), &self.body(model, prompt, max_tokens)).timeout(CALL_TIMEOUT)
    }
}

/// A successful call: who served it and why.
#[derive(Debug, Clone)]
pub struct Served {
    /// `x-kvmesh-node`
    pub node: String,
    /// `x-kvmesh-reason`
    pub reason: String,
}

/// Makes `call` for `model` through `sidecar` and checks the answer: status 200, the
/// `x-kvmesh-node` and `x-kvmesh-reason` headers, the right `object` and `model`, and for
/// streams OpenAI's SSE framing up to `data: [DONE]`. `Err` says what went wrong.
pub fn try_call(
    sidecar: &Sidecar,
    call: Call,
    model: &str,
    prompt: &str,
) -> Result<Served, String> {
    let what = format!("{call:?} for {model} via {}", sidecar.node_id());
    let mut open = sidecar
        .try_open(call.request(model, prompt, 8))
        .map_err(|error| format!("{what}: {error}"))?;
    if open.status != 200 {
        let mut body = Vec::new();
        let _ = open.read_to_end(&mut body);
        return Err(format!(
            "{what}: HTTP {} {:?}: {}",
            open.status,
            open.headers.0,
            String::from_utf8_lossy(&body)
        ));
    }
    let header = |name: &str| {
        open.header(name)
            .map(str::to_string)
            .ok_or_else(|| format!("{what}: no {name} header in {:?}", open.headers.0))
    };
    let served = Served {
        node: header("x-kvmesh-node")?,
        reason: header("x-kvmesh-reason")?,
    };
    let chunks = if call.streamed() {
        let content_type = open.header("content-type").unwrap_or_default().to_string();
        if !content_type.starts_with("text/event-stream") {
            return Err(format!(
                "{what}: content-type {content_type:?} for a stream"
            ));
        }
        let transcript = SseReader::new(open)
            .read_to_end()
            .map_err(|error| format!("{what}: {error}"))?;
        transcript
            .check_openai_stream(call.object())
            .map_err(|problem| format!("{what}: {problem}"))?
    } else {
        let mut body = Vec::new();
        open.read_to_end(&mut body)
            .map_err(|error| format!("{what}: {error}"))?;
        let answer: Value = serde_json::from_slice(&body).map_err(|error| {
            format!(
                "{what}: not JSON ({error}): {}",
                String::from_utf8_lossy(&body)
            )
        })?;
        if answer["object"] != call.object()
            || answer["choices"].as_array().is_none_or(Vec::is_empty)
        {
            return Err(format!("{what}: unexpected answer {answer}"));
        }
        vec![answer]
    };
    if let Some(chunk) = chunks.iter().find(|chunk| chunk["model"] != model) {
        return Err(format!("{what}: answer names another model: {chunk}"));
    }
    Ok(served)
}

/// [`try_call`], panicking on failure.
pub fn call(sidecar: &Sidecar, call: Call, model: &str, prompt: &str) -> Served {
    try_call(sidecar, call, model, prompt).unwrap_or_else(|problem| panic!("{problem}"))
}

/// Every kind of call for `model`, `rounds` times through each of `entries` (prompts `after
/// ROUND`), each of which must succeed and be served by one of `servers`; how many each
/// served.
pub fn every_call_served_by(
    entries: &[&Sidecar],
    model: &str,
    rounds: usize,
    servers: &[&str],
) -> BTreeMap<String, usize> {
    let mut served_by: BTreeMap<String, usize> = BTreeMap::new();
    for round in 0..rounds {
        for entry in entries {
            for kind in Call::ALL {
                let served = call(entry, kind, model, &format!("after {round}"));
                assert!(
                    servers.contains(&served.node.as_str()),
                    "served by {served:?}, not one of {servers:?}"
                );
                *served_by.entry(served.node).or_default() += 1;
            }
        }
    }
    served_by
}
