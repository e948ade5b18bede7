//! A request body into what routing needs: its chain of prefix hashes.
//!
//! Text mode hashes the body itself. Token mode (exact mode) needs the prompt's token ids as
//! the engine sees them, so it asks this node's engine (`/tokenize`); when the engine cannot
//! answer, the request is still served, routed by load alone — a routing hint is never worth
//! failing a request over.

use super::errors::ApiError;
use crate::engine::tokenize::{tokenize, tokenize_body};
use crate::serve::state::SharedState;
use kvmesh_protocol::RequestHashes;
use kvmesh_protocol::hashing::{Endpoint, HashError, HashMode, hash_request, hash_tokenized};
use serde_json::Value;
use std::time::Duration;

/// Longest wait for the engine's tokenizer before routing without a prefix.
const TOKENIZE_TIMEOUT: Duration = Duration::from_secs(1);

pub async fn hash_for_routing(
    state: &SharedState,
    endpoint: Endpoint,
    body: &Value,
) -> Result<RequestHashes, ApiError> {
    let bad_request = |e: HashError| ApiError::bad_request(e.to_string());
    match hash_request(endpoint, body, &state.config.hashing) {
        Err(HashError::NeedsTokens) => {}
        hashed => return hashed.map_err(bad_request),
    }
    let HashMode::Token { block_tokens } = state.config.hashing.mode else {
        // Only token mode asks for tokens; keep the error if that ever changes.
        return Err(bad_request(HashError::NeedsTokens));
    };
    let tokens = match engine_tokens(state, endpoint, body).await {
        Ok(tokens) => tokens,
        Err(error) => {
            state.metrics.tokenize_failures.inc();
            tracing::debug!(%error, "tokenizing for routing failed; routing by load");
            Vec::new()
        }
    };
    hash_tokenized(endpoint, body, &tokens, block_tokens).map_err(bad_request)
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
