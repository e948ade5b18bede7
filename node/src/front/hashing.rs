//! A request body into what routing needs: its chain of prefix hashes.
//!
//! Text mode hashes the body itself. Token mode (exact mode) needs the prompt's token ids as
//! the engine sees them: a completions prompt is tokenized here when the node loaded the
//! model's `tokenizer.json` (`--tokenizer`); otherwise, and for every chat request, this node's
//! engine is asked (`/tokenize`). When no token ids can be had, the request is still served,
//! routed by load alone — a routing hint is never worth failing a request over.

use super::errors::ApiError;
use crate::engine::local_tokenizer::LocalTokenizer;
use crate::engine::tokenize::{completion_prompt, tokenize, tokenize_body};
use crate::metrics::SourceLabels;
use crate::serve::state::SharedState;
use kvmesh_protocol::RequestHashes;
use kvmesh_protocol::hashing::{
    Endpoint, HashError, HashMode, hash_request_seeded, hash_tokenized_seeded,
};
use serde_json::Value;
use std::time::{Duration, Instant};

/// Longest wait for the engine's tokenizer before routing without a prefix.
const TOKENIZE_TIMEOUT: Duration = Duration::from_secs(1);

pub async fn hash_for_routing(
    state: &SharedState,
    endpoint: Endpoint,
    body: &Value,
) -> Result<RequestHashes, ApiError> {
    let bad_request = |e: HashError| ApiError::bad_request(e.to_string());
    let identity = body
        .get("model")
        .and_then(Value::as_str)
        .and_then(|model| state.model_identity(model));
    let seed = identity.as_deref();
    match hash_request_seeded(endpoint, body, &state.config.hashing, seed) {
        Err(HashError::NeedsTokens) => {}
        hashed => return hashed.map_err(bad_request),
    }
    let HashMode::Token { block_tokens } = state.config.hashing.mode else {
        // Only token mode asks for tokens; keep the error if that ever changes.
        return Err(bad_request(HashError::NeedsTokens));
    };
    let local = state.config.tokenizer.as_deref();
    let started = Instant::now();
    let (tokens, source) = match local.and_then(|tokenizer| local_tokens(tokenizer, endpoint, body))
    {
        Some(tokens) => (tokens, "local"),
        None => (engine_tokens(state, endpoint, body).await, "engine"),
    };
    state
        .metrics
        .tokenize_seconds
        .get_or_create(&SourceLabels {
            source: source.to_owned(),
        })
        .observe(started.elapsed().as_secs_f64());
    let tokens = match tokens {
        Ok(tokens) => tokens,
        Err(error) => {
            state.metrics.tokenize_failures.inc();
            tracing::debug!(%error, "tokenizing for routing failed; routing by load");
            Vec::new()
        }
    };
    let placeholders = &state.config.media.placeholder_tokens;
    hash_tokenized_seeded(endpoint, body, &tokens, block_tokens, seed, placeholders)
        .map_err(bad_request)
}

/// A completions prompt's token ids from the loaded tokenizer, or `None` when the engine must
/// be asked. A `tokenizer.json` has no chat template, so chat requests always go to the
/// engine's `/tokenize`. Runs inline: CPU work on the request path, like parsing the body,
/// which prompts of normal size do not need a blocking pool for.
fn local_tokens(
    tokenizer: &LocalTokenizer,
    endpoint: Endpoint,
    body: &Value,
) -> Option<Result<Vec<u32>, String>> {
    if endpoint != Endpoint::Completions {
        return None;
    }
    let prompt = completion_prompt(body)?;
    // vLLM adds the special tokens unless the request says not to.
    let add_special_tokens = body
        .get("add_special_tokens")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    Some(tokenizer.encode(prompt, add_special_tokens))
}

async fn engine_tokens(
    state: &SharedState,
    endpoint: Endpoint,
    body: &Value,
) -> Result<Vec<u32>, String> {
    if !state.engine.state().healthy {
        return Err("the local engine is unhealthy".into());
    }
    let request = tokenize_body(endpoint, body).ok_or("no text prompt to tokenize")?;
    tokenize(&state.engine.client, &request, TOKENIZE_TIMEOUT)
        .await
        .map_err(|e| e.to_string())
}

#[cfg(all(test, feature = "tokenizer"))]
mod tests {
    use super::*;
    use crate::engine::local_tokenizer::TEST_FIXTURE;
    use kvmesh_protocol::hashing::hash_tokenized;
    use serde_json::json;
    use std::path::Path;

    const BLOCK_TOKENS: usize = 4;

    fn tokenizer() -> LocalTokenizer {
        LocalTokenizer::load(Path::new(TEST_FIXTURE)).unwrap()
    }

    fn chain(body: &Value, tokens: &[u32]) -> Vec<u64> {
        hash_tokenized(Endpoint::Completions, body, tokens, BLOCK_TOKENS)
            .unwrap()
            .chain
    }

    #[test]
    fn completions_hash_the_local_tokens_like_the_engines() {
        let tokenizer = tokenizer();
        let body = json!({"model": "m",
            "prompt": ["the quick brown fox jumps over the lazy dog .", "ignored"]});
        let tokens = local_tokens(&tokenizer, Endpoint::Completions, &body)
            .unwrap()
            .unwrap();
        assert_eq!(tokens, [1, 3, 4, 5, 6, 7, 8, 3, 9, 10, 2]);
        assert_eq!(chain(&body, &tokens).len(), 2);
        assert_eq!(
            chain(&body, &tokens),
            chain(&body, &[1, 3, 4, 5, 6, 7, 8, 3, 9, 10, 2])
        );
    }

    #[test]
    fn the_request_decides_on_special_tokens() {
        let tokenizer = tokenizer();
        let body = json!({"model": "m", "prompt": "the quick brown fox",
            "add_special_tokens": false});
        let tokens = local_tokens(&tokenizer, Endpoint::Completions, &body)
            .unwrap()
            .unwrap();
        assert_eq!(tokens, [3, 4, 5, 6]);
    }

    #[test]
    fn chat_and_token_prompts_are_not_tokenized_here() {
        let tokenizer = tokenizer();
        let chat = json!({"model": "m", "messages": [{"role": "user", "content": "the fox"}]});
        assert!(local_tokens(&tokenizer, Endpoint::ChatCompletions, &chat).is_none());
        let ids = json!({"model": "m", "prompt": [3, 4, 5]});
        assert!(local_tokens(&tokenizer, Endpoint::Completions, &ids).is_none());
    }
}

/// What routing needs of a request routed by model and load alone (embeddings, pooling,
/// scoring, tokenizing, the Responses API, any other `/v1/…` endpoint): its model and a rough
/// size, no prefix chain. Without a `model` it is the first model this node's engine serves,
/// the one the engine itself would default to.
pub fn hash_by_model(
    state: &SharedState,
    body: &Value,
    body_len: usize,
) -> Result<RequestHashes, ApiError> {
    let object = body
        .as_object()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    let model = match object.get("model") {
        Some(Value::String(model)) => model.clone(),
        None | Some(Value::Null) => {
            state
                .engine
                .state()
                .models
                .first()
                .cloned()
                .ok_or_else(|| {
                    ApiError::bad_request(
                "missing required field `model` (this node's engine serves no model to default to)",
            )
            .with_param("model")
                })?
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "field `model` has the wrong type: expected a string",
            )
            .with_param("model"));
        }
    };
    let user = match object.get("user") {
        Some(Value::String(user)) if !user.is_empty() => Some(user.clone()),
        _ => None,
    };
    Ok(RequestHashes {
        model,
        chain: Vec::new(),
        // About four bytes a token: only a size for the cost form's estimates.
        prompt_tokens: (body_len / 4).min(u32::MAX as usize) as u32,
        tokens_per_block: 16.0,
        user,
    })
}
