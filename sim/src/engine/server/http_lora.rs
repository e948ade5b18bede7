//! `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`, as vLLM serves them with
//! `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` (`OpenAIServingModels` and the LoRA router): the
//! same checks in the same order, the same messages, error types and statuses, and the same
//! plain-text success bodies (a Starlette `Response` without a media type, so no
//! `content-type`).

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;

use super::body::{Body, full};
use super::errors::ApiError;
use super::http::{AppState, read_body};

/// vLLM's `LoadLoRAAdapterRequest`.
#[derive(Debug, Deserialize)]
struct LoadRequest {
    lora_name: String,
    lora_path: String,
    /// Replace a known adapter's weights in place (its id is kept).
    #[serde(default)]
    load_inplace: bool,
}

/// vLLM's `UnloadLoRAAdapterRequest` (`lora_int_id` is accepted and unused, as in vLLM).
#[derive(Debug, Deserialize)]
struct UnloadRequest {
    lora_name: String,
    #[serde(default)]
    #[allow(dead_code)]
    lora_int_id: Option<i64>,
}

/// vLLM's `err_type` for a request that fails its checks.
const INVALID_USER_INPUT: &str = "InvalidUserInput";

/// Adds an adapter: known from then on, listed in `/v1/models` with `root` = its path, and
/// loaded into a GPU slot when one is free or idle. Answers after the modelled load time, as
/// vLLM answers once `add_lora` has read the weights.
pub async fn load(state: &AppState, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let (_, body) = read_body(state, req).await?;
    let r: LoadRequest = serde_json::from_slice(&body)?;
    if r.lora_name.is_empty() || r.lora_path.is_empty() {
        return Err(invalid(
            "Both 'lora_name' and 'lora_path' must be provided.",
        ));
    }
    check_not_loaded(state, &r)?;
    if !state.driver.add_lora(&r.lora_name) {
        return Err(ApiError::unavailable());
    }
    if !state.lora_load.is_zero() {
        tokio::time::sleep(state.lora_load).await;
    }
    {
        // vLLM checks under a per-name lock held across the load; the mock checks again
        // after it, so that of two concurrent loads of one name exactly one succeeds.
        let mut models = state.models_mut();
        if models.lora(&r.lora_name).is_some() && !r.load_inplace {
            return Err(already_loaded(&r.lora_name));
        }
        models.add_lora(&r.lora_name, &r.lora_path);
    }
    tracing::info!(lora_name = %r.lora_name, lora_path = %r.lora_path, "loaded LoRA adapter");
    Ok(text(format!(
        "Success: LoRA adapter '{}' added successfully.",
        r.lora_name
    )))
}

/// Removes an adapter: unknown from then on (requests for it are 404) and out of its GPU
/// slot. Requests already running with it finish.
pub async fn unload(state: &AppState, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let (_, body) = read_body(state, req).await?;
    let r: UnloadRequest = serde_json::from_slice(&body)?;
    if r.lora_name.is_empty() {
        return Err(invalid(
            "'lora_name' needs to be provided to unload a LoRA adapter.",
        ));
    }
    if !state.models_mut().remove_lora(&r.lora_name) {
        return Err(ApiError::not_found(format!(
            "The lora adapter '{}' cannot be found.",
            r.lora_name
        )));
    }
    // The name is already unknown to new requests; the slot frees in the engine loop.
    state.driver.remove_lora(&r.lora_name);
    tracing::info!(lora_name = %r.lora_name, "removed LoRA adapter");
    Ok(text(format!(
        "Success: LoRA adapter '{}' removed successfully.",
        r.lora_name
    )))
}

fn check_not_loaded(state: &AppState, r: &LoadRequest) -> Result<(), ApiError> {
    if !r.load_inplace && state.models().lora(&r.lora_name).is_some() {
        return Err(already_loaded(&r.lora_name));
    }
    Ok(())
}

fn already_loaded(name: &str) -> ApiError {
    invalid(format!(
        "The lora adapter '{name}' has already been loaded. If you want to load the adapter \
         in place, set 'load_inplace' to True."
    ))
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message).with_kind(INVALID_USER_INPUT)
}

/// A 200 with a plain body and no content type, as Starlette's `Response(content=str)`.
fn text(body: String) -> Response<Body> {
    let mut resp = Response::new(full(Bytes::from(body)));
    *resp.status_mut() = StatusCode::OK;
    resp
}
