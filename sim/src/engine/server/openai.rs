//! OpenAI / vLLM request bodies, parsed into what the engine needs.
//!
//! Unknown fields are accepted and ignored, as vLLM does; sampling parameters the mock has no
//! use for (`temperature`, `top_p`, `stop`, ...) are therefore accepted too.

use serde::Deserialize;
use serde_json::Value;

use super::chat_parts::content_part;
use super::errors::ApiError;
use crate::engine::model::LoraRef;
use crate::engine::model::chat_prompt::{ChatPrompt, ChatTurn, ContentPart, render_chat_prompt};
use crate::engine::model::media::{MediaConfig, MediaItem};
use crate::engine::model::tokenizer::{is_known_token, tokenize};

/// A resolved model: its name and the adapter to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedModel {
    /// The name echoed in responses.
    pub name: String,
    /// The adapter, for a LoRA name.
    pub lora: Option<LoraRef>,
}

/// A LoRA adapter the server knows (vLLM's `LoRARequest`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraAdapter {
    /// The name requests use as `model`.
    pub name: String,
    /// Where its weights are (`root` in `/v1/models`).
    pub path: String,
    /// vLLM's integer adapter id: 1-based, in the order adapters were added.
    pub id: u32,
}

/// The models the server answers to.
#[derive(Debug, Clone)]
pub struct Models {
    /// Served names of the base model (the first one names metrics).
    pub served: Vec<String>,
    /// LoRA adapters, in the order they were added.
    pub loras: Vec<LoraAdapter>,
    /// The last adapter id handed out (vLLM's `lora_id_counter`: ids are never reused).
    last_lora_id: u32,
}

impl Models {
    /// The base model's names and the `--lora` adapters, whose path is their name.
    pub fn new(served: Vec<String>, loras: &[String]) -> Self {
        let mut m = Self {
            served,
            loras: Vec::new(),
            last_lora_id: 0,
        };
        for name in loras {
            if m.lora(name).is_none() {
                m.add_lora(name, name);
            }
        }
        m
    }

    /// The known adapter named `name`.
    pub fn lora(&self, name: &str) -> Option<&LoraAdapter> {
        self.loras.iter().find(|l| l.name == name)
    }

    /// Adds an adapter, or points a known one at `path` keeping its id (vLLM's
    /// `load_inplace`). Returns its id.
    pub fn add_lora(&mut self, name: &str, path: &str) -> u32 {
        if let Some(l) = self.loras.iter_mut().find(|l| l.name == name) {
            l.path = path.to_owned();
            return l.id;
        }
        self.last_lora_id += 1;
        self.loras.push(LoraAdapter {
            name: name.to_owned(),
            path: path.to_owned(),
            id: self.last_lora_id,
        });
        self.last_lora_id
    }

    /// Forgets an adapter. Returns whether it was known.
    pub fn remove_lora(&mut self, name: &str) -> bool {
        let before = self.loras.len();
        self.loras.retain(|l| l.name != name);
        self.loras.len() != before
    }

    /// Resolves the request's `model` field (absent = the first served name).
    pub fn resolve(&self, model: Option<&str>) -> Result<ResolvedModel, ApiError> {
        let Some(name) = model else {
            return Ok(ResolvedModel {
                name: self.served[0].clone(),
                lora: None,
            });
        };
        if self.served.iter().any(|m| m == name) {
            return Ok(ResolvedModel {
                name: name.to_owned(),
                lora: None,
            });
        }
        if let Some(l) = self.lora(name) {
            return Ok(ResolvedModel {
                name: name.to_owned(),
                lora: Some(LoraRef {
                    id: l.id,
                    name: name.to_owned(),
                }),
            });
        }
        let available: Vec<&str> = self
            .served
            .iter()
            .map(String::as_str)
            .chain(self.loras.iter().map(|l| l.name.as_str()))
            .collect();
        Err(ApiError {
            param: Some("model".into()),
            ..ApiError::not_found(format!(
                "The model `{name}` does not exist. Available models: {}.",
                available.join(", ")
            ))
        })
    }
}

/// Which OpenAI endpoint a generation came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

/// A parsed generation request.
#[derive(Debug, Clone)]
pub struct Generation {
    /// Endpoint it came in on.
    pub endpoint: Endpoint,
    /// Model and adapter.
    pub model: ResolvedModel,
    /// One token-id prompt per choice (a completions batch has several).
    pub prompts: Vec<Vec<u32>>,
    /// The media items of a chat's prompt (a chat has one prompt), in prompt order; empty
    /// for completions.
    pub media: Vec<MediaItem>,
    /// `max_tokens` (or `max_completion_tokens`) as given.
    pub max_tokens: Option<u32>,
    /// `min_tokens`.
    pub min_tokens: u32,
    /// `ignore_eos`.
    pub ignore_eos: bool,
    /// `cache_salt`.
    pub cache_salt: Option<String>,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `kv_transfer_params`: an object, or `None` when absent or null. Only a KV connector
    /// reads it.
    pub kv_transfer_params: Option<Value>,
}

/// A prompt as the completions API (and the pooling APIs' `input`) takes it: a string, a
/// list of strings, a list of token ids or a list of token-id lists.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenBatch(Vec<Vec<u32>>),
}

#[derive(Deserialize, Default)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct CompletionBody {
    #[serde(default)]
    model: Option<String>,
    prompt: PromptInput,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(flatten)]
    common: CommonFields,
}

#[derive(Deserialize)]
struct ChatBody {
    #[serde(default)]
    model: Option<String>,
    messages: Vec<MessageBody>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(flatten)]
    common: CommonFields,
}

#[derive(Deserialize)]
struct CommonFields {
    #[serde(default)]
    min_tokens: Option<u32>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    n: Option<u32>,
    #[serde(default)]
    ignore_eos: Option<bool>,
    #[serde(default)]
    cache_salt: Option<String>,
    #[serde(default)]
    kv_transfer_params: Option<Value>,
}

/// One chat message as a request carries it.
#[derive(Deserialize)]
pub(super) struct MessageBody {
    pub(super) role: String,
    #[serde(default)]
    pub(super) content: Option<Value>,
}

#[derive(Deserialize)]
struct TokenizeBody {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    messages: Option<Vec<MessageBody>>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
}

/// Parses a `/v1/completions` body.
pub fn parse_completion(body: &[u8], models: &Models) -> Result<Generation, ApiError> {
    let b: CompletionBody = serde_json::from_slice(body)?;
    let model = models.resolve(b.model.as_deref())?;
    let prompts = prompt_tokens(b.prompt, "prompt")?;
    finish(
        Endpoint::Completions,
        model,
        (prompts, Vec::new()),
        b.max_tokens,
        b.common,
    )
}

/// The token ids of each prompt of `input`, none of them empty. `param` names the field in
/// errors.
pub(super) fn prompt_tokens(input: PromptInput, param: &str) -> Result<Vec<Vec<u32>>, ApiError> {
    let prompts = match input {
        PromptInput::Text(s) => vec![tokenize(&s)],
        PromptInput::Texts(v) => v.iter().map(|s| tokenize(s)).collect(),
        PromptInput::Tokens(t) => vec![t],
        PromptInput::TokenBatch(v) => v,
    };
    if prompts.is_empty() {
        return Err(ApiError::bad_param(
            param,
            format!("{param} must not be an empty list"),
        ));
    }
    if prompts.iter().any(Vec::is_empty) {
        return Err(ApiError::bad_param(param, "Prompt cannot be empty"));
    }
    Ok(prompts)
}

/// Parses a `/v1/chat/completions` body with media sized by default (as without
/// `--media-tokens-per-item`).
pub fn parse_chat(body: &[u8], models: &Models) -> Result<Generation, ApiError> {
    parse_chat_with_media(body, models, &MediaConfig::default())
}

/// Parses a `/v1/chat/completions` body; `media` sizes its media items.
pub fn parse_chat_with_media(
    body: &[u8],
    models: &Models,
    media: &MediaConfig,
) -> Result<Generation, ApiError> {
    let b: ChatBody = serde_json::from_slice(body)?;
    let model = models.resolve(b.model.as_deref())?;
    if b.messages.is_empty() {
        return Err(ApiError::bad_param(
            "messages",
            "messages must not be empty",
        ));
    }
    let prompt = render_messages(
        &b.messages,
        b.add_generation_prompt.unwrap_or(true),
        models,
        media,
    )?;
    let max_tokens = b.max_completion_tokens.or(b.max_tokens);
    finish(
        Endpoint::Chat,
        model,
        (vec![prompt.tokens], prompt.media),
        max_tokens,
        b.common,
    )
}

/// Parses a `/tokenize` body into token ids: the same ids the engine caches on, media
/// placeholders expanded.
pub fn parse_tokenize(
    body: &[u8],
    models: &Models,
    media: &MediaConfig,
) -> Result<Vec<u32>, ApiError> {
    let b: TokenizeBody = serde_json::from_slice(body)?;
    models.resolve(b.model.as_deref())?;
    match (b.prompt, b.messages) {
        (Some(p), None) => Ok(tokenize(&p)),
        (None, Some(m)) => {
            Ok(render_messages(&m, b.add_generation_prompt.unwrap_or(true), models, media)?.tokens)
        }
        _ => Err(ApiError::bad_request(
            "exactly one of `prompt` and `messages` is required",
        )),
    }
}

/// `/detokenize`'s body (vLLM's `DetokenizeRequest`: `model`, `tokens`).
#[derive(Deserialize)]
struct DetokenizeBody {
    #[serde(default)]
    model: Option<String>,
    tokens: Vec<u32>,
}

/// Parses a `/detokenize` body into its token ids, each checked against the vocabulary (media
/// placeholders included: `/tokenize` returns them).
pub fn parse_detokenize(body: &[u8], models: &Models) -> Result<Vec<u32>, ApiError> {
    let b: DetokenizeBody = serde_json::from_slice(body)?;
    models.resolve(b.model.as_deref())?;
    if let Some(bad) = b.tokens.iter().find(|&&t| !is_known_token(t)) {
        return Err(ApiError::bad_param(
            "tokens",
            format!("Token id {bad} is out of vocabulary"),
        ));
    }
    Ok(b.tokens)
}

fn finish(
    endpoint: Endpoint,
    model: ResolvedModel,
    (prompts, media): (Vec<Vec<u32>>, Vec<MediaItem>),
    max_tokens: Option<u32>,
    c: CommonFields,
) -> Result<Generation, ApiError> {
    if c.n.unwrap_or(1) != 1 {
        return Err(ApiError::bad_param("n", "kvmesh-sim supports only n=1"));
    }
    let stream = c.stream.unwrap_or(false);
    if c.stream_options.is_some() && !stream {
        return Err(ApiError::bad_param(
            "stream_options",
            "Stream options can only be defined when `stream=True`.",
        ));
    }
    if max_tokens == Some(0) {
        return Err(ApiError::bad_param(
            "max_tokens",
            "max_tokens must be at least 1, got 0.",
        ));
    }
    Ok(Generation {
        endpoint,
        model,
        prompts,
        media,
        max_tokens,
        min_tokens: c.min_tokens.unwrap_or(0),
        ignore_eos: c.ignore_eos.unwrap_or(false),
        cache_salt: c.cache_salt,
        stream,
        include_usage: c
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        kv_transfer_params: kv_transfer_params(c.kv_transfer_params)?,
    })
}

/// vLLM's request models type `kv_transfer_params` as an optional dict, whatever the
/// connector: anything else is a validation error.
fn kv_transfer_params(params: Option<Value>) -> Result<Option<Value>, ApiError> {
    match params {
        None | Some(Value::Null) => Ok(None),
        Some(p @ Value::Object(_)) => Ok(Some(p)),
        Some(_) => Err(ApiError::bad_param(
            "kv_transfer_params",
            "kv_transfer_params must be an object",
        )),
    }
}

/// Renders chat messages with the mock's template (see `tokenizer` and `chat_prompt`).
/// Media items are named under the base model (the first served name), as vLLM's own media
/// hash covers `model_config.model` whatever adapter a request runs.
pub(super) fn render_messages(
    messages: &[MessageBody],
    add_generation_prompt: bool,
    models: &Models,
    media: &MediaConfig,
) -> Result<ChatPrompt, ApiError> {
    let base_model = &models.served[0];
    let mut turns = Vec::with_capacity(messages.len());
    for m in messages {
        let parts = match &m.content {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![ContentPart::Text(s.clone())],
            Some(Value::Array(parts)) => parts
                .iter()
                .map(|part| content_part(part, base_model, media))
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(ApiError::bad_param(
                    "messages",
                    "content must be a string or a list of parts",
                ));
            }
        };
        turns.push(ChatTurn {
            role: m.role.clone(),
            parts,
        });
    }
    Ok(render_chat_prompt(&turns, add_generation_prompt))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models() -> Models {
        Models::new(vec!["m".into(), "alias".into()], &["ad".into()])
    }

    #[test]
    fn prompts_in_every_form() {
        let g = parse_completion(
            br#"{"prompt":"abcdefgh","max_tokens":3,"foo":1}"#,
            &models(),
        )
        .unwrap();
        assert_eq!(g.prompts, vec![tokenize("abcdefgh")]);
        assert_eq!(g.model.name, "m");
        let g = parse_completion(br#"{"model":"ad","prompt":[1,2,3]}"#, &models()).unwrap();
        assert_eq!(g.prompts, vec![vec![1, 2, 3]]);
        assert_eq!(
            g.model.lora,
            Some(LoraRef {
                id: 1,
                name: "ad".into()
            })
        );
        let g = parse_completion(br#"{"prompt":[[1],[2,3]]}"#, &models()).unwrap();
        assert_eq!(g.prompts.len(), 2);
        let g = parse_completion(br#"{"prompt":["a","b"]}"#, &models()).unwrap();
        assert_eq!(g.prompts.len(), 2);
    }

    #[test]
    fn errors_are_typed() {
        let e = parse_completion(b"{not json", &models()).unwrap_err();
        assert_eq!(e.status, 400);
        let e = parse_completion(br#"{"max_tokens":3}"#, &models()).unwrap_err();
        assert!(e.message.contains("prompt"), "{}", e.message);
        let e = parse_completion(br#"{"model":"x","prompt":"a"}"#, &models()).unwrap_err();
        assert_eq!(e.status, 404);
        assert!(e.message.contains("m, alias, ad"), "{}", e.message);
        let e = parse_chat(br#"{"messages":[],"stream":true}"#, &models()).unwrap_err();
        assert_eq!(e.status, 400);
        let e = parse_completion(
            br#"{"prompt":"a","stream_options":{"include_usage":true}}"#,
            &models(),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stream_options"));
    }

    #[test]
    fn tokenize_messages_matches_chat_prompt() {
        let chat = br#"{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#;
        let g = parse_chat(chat, &models()).unwrap();
        let tok = parse_tokenize(
            br#"{"messages":[{"role":"user","content":"hi"}]}"#,
            &models(),
            &MediaConfig::default(),
        )
        .unwrap();
        assert_eq!(g.prompts[0], tok);
        assert_eq!(tok, tokenize("<|user|>\nhi<|end|>\n<|assistant|>\n"));
    }

    #[test]
    fn tokenize_of_a_media_chat_is_the_chat_prompt_placeholders_included() {
        use crate::engine::model::tokenizer::VIDEO_PLACEHOLDER_TOKEN;
        let messages = r#"[{"role":"user","content":[{"type":"text","text":"see"},
            {"type":"video_url","video_url":{"url":"https://x/v.mp4"},"uuid":"v"}]}]"#;
        let media = MediaConfig {
            tokens_per_item: Some(9),
        };
        let chat = format!(r#"{{"messages":{messages}}}"#);
        let g = parse_chat_with_media(chat.as_bytes(), &models(), &media).unwrap();
        let tok = parse_tokenize(chat.as_bytes(), &models(), &media).unwrap();
        assert_eq!(g.prompts[0], tok);
        let placeholders = tok
            .iter()
            .filter(|&&t| t == VIDEO_PLACEHOLDER_TOKEN)
            .count();
        assert_eq!(placeholders, 9);
        assert_eq!(g.media.len(), 1);
        assert_eq!(
            (g.media[0].identifier.as_str(), g.media[0].length),
            ("v", 9)
        );
        assert_eq!(tok[g.media[0].offset], VIDEO_PLACEHOLDER_TOKEN);
        // `/detokenize` takes back what `/tokenize` gave, and nothing past the placeholders.
        let body = format!(r#"{{"tokens":{}}}"#, serde_json::to_string(&tok).unwrap());
        assert_eq!(parse_detokenize(body.as_bytes(), &models()).unwrap(), tok);
        let e = parse_detokenize(br#"{"tokens":[128003]}"#, &models()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tokens"));
    }

    #[test]
    fn kv_transfer_params_must_be_an_object_or_null() {
        let g = parse_completion(
            br#"{"prompt":"a","kv_transfer_params":{"do_remote_decode":true}}"#,
            &models(),
        )
        .unwrap();
        assert_eq!(g.kv_transfer_params.unwrap()["do_remote_decode"], true);
        let g = parse_completion(br#"{"prompt":"a","kv_transfer_params":null}"#, &models());
        assert!(g.unwrap().kv_transfer_params.is_none());
        let e = parse_completion(br#"{"prompt":"a","kv_transfer_params":[1]}"#, &models());
        assert_eq!(e.unwrap_err().param.as_deref(), Some("kv_transfer_params"));
    }
}
