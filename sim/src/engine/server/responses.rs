//! Response bodies and SSE chunks, field for field as vLLM's pydantic models serialise them.

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;
use serde_json::Value;

use super::openai::Endpoint;

/// Token counts of a response.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// `prompt_tokens + completion_tokens`.
    pub total_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// `{"cached_tokens": n}` when prompt token details are enabled, else `null`.
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
}

/// What is common to every body of one response.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    /// `cmpl-…` or `chatcmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// Model name as requested.
    pub model: String,
    /// Endpoint, which decides the shapes.
    pub endpoint: Endpoint,
}

/// One finished choice of a non-streaming response.
#[derive(Debug, Clone)]
pub struct ChoiceResult {
    /// Generated text.
    pub text: String,
    /// `stop` or `length` (or `abort`).
    pub finish_reason: &'static str,
}

/// The non-streaming response body.
pub fn full_response(
    meta: &ResponseMeta,
    choices: &[ChoiceResult],
    usage: Usage,
    kv_transfer_params: Option<Value>,
) -> Bytes {
    #[derive(Serialize)]
    struct CompletionChoice<'a> {
        index: usize,
        text: &'a str,
        logprobs: Option<()>,
        finish_reason: &'a str,
        stop_reason: Option<()>,
        prompt_logprobs: Option<()>,
    }
    #[derive(Serialize)]
    struct Completion<'a> {
        id: &'a str,
        object: &'static str,
        created: u64,
        model: &'a str,
        choices: Vec<CompletionChoice<'a>>,
        usage: Usage,
        kv_transfer_params: Option<Value>,
    }
    #[derive(Serialize)]
    struct Message<'a> {
        role: &'static str,
        content: &'a str,
        refusal: Option<()>,
        annotations: Option<()>,
        audio: Option<()>,
        function_call: Option<()>,
        tool_calls: [(); 0],
        reasoning_content: Option<()>,
    }
    #[derive(Serialize)]
    struct ChatChoice<'a> {
        index: usize,
        message: Message<'a>,
        logprobs: Option<()>,
        finish_reason: &'a str,
        stop_reason: Option<()>,
    }
    #[derive(Serialize)]
    struct Chat<'a> {
        id: &'a str,
        object: &'static str,
        created: u64,
        model: &'a str,
        choices: Vec<ChatChoice<'a>>,
        service_tier: Option<()>,
        system_fingerprint: Option<()>,
        usage: Usage,
        prompt_logprobs: Option<()>,
        kv_transfer_params: Option<Value>,
    }
    let bytes = match meta.endpoint {
        Endpoint::Completions => serde_json::to_vec(&Completion {
            id: &meta.id,
            object: "text_completion",
            created: meta.created,
            model: &meta.model,
            choices: choices
                .iter()
                .enumerate()
                .map(|(index, c)| CompletionChoice {
                    index,
                    text: &c.text,
                    logprobs: None,
                    finish_reason: c.finish_reason,
                    stop_reason: None,
                    prompt_logprobs: None,
                })
                .collect(),
            usage,
            kv_transfer_params,
        }),
        Endpoint::Chat => serde_json::to_vec(&Chat {
            id: &meta.id,
            object: "chat.completion",
            created: meta.created,
            model: &meta.model,
            choices: choices
                .iter()
                .enumerate()
                .map(|(index, c)| ChatChoice {
                    index,
                    message: Message {
                        role: "assistant",
                        content: &c.text,
                        refusal: None,
                        annotations: None,
                        audio: None,
                        function_call: None,
                        tool_calls: [],
                        reasoning_content: None,
                    },
                    logprobs: None,
                    finish_reason: c.finish_reason,
                    stop_reason: None,
                })
                .collect(),
            service_tier: None,
            system_fingerprint: None,
            usage,
            prompt_logprobs: None,
            kv_transfer_params,
        }),
    };
    Bytes::from(bytes.expect("plain structs serialize"))
}

/// One SSE event: `data: <json>\n\n`.
fn sse(json: Vec<u8>) -> Bytes {
    let mut b = BytesMut::with_capacity(json.len() + 8);
    b.put_slice(b"data: ");
    b.put_slice(&json);
    b.put_slice(b"\n\n");
    b.freeze()
}

/// An error event inside a stream: `data: {"error": {...}}` (vLLM's
/// `create_streaming_error_response`).
pub fn sse_error(error: &super::errors::ApiError) -> Bytes {
    sse(error.body_bytes().to_vec())
}

/// The SSE terminator.
pub fn sse_done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

/// The first chat chunk of a choice, carrying the assistant role.
pub fn chat_role_chunk(meta: &ResponseMeta, index: u32) -> Bytes {
    #[derive(Serialize)]
    struct Delta {
        role: &'static str,
        content: &'static str,
    }
    chat_chunk(
        meta,
        index,
        Delta {
            role: "assistant",
            content: "",
        },
        None,
    )
}

/// A chunk carrying generated text (and the finish reason on a choice's last chunk).
pub fn token_chunk(meta: &ResponseMeta, index: u32, text: &str, finish: Option<&str>) -> Bytes {
    match meta.endpoint {
        Endpoint::Completions => {
            #[derive(Serialize)]
            struct Choice<'a> {
                index: u32,
                text: &'a str,
                logprobs: Option<()>,
                finish_reason: Option<&'a str>,
                stop_reason: Option<()>,
            }
            #[derive(Serialize)]
            struct Chunk<'a> {
                id: &'a str,
                object: &'static str,
                created: u64,
                model: &'a str,
                choices: [Choice<'a>; 1],
                usage: Option<()>,
            }
            sse(serde_json::to_vec(&Chunk {
                id: &meta.id,
                object: "text_completion",
                created: meta.created,
                model: &meta.model,
                choices: [Choice {
                    index,
                    text,
                    logprobs: None,
                    finish_reason: finish,
                    stop_reason: None,
                }],
                usage: None,
            })
            .expect("plain structs serialize"))
        }
        Endpoint::Chat => {
            #[derive(Serialize)]
            struct Delta<'a> {
                content: &'a str,
            }
            chat_chunk(meta, index, Delta { content: text }, finish)
        }
    }
}

fn chat_chunk<D: Serialize>(
    meta: &ResponseMeta,
    index: u32,
    delta: D,
    finish: Option<&str>,
) -> Bytes {
    #[derive(Serialize)]
    struct Choice<'a, D> {
        index: u32,
        delta: D,
        logprobs: Option<()>,
        finish_reason: Option<&'a str>,
    }
    #[derive(Serialize)]
    struct Chunk<'a, D> {
        id: &'a str,
        object: &'static str,
        created: u64,
        model: &'a str,
        choices: [Choice<'a, D>; 1],
    }
    sse(serde_json::to_vec(&Chunk {
        id: &meta.id,
        object: "chat.completion.chunk",
        created: meta.created,
        model: &meta.model,
        choices: [Choice {
            index,
            delta,
            logprobs: None,
            finish_reason: finish,
        }],
    })
    .expect("plain structs serialize"))
}

/// The usage chunk sent before `[DONE]` with `stream_options.include_usage`.
pub fn usage_chunk(meta: &ResponseMeta, usage: Usage) -> Bytes {
    #[derive(Serialize)]
    struct Chunk<'a> {
        id: &'a str,
        object: &'static str,
        created: u64,
        model: &'a str,
        choices: [(); 0],
        usage: Usage,
    }
    let object = match meta.endpoint {
        Endpoint::Completions => "text_completion",
        Endpoint::Chat => "chat.completion.chunk",
    };
    sse(serde_json::to_vec(&Chunk {
        id: &meta.id,
        object,
        created: meta.created,
        model: &meta.model,
        choices: [],
        usage,
    })
    .expect("plain structs serialize"))
}
