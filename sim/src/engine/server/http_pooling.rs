//! Handlers of the pooling endpoints and `/detokenize`: parse → run every prompt through the
//! engine → answer.
//!
//! A pooling request is a prefill: each prompt runs as an engine request of one output
//! token, so it queues, batches, hits and fills the prefix cache and counts in the request
//! metrics like a completion. vLLM finishes a pooling request after its prefill without a
//! token; the mock's model always produces one, so each pooling prompt adds one to
//! `vllm:generation_tokens` and finishes as `length`. Usage reports prompt tokens only, as
//! vLLM does.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;

use super::body::Body;
use super::errors::ApiError;
use super::http::{AppState, Done, id_body, json_response, read_body, run_to_end, unix_now};
use super::openai::{self, ResolvedModel};
use super::pooling::{self, PoolingEndpoint};
use crate::engine::model::tokenizer::detokenize as detokenize_ids;
use crate::engine::model::{EngineRequest, KvTransfer, MediaItem};

/// `/v1/embeddings`, `/pooling` and `/classify`.
pub async fn pooling(
    state: &AppState,
    req: Request<Incoming>,
    endpoint: PoolingEndpoint,
) -> Result<Response<Body>, ApiError> {
    let (parts, body) = read_body(state, req).await?;
    let p = pooling::parse_pooling(&body, &state.models(), endpoint, &state.media)?;
    let first_id = state
        .next_id
        .fetch_add(p.prompts.len() as u64, Ordering::Relaxed);
    let requests = p
        .prompts
        .iter()
        .enumerate()
        .map(|(i, prompt)| {
            prefill(
                state,
                first_id + i as u64,
                prompt.clone(),
                &p.model,
                &p.cache_salt,
                &p.media,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let done = run_to_end(state, requests).await?;
    let body = pooling::pooling_body(
        &p,
        &id_body(state, &parts, first_id),
        unix_now(),
        prompt_tokens(&done),
    );
    Ok(json_response(StatusCode::OK, Bytes::from(body.to_string())))
}

/// `/score` and `/v1/score` (`rerank` false), `/rerank`, `/v1/rerank` and `/v2/rerank`.
pub async fn score(
    state: &AppState,
    req: Request<Incoming>,
    rerank: bool,
) -> Result<Response<Body>, ApiError> {
    let (parts, body) = read_body(state, req).await?;
    let s = if rerank {
        pooling::parse_rerank(&body, &state.models())?
    } else {
        pooling::parse_score(&body, &state.models())?
    };
    let first_id = state
        .next_id
        .fetch_add(s.pairs.len() as u64, Ordering::Relaxed);
    let requests = (0..s.pairs.len())
        .map(|i| {
            prefill(
                state,
                first_id + i as u64,
                s.prompt(i),
                &s.model,
                &s.cache_salt,
                &[],
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let done = run_to_end(state, requests).await?;
    let body = pooling::score_body(
        &s,
        &id_body(state, &parts, first_id),
        unix_now(),
        prompt_tokens(&done),
    );
    Ok(json_response(StatusCode::OK, Bytes::from(body.to_string())))
}

/// `/detokenize`: `{"prompt": text}` (vLLM's `DetokenizeResponse`). Like `/tokenize` it does
/// not reach the engine.
pub async fn detokenize(
    state: &AppState,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let (_, body) = read_body(state, req).await?;
    let tokens = openai::parse_detokenize(&body, &state.models())?;
    let body = json!({ "prompt": detokenize_ids(&tokens) });
    Ok(json_response(StatusCode::OK, Bytes::from(body.to_string())))
}

fn prompt_tokens(done: &[Done]) -> u32 {
    done.iter().map(|d| d.finished.prompt_tokens).sum()
}

/// The engine request that pools `prompt`: a prefill and one token. A prompt must fit the
/// context with that token, one more than vLLM requires (which pools without generating).
fn prefill(
    state: &AppState,
    id: u64,
    prompt: Vec<u32>,
    model: &ResolvedModel,
    cache_salt: &Option<String>,
    media: &[MediaItem],
) -> Result<EngineRequest, ApiError> {
    let cfg = &state.engine;
    let limit = cfg
        .max_model_len
        .min(cfg.num_gpu_blocks.saturating_mul(cfg.block_size)) as usize;
    if prompt.len() + 1 > limit {
        // vLLM's message for an input too long to pool (`_validate_input` in
        // `vllm/entrypoints/openai/serving_engine.py`).
        return Err(ApiError::bad_param(
            "input",
            format!(
                "This model's maximum context length is {} tokens. However, you requested {} \
                 tokens in the input for embedding generation. Please reduce the length of the \
                 input.",
                limit - 1,
                prompt.len()
            ),
        ));
    }
    Ok(EngineRequest {
        id,
        prompt,
        max_tokens: 1,
        min_tokens: 0,
        ignore_eos: true,
        lora: model.lora.clone(),
        cache_salt: cache_salt.clone(),
        kv_transfer: KvTransfer::None,
        media: media.to_vec(),
    })
}
