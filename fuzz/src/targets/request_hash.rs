//! An OpenAI request body, parsed as the front parses it, through prefix hashing: chat
//! rendering (tools, tool calls, names, content parts), media parts (data URLs, raw base64),
//! completions prompts of every shape, and the token-mode path.
//!
//! Input: `[config: u8][JSON body]`. Bit 0 of the config byte picks the endpoint, bits 1–2 the
//! hashing configuration (text with 64-byte blocks; text with 1 + `config >> 3`-byte blocks;
//! token mode; text with blocks of 0, which the hashing must tolerate). Checks:
//! - the hash does not depend on the JSON's formatting: the body re-serialized hashes the same;
//! - a chat's prefix property, which routing rests on: dropping its last message gives a
//!   chain that is a prefix of the full one; likewise a text prompt cut short;
//! - token-mode hashing of the same body fails only where text-mode hashing fails on the same
//!   field, and chains exactly the tokens' whole blocks (none when the chat has media).

use crate::samples;
use kvmesh_protocol::hashing::{
    Endpoint, HashConfig, HashMode, RequestHashes, hash_request, hash_tokenized,
};
use serde_json::Value;

pub fn run(data: &[u8]) {
    let Some((&selector, json)) = data.split_first() else {
        return;
    };
    let Ok(body) = serde_json::from_slice::<Value>(json) else {
        return;
    };
    let endpoint = match selector & 1 {
        0 => Endpoint::Completions,
        _ => Endpoint::ChatCompletions,
    };
    let small = 1 + usize::from(selector >> 3);
    let config = match (selector >> 1) & 3 {
        0 => HashConfig::default(),
        1 => HashConfig {
            mode: HashMode::Text { block_bytes: small },
            token_prompt_block_tokens: small,
        },
        2 => HashConfig {
            mode: HashMode::Token { block_tokens: 16 },
            ..HashConfig::default()
        },
        _ => HashConfig {
            mode: HashMode::Text { block_bytes: 0 },
            token_prompt_block_tokens: 0,
        },
    };
    let hashed = hash_request(endpoint, &body, &config);

    let reserialized: Value =
        serde_json::from_slice(&serde_json::to_vec(&body).expect("a Value serializes"))
            .expect("serde_json reads what it writes");
    assert_eq!(hash_request(endpoint, &reserialized, &config), hashed);

    if let Ok(hashes) = &hashed {
        check_prefixes(endpoint, &body, &config, hashes);
    }

    let tokens: Vec<u32> = (0..json.len() as u32 % 100).collect();
    match hash_tokenized(endpoint, &body, &tokens, small) {
        // Only the fields every chain depends on (`model`, `cache_salt`) can fail here, and
        // they fail text-mode hashing first.
        Err(error) => assert_eq!(hashed.as_ref().err(), Some(&error)),
        Ok(tokenized) => {
            let blocks = tokens.len() / small;
            assert!(
                tokenized.chain.len() == blocks || tokenized.chain.is_empty(),
                "{} blocks of {} tokens",
                tokenized.chain.len(),
                tokens.len()
            );
            assert_eq!(tokenized.prompt_tokens as usize, tokens.len());
        }
    }
}

/// Cutting a conversation or a text prompt short keeps a prefix of the chain.
fn check_prefixes(endpoint: Endpoint, body: &Value, config: &HashConfig, full: &RequestHashes) {
    let mut shorter = body.clone();
    let cut = match endpoint {
        Endpoint::ChatCompletions => match shorter.get_mut("messages") {
            Some(Value::Array(messages)) => messages.pop().is_some(),
            _ => false,
        },
        Endpoint::Completions => match shorter.get_mut("prompt") {
            Some(Value::String(text)) if !text.is_empty() => {
                let mut at = text.len() / 2;
                while !text.is_char_boundary(at) {
                    at -= 1;
                }
                text.truncate(at);
                true
            }
            _ => false,
        },
    };
    if !cut {
        return;
    }
    let short = hash_request(endpoint, &shorter, config).expect("a shorter valid body hashes");
    assert!(
        full.chain.starts_with(&short.chain),
        "the chain of the shorter body ({} blocks) is not a prefix of the full one ({} blocks)",
        short.chain.len(),
        full.chain.len()
    );
}

pub fn seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for body in samples::REQUEST_BODIES {
        let chat = body.contains("\"messages\"");
        // Default text mode, 8-byte text blocks, token mode.
        for config in [0u8, 2 | (7 << 3), 4] {
            let mut input = vec![config | u8::from(chat)];
            input.extend_from_slice(body.as_bytes());
            out.push(input);
        }
    }
    out
}
