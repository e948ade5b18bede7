//! The request path's media step: fetch what `--fetch-media` allows, then pin every visible
//! item's identity into its part's `uuid` (`kvmesh_protocol::hashing::pin_media_uuids`, which
//! says why), before the body is hashed and forwarded. A body without media parts is passed
//! through as it came, bytes untouched.

use super::errors::ApiError;
use super::inference::Api;
use crate::serve::state::SharedState;
use bytes::Bytes;
use kvmesh_protocol::hashing::{Endpoint, pin_media_uuids, pin_media_uuids_raw};
use serde_json::Value;

pub async fn prepare(
    state: &SharedState,
    api: Api,
    body: Bytes,
    mut json: Value,
) -> Result<(Bytes, Value), ApiError> {
    if api != Api::Generation(Endpoint::ChatCompletions) {
        return Ok((body, json));
    }
    let inlined = match &state.media_fetcher {
        Some(fetcher) => fetcher.inline_urls(&mut json, &state.metrics).await,
        None => 0,
    };
    if inlined == 0 {
        // The common case: the body's bytes with the new uuids spliced in, not re-encoded.
        let (report, pinned) = pin_media_uuids_raw(&body, &mut json);
        state.metrics.media_pinned(&report);
        return Ok((pinned.map_or(body, Bytes::from), json));
    }
    let report = pin_media_uuids(&mut json);
    state.metrics.media_pinned(&report);
    let body = serde_json::to_vec(&json).map_err(|e| {
        ApiError::new(
            http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("re-encoding the request with its media identities: {e}"),
        )
    })?;
    Ok((Bytes::from(body), json))
}
