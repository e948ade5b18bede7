//! From an OpenAI-compatible request body to its chain of block hashes.
//!
//! Chat messages are rendered canonically, in order: tool definitions first (chat templates put
//! them ahead of the conversation), then each message as `<|role|>`, its content parts in order,
//! its tool calls as canonical JSON, and `<|end|>`. The rendering is not any model's chat
//! template; it only has to be identical for identical conversations and share a byte prefix
//! whenever two conversations share a message prefix, which is what prefix routing needs.

use super::canonical_json::write_canonical;
use super::chain::{
    ChainBuilder, ChainSeed, MediaSpan, chain_from_media_tokens, chain_from_tokens,
};
use super::media::{
    DEFAULT_MEDIA_TOKENS, MediaId, MediaPart, content_parts, data_url_token_estimate,
};
use super::{BYTES_PER_TOKEN_ESTIMATE, BlockHash, HashConfig, HashMode};
use serde_json::Value;

/// Which OpenAI endpoint a body was sent to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    ChatCompletions,
}

/// A request body that cannot be routed, with the field at fault; shown to clients as a 400.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HashError {
    #[error("the request body must be a JSON object")]
    NotAnObject,
    #[error("missing required field `{0}`")]
    Missing(&'static str),
    #[error("field `{field}` has the wrong type: expected {expected}")]
    WrongType {
        field: &'static str,
        expected: &'static str,
    },
    #[error("token-mode hashing needs token ids; tokenize the prompt first")]
    NeedsTokens,
}

/// What routing needs to know about one request.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestHashes {
    /// The `model` field: a served model name or a LoRA adapter name.
    pub model: String,
    /// The chain of whole-block prefix hashes.
    pub chain: Vec<BlockHash>,
    /// Estimated prompt length in tokens (exact for token prompts).
    pub prompt_tokens: u32,
    /// Estimated tokens per block of this chain.
    pub tokens_per_block: f32,
    /// The OpenAI `user` field, a soft session-affinity key when present.
    pub user: Option<String>,
}

/// Hashes a request body. In token mode only token-id prompts can be hashed here; text must be
/// tokenized first ([`HashError::NeedsTokens`]).
///
/// A media part's verified `uuid` (`kvmesh-b3-…`) is taken as its identity without hashing its
/// bytes again: run [`super::pin_media_uuids`] on a client's body first, which verifies or
/// removes every such `uuid` (the node does, before hashing).
pub fn hash_request(
    endpoint: Endpoint,
    body: &Value,
    config: &HashConfig,
) -> Result<RequestHashes, HashError> {
    hash_request_seeded(endpoint, body, config, None)
}

/// [`hash_request`], with the chain seeded by `seed_model` rather than the body's `model`:
/// the identity of the weights the name stands for, so that every name of one model (vLLM's
/// `--served-model-name` aliases) hashes alike and meets the others' cache.
pub fn hash_request_seeded(
    endpoint: Endpoint,
    body: &Value,
    config: &HashConfig,
    seed_model: Option<&str>,
) -> Result<RequestHashes, HashError> {
    let object = body.as_object().ok_or(HashError::NotAnObject)?;
    let Meta {
        model,
        cache_salt,
        user,
    } = Meta::parse(object)?;
    let seed = ChainSeed::new(seed_model.unwrap_or(&model), cache_salt);
    let prompt = match endpoint {
        Endpoint::Completions => completions_prompt(object.get("prompt"))?,
        Endpoint::ChatCompletions => Prompt::Chat(object),
    };
    let (chain, prompt_tokens, tokens_per_block) = match (prompt, config.mode) {
        (Prompt::Tokens(tokens), _) => {
            let block = config.token_prompt_block_tokens.max(1);
            let tokens: Vec<u32> = tokens;
            (
                chain_from_tokens(seed, &tokens, block),
                tokens.len() as u32,
                block as f32,
            )
        }
        (_, HashMode::Token { .. }) => return Err(HashError::NeedsTokens),
        (Prompt::Text(text), HashMode::Text { block_bytes }) => {
            let mut builder = ChainBuilder::new(seed, block_bytes.max(1));
            builder.push_text(text.as_bytes());
            text_result(builder, block_bytes)
        }
        (Prompt::Chat(object), HashMode::Text { block_bytes }) => {
            let mut builder = ChainBuilder::new(seed, block_bytes.max(1));
            render_chat(object, &mut builder)?;
            text_result(builder, block_bytes)
        }
    };
    Ok(RequestHashes {
        model,
        chain,
        prompt_tokens,
        tokens_per_block,
        user,
    })
}

/// Hashes a request whose prompt the engine tokenized (token mode, for `/tokenize`'s `tokens`):
/// the chain of those ids in blocks of `block_tokens`, seeded like every chain, so it matches
/// the chains exact mode builds from the engine's KV events.
///
/// A chat with media is chained as vLLM hashes it ([`chain_from_media_tokens`]): each item's
/// placeholder tokens (ids in `placeholders`, one run per item, in order) key the blocks they
/// overlap by the item's identity, read from the `uuid` the entry pinned
/// (`pin_media_uuids`). The chain stops before the first block the mesh cannot reproduce: one
/// overlapping an item without a verified identity, or, when the runs of placeholders do not
/// pair up with the items (no placeholder ids configured, or a template that renders them
/// otherwise), the first placeholder at all; before a verified item, text blocks still match.
pub fn hash_tokenized(
    endpoint: Endpoint,
    body: &Value,
    tokens: &[u32],
    block_tokens: usize,
) -> Result<RequestHashes, HashError> {
    hash_tokenized_seeded(endpoint, body, tokens, block_tokens, None, &[])
}

/// [`hash_tokenized`], seeded by `seed_model` (see [`hash_request_seeded`]), with the media
/// placeholder token ids of the model.
pub fn hash_tokenized_seeded(
    endpoint: Endpoint,
    body: &Value,
    tokens: &[u32],
    block_tokens: usize,
    seed_model: Option<&str>,
    placeholders: &[u32],
) -> Result<RequestHashes, HashError> {
    let object = body.as_object().ok_or(HashError::NotAnObject)?;
    let meta = Meta::parse(object)?;
    let block_tokens = block_tokens.max(1);
    let seed = ChainSeed::new(seed_model.unwrap_or(&meta.model), meta.cache_salt);
    let media = match endpoint {
        Endpoint::ChatCompletions => chat_media_identities(body),
        Endpoint::Completions => Vec::new(),
    };
    let chain = if media.is_empty() {
        chain_from_tokens(seed, tokens, block_tokens)
    } else {
        let runs = placeholder_runs(tokens, placeholders);
        let reproducible = match runs.len() == media.len() {
            true => runs
                .iter()
                .zip(&media)
                .find(|(_, id)| id.is_none())
                .map_or(tokens.len(), |(run, _)| run.0),
            false => runs.first().map_or(0, |run| run.0),
        };
        let spans: Vec<MediaSpan> = runs
            .iter()
            .zip(&media)
            .filter_map(|(&(offset, length), id)| {
                Some(MediaSpan {
                    offset,
                    length,
                    id: (*id)?,
                })
            })
            .collect();
        let whole_blocks = reproducible / block_tokens * block_tokens;
        chain_from_media_tokens(seed, &tokens[..whole_blocks], block_tokens, &spans)
    };
    Ok(RequestHashes {
        model: meta.model,
        chain,
        prompt_tokens: tokens.len() as u32,
        tokens_per_block: block_tokens as f32,
        user: meta.user,
    })
}

/// Per media part of a chat, in order: the identity its pinned `uuid` names, if verified.
fn chat_media_identities(body: &Value) -> Vec<Option<MediaId>> {
    content_parts(body)
        .filter(|part| MediaPart::of(part).is_some())
        .map(|part| {
            part.get("uuid")
                .and_then(Value::as_str)
                .and_then(MediaId::from_uuid)
        })
        .collect()
}

/// Maximal runs of placeholder ids as `(offset, length)`, in order.
fn placeholder_runs(tokens: &[u32], placeholders: &[u32]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut previous = None;
    for (at, token) in tokens.iter().enumerate() {
        if !placeholders.contains(token) {
            previous = None;
            continue;
        }
        match runs.last_mut() {
            Some(run) if previous == Some(*token) => run.1 += 1,
            _ => runs.push((at, 1)),
        }
        previous = Some(*token);
    }
    runs
}

/// The fields of a body every chain depends on.
struct Meta<'a> {
    model: String,
    cache_salt: Option<&'a str>,
    user: Option<String>,
}

impl<'a> Meta<'a> {
    fn parse(object: &'a serde_json::Map<String, Value>) -> Result<Self, HashError> {
        let model = match object.get("model") {
            Some(Value::String(model)) => model.clone(),
            Some(_) => {
                return Err(HashError::WrongType {
                    field: "model",
                    expected: "a string",
                });
            }
            None => return Err(HashError::Missing("model")),
        };
        let cache_salt = match object.get("cache_salt") {
            None | Some(Value::Null) => None,
            Some(Value::String(salt)) => Some(salt.as_str()),
            Some(_) => {
                return Err(HashError::WrongType {
                    field: "cache_salt",
                    expected: "a string",
                });
            }
        };
        let user = match object.get("user") {
            Some(Value::String(user)) if !user.is_empty() => Some(user.clone()),
            _ => None,
        };
        Ok(Self {
            model,
            cache_salt,
            user,
        })
    }
}

fn text_result(builder: ChainBuilder, block_bytes: usize) -> (Vec<BlockHash>, u32, f32) {
    let text_tokens = (builder.total_bytes() as f32 / BYTES_PER_TOKEN_ESTIMATE).ceil() as u64;
    let tokens = u32::try_from(text_tokens + builder.media_tokens()).unwrap_or(u32::MAX);
    (
        builder.finish(),
        tokens,
        block_bytes as f32 / BYTES_PER_TOKEN_ESTIMATE,
    )
}

enum Prompt<'a> {
    Text(&'a str),
    Tokens(Vec<u32>),
    Chat(&'a serde_json::Map<String, Value>),
}

/// A completions `prompt` is a string, a token-id array, or a batch of either; a batch is
/// routed by its first prompt (all of a batch goes to one engine).
fn completions_prompt(prompt: Option<&Value>) -> Result<Prompt<'_>, HashError> {
    const EXPECTED: &str = "a string, an array of token ids, or a non-empty batch of those";
    let wrong = HashError::WrongType {
        field: "prompt",
        expected: EXPECTED,
    };
    match prompt {
        None => Err(HashError::Missing("prompt")),
        Some(Value::String(text)) => Ok(Prompt::Text(text)),
        Some(Value::Array(items)) => match items.first() {
            None => Err(wrong),
            Some(Value::String(text)) => Ok(Prompt::Text(text)),
            Some(Value::Array(tokens)) => token_ids(tokens).map(Prompt::Tokens).ok_or(wrong),
            Some(Value::Number(_)) => token_ids(items).map(Prompt::Tokens).ok_or(wrong),
            Some(_) => Err(wrong),
        },
        Some(_) => Err(wrong),
    }
}

fn token_ids(items: &[Value]) -> Option<Vec<u32>> {
    items
        .iter()
        .map(|v| v.as_u64().and_then(|t| u32::try_from(t).ok()))
        .collect()
}

fn render_chat(
    object: &serde_json::Map<String, Value>,
    builder: &mut ChainBuilder,
) -> Result<(), HashError> {
    let messages = match object.get("messages") {
        Some(Value::Array(messages)) => messages,
        Some(_) => {
            return Err(HashError::WrongType {
                field: "messages",
                expected: "an array",
            });
        }
        None => return Err(HashError::Missing("messages")),
    };
    let mut scratch = String::new();
    if let Some(tools) = object.get("tools").filter(|t| !t.is_null()) {
        scratch.push_str("<|tools|>");
        write_canonical(tools, &mut scratch);
        scratch.push_str("<|end|>");
        builder.push_text(scratch.as_bytes());
    }
    for message in messages {
        let message = message.as_object().ok_or(HashError::WrongType {
            field: "messages",
            expected: "an array of objects",
        })?;
        scratch.clear();
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        scratch.push_str("<|");
        scratch.push_str(role);
        scratch.push_str("|>");
        if let Some(Value::String(name)) = message.get("name") {
            scratch.push_str("<|name|>");
            scratch.push_str(name);
            scratch.push_str("<|content|>");
        }
        builder.push_text(scratch.as_bytes());
        render_content(message.get("content"), builder);
        for key in ["tool_calls", "tool_call_id", "function_call"] {
            if let Some(value) = message.get(key).filter(|v| !v.is_null()) {
                scratch.clear();
                scratch.push_str("<|");
                scratch.push_str(key);
                scratch.push_str("|>");
                write_canonical(value, &mut scratch);
                builder.push_text(scratch.as_bytes());
            }
        }
        builder.push_text(b"<|end|>");
    }
    Ok(())
}

fn render_content(content: Option<&Value>, builder: &mut ChainBuilder) {
    match content {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => builder.push_text(text.as_bytes()),
        Some(Value::Array(parts)) => parts.iter().for_each(|part| render_part(part, builder)),
        Some(other) => push_canonical(other, builder),
    }
}

fn render_part(part: &Value, builder: &mut ChainBuilder) {
    if let Some(media) = MediaPart::of(part) {
        // A verified `uuid` is the blake3 `pin_media_uuids` computed: no need to decode and
        // hash the bytes again (hundreds of microseconds for a large image).
        let pinned = part
            .get("uuid")
            .and_then(Value::as_str)
            .and_then(MediaId::from_uuid);
        let (id, tokens) = match (media, pinned) {
            (MediaPart::Url(url), Some(id)) => (id, data_url_token_estimate(url)),
            (MediaPart::Url(url), None) => reference_identity(url),
            (MediaPart::Base64(_), Some(id)) => (id, DEFAULT_MEDIA_TOKENS),
            (MediaPart::Base64(data), None) => (MediaId::of_base64(data), DEFAULT_MEDIA_TOKENS),
        };
        builder.push_media(&id, tokens);
        return;
    }
    match part.get("text").and_then(Value::as_str) {
        Some(text) if part.get("type").and_then(Value::as_str) == Some("text") => {
            builder.push_text(text.as_bytes())
        }
        _ => push_canonical(part, builder),
    }
}

/// The identity of a media reference and its estimated tokens: a data URL by its bytes (decoded
/// in chunks into the hash) and its header's size; a plain URL by its text, assumed a
/// mid-sized picture.
fn reference_identity(url: &str) -> (MediaId, u32) {
    (MediaId::of_reference(url), data_url_token_estimate(url))
}

fn push_canonical(value: &Value, builder: &mut ChainBuilder) {
    let mut text = String::new();
    write_canonical(value, &mut text);
    builder.push_text(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(body: Value) -> RequestHashes {
        hash_request(Endpoint::ChatCompletions, &body, &HashConfig::default()).unwrap()
    }

    #[test]
    fn tokenized_requests_chain_their_tokens() {
        let tokens: Vec<u32> = (0..40).collect();
        let body = json!({"model": "m", "cache_salt": "s", "user": "u",
            "messages": [{"role": "user", "content": "hi"}]});
        let hashes = hash_tokenized(Endpoint::ChatCompletions, &body, &tokens, 16).unwrap();
        assert_eq!(
            hashes.chain,
            chain_from_tokens(ChainSeed::new("m", Some("s")), &tokens, 16)
        );
        assert_eq!(
            (hashes.prompt_tokens, hashes.user.as_deref()),
            (40, Some("u"))
        );
        assert_eq!(
            hash_tokenized(Endpoint::Completions, &json!({"prompt": "x"}), &tokens, 16),
            Err(HashError::Missing("model"))
        );
    }

    #[test]
    fn a_longer_conversation_extends_the_chain() {
        let system = "You are a careful assistant. ".repeat(20);
        let first = chat(json!({"model": "m", "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "What is the capital of France? Answer briefly please."},
        ]}));
        let second = chat(json!({"model": "m", "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "What is the capital of France? Answer briefly please."},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And of Italy?"},
        ]}));
        assert!(first.chain.len() >= 9);
        assert_eq!(second.chain[..first.chain.len()], first.chain[..]);
    }

    #[test]
    fn the_same_image_hashes_the_same_and_a_different_one_does_not() {
        let with = |url: &str| {
            chat(
                json!({"model": "m", "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "Describe this picture in detail, please."},
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": "x".repeat(200)},
                ]}]}),
            )
        };
        let a = with("https://example.com/a.png");
        assert_eq!(a, with("https://example.com/a.png"));
        let b = with("https://example.com/b.png");
        assert_eq!(a.chain[0], b.chain[0], "text before the image is shared");
        assert_ne!(a.chain[1], b.chain[1], "the image blocks differ");
        assert!(
            a.chain[1..].iter().zip(&b.chain[1..]).all(|(x, y)| x != y),
            "and so does every block after them"
        );
        assert!(
            a.prompt_tokens >= DEFAULT_MEDIA_TOKENS,
            "{}",
            a.prompt_tokens
        );
    }

    const IMAGE: u32 = 900_000;

    /// 20 text tokens, `image_tokens` placeholders, 20 text tokens.
    fn tokens_with_image(image_tokens: usize) -> Vec<u32> {
        let mut tokens: Vec<u32> = (0..20).collect();
        tokens.extend(std::iter::repeat_n(IMAGE, image_tokens));
        tokens.extend(100..120);
        tokens
    }

    fn image_chat(uuid: Option<&str>) -> Value {
        let mut part = json!({"type": "image_url", "image_url": {"url": "https://x/a.png"}});
        if let Some(uuid) = uuid {
            part["uuid"] = json!(uuid);
        }
        json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this"}, part,
        ]}]})
    }

    #[test]
    fn tokenized_media_chats_key_the_blocks_their_placeholders_overlap() {
        let tokens = tokens_with_image(30);
        let id = MediaId::of_bytes(b"a picture");
        let hash = |body: &Value, placeholders: &[u32]| {
            hash_tokenized_seeded(
                Endpoint::ChatCompletions,
                body,
                &tokens,
                16,
                None,
                placeholders,
            )
            .unwrap()
            .chain
        };
        let pinned = hash(&image_chat(Some(&id.uuid())), &[IMAGE]);
        let span = MediaSpan {
            offset: 20,
            length: 30,
            id,
        };
        let seed = ChainSeed::new("m", None);
        assert_eq!(pinned, chain_from_media_tokens(seed, &tokens, 16, &[span]));
        assert_eq!(pinned.len(), 4);
        // Without a verified identity, or without knowing the placeholders, the chain stops
        // at the last whole block before the image: block 0 (tokens 0..16).
        let before_image = chain_from_tokens(seed, &tokens[..16], 16);
        assert_eq!(hash(&image_chat(None), &[IMAGE]), before_image);
        assert_eq!(
            hash(&image_chat(Some("client-chosen")), &[IMAGE]),
            before_image
        );
        // Placeholders unknown, or not found: where the image starts is unknown, so no chain.
        assert_eq!(hash(&image_chat(Some(&id.uuid())), &[]), Vec::<u64>::new());
        assert_eq!(
            hash(&image_chat(Some(&id.uuid())), &[12345]),
            Vec::<u64>::new()
        );
    }

    #[test]
    fn tools_and_tool_calls_are_part_of_the_prefix() {
        let base = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let mut with_tools = base.clone();
        with_tools["tools"] = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
        assert_ne!(chat(base).chain, chat(with_tools).chain);
    }

    #[test]
    fn completions_prompt_shapes() {
        let config = HashConfig::default();
        let text = "a".repeat(130);
        let single = hash_request(
            Endpoint::Completions,
            &json!({"model": "m", "prompt": text}),
            &config,
        )
        .unwrap();
        let batch = hash_request(
            Endpoint::Completions,
            &json!({"model": "m", "prompt": [text, "other"]}),
            &config,
        )
        .unwrap();
        assert_eq!(single.chain.len(), 2);
        assert_eq!(
            single.chain, batch.chain,
            "a batch is routed by its first prompt"
        );
        let tokens: Vec<u32> = (0..40).collect();
        let by_tokens = hash_request(
            Endpoint::Completions,
            &json!({"model": "m", "prompt": tokens}),
            &config,
        )
        .unwrap();
        assert_eq!(by_tokens.chain.len(), 2);
        assert_eq!(by_tokens.prompt_tokens, 40);
        let nested = hash_request(
            Endpoint::Completions,
            &json!({"model": "m", "prompt": [tokens, [1, 2]]}),
            &config,
        )
        .unwrap();
        assert_eq!(nested.chain, by_tokens.chain);
    }

    #[test]
    fn malformed_bodies_are_typed_errors() {
        let config = HashConfig::default();
        let cases = [
            (json!([1]), HashError::NotAnObject),
            (json!({"prompt": "x"}), HashError::Missing("model")),
            (json!({"model": "m"}), HashError::Missing("prompt")),
        ];
        for (body, expected) in cases {
            assert_eq!(
                hash_request(Endpoint::Completions, &body, &config),
                Err(expected)
            );
        }
        for prompt in [
            json!([]),
            json!(5),
            json!([{"a": 1}]),
            json!([-1]),
            json!([1.5]),
        ] {
            let body = json!({"model": "m", "prompt": prompt});
            assert!(matches!(
                hash_request(Endpoint::Completions, &body, &config),
                Err(HashError::WrongType {
                    field: "prompt",
                    ..
                })
            ));
        }
        assert_eq!(
            hash_request(Endpoint::ChatCompletions, &json!({"model": "m"}), &config),
            Err(HashError::Missing("messages"))
        );
        let token_mode = HashConfig {
            mode: HashMode::Token { block_tokens: 16 },
            ..config
        };
        assert_eq!(
            hash_request(
                Endpoint::Completions,
                &json!({"model": "m", "prompt": "text"}),
                &token_mode
            ),
            Err(HashError::NeedsTokens)
        );
    }

    #[test]
    fn cache_salt_and_model_separate_chains() {
        let config = HashConfig::default();
        let prompt = "p".repeat(64);
        let hash = |body: Value| {
            hash_request(Endpoint::Completions, &body, &config)
                .unwrap()
                .chain
        };
        let plain = hash(json!({"model": "m", "prompt": prompt}));
        assert_ne!(
            plain,
            hash(json!({"model": "m", "prompt": prompt, "cache_salt": "tenant"}))
        );
        assert_ne!(plain, hash(json!({"model": "lora-a", "prompt": prompt})));
        assert_eq!(
            plain,
            hash(json!({"model": "m", "prompt": prompt, "cache_salt": null}))
        );
    }

    #[test]
    fn names_seeded_by_one_identity_hash_alike() {
        let config = HashConfig::default();
        let prompt = "x".repeat(300);
        let seeded = |model: &str, seed: Option<&str>| {
            let body = json!({"model": model, "prompt": prompt});
            hash_request_seeded(Endpoint::Completions, &body, &config, seed).unwrap()
        };
        let weights = Some("/models/llama-3.1-8b");
        let (name, alias) = (seeded("llama", weights), seeded("llama-8b", weights));
        assert_eq!(name.chain, alias.chain);
        assert_eq!(
            alias.model, "llama-8b",
            "routing still asks for the client's name"
        );
        assert_ne!(seeded("llama", None).chain, name.chain);
        let tokens: Vec<u32> = (0..64).collect();
        let body = json!({"model": "llama-8b", "prompt": prompt});
        let tokenized =
            hash_tokenized_seeded(Endpoint::Completions, &body, &tokens, 16, weights, &[]).unwrap();
        assert_eq!(
            tokenized.chain,
            chain_from_tokens(ChainSeed::new("/models/llama-3.1-8b", None), &tokens, 16)
        );
    }
}
