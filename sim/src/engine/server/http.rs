//! Request routing and handlers: parse → validate → submit → answer (whole or streamed).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::body::{Body, empty, full};
use super::driver::{DriverHandle, Submission, TokenEvent};
use super::errors::ApiError;
use super::metrics_text::{self, MetricsLabels};
use super::openai::{self, Endpoint, Generation, Models};
use super::pooling::PoolingEndpoint;
use super::responses::{self, ChoiceResult, PromptTokensDetails, ResponseMeta, Usage};
use super::responses_api::ResponseStore;
use super::{http_lora, http_pooling, http_responses};
use crate::engine::config::KvConnector;
use crate::engine::model::{
    EngineConfig, EngineRequest, FinishReason, Finished, KvTransfer, MediaConfig, validate,
};
use crate::engine::nixl::params::{self, Leg};
use kvmesh_protocol::mix64;

/// Everything handlers share.
pub struct AppState {
    /// Served models and adapters; adapters change at run time (`/v1/load_lora_adapter`).
    pub models: RwLock<Models>,
    /// Serve `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`.
    pub runtime_lora: bool,
    /// The modelled time a load takes (`/v1/load_lora_adapter` answers after it).
    pub lora_load: Duration,
    /// The engine model's configuration (for validation and `/tokenize`).
    pub engine: EngineConfig,
    /// The driver task.
    pub driver: DriverHandle,
    /// Metric labels.
    pub labels: MetricsLabels,
    /// KV connector, if any.
    pub connector: Option<KvConnector>,
    /// Id reported to decode engines.
    pub engine_id: String,
    /// Host and port of the NIXL side channel, reported to decode engines.
    pub side_channel: Option<(String, u16)>,
    /// Largest accepted body.
    pub max_body_bytes: usize,
    /// Report cached tokens in usage.
    pub prompt_tokens_details: bool,
    /// How chat media items are sized (`--media-tokens-per-item`).
    pub media: MediaConfig,
    /// Source of request ids.
    pub next_id: AtomicU64,
    /// Process-unique salt of response ids.
    pub id_salt: u64,
    /// Stored Responses API answers, for `previous_response_id`.
    pub responses: Arc<ResponseStore>,
}

impl AppState {
    /// The models, for reading. No handler panics while holding the lock, but a poisoned
    /// lock still holds a consistent list (every write is one push or retain), so it is used.
    pub fn models(&self) -> RwLockReadGuard<'_, Models> {
        self.models.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The models, for changing.
    pub fn models_mut(&self) -> RwLockWriteGuard<'_, Models> {
        self.models.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// Routes one request.
pub async fn handle(
    state: Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path();
    let resp = match (req.method(), path) {
        (&Method::GET, "/health") => Ok(Response::new(empty())),
        (&Method::GET, "/v1/models") => Ok(models(&state)),
        (&Method::GET, "/metrics") => metrics(&state).await,
        (&Method::POST, "/v1/completions") => generate(&state, req, Endpoint::Completions).await,
        (&Method::POST, "/v1/chat/completions") => generate(&state, req, Endpoint::Chat).await,
        (&Method::POST, "/tokenize") => tokenize(&state, req).await,
        (&Method::POST, "/detokenize") => http_pooling::detokenize(&state, req).await,
        (&Method::POST, "/v1/embeddings") => {
            http_pooling::pooling(&state, req, PoolingEndpoint::Embeddings).await
        }
        (&Method::POST, "/pooling") => {
            http_pooling::pooling(&state, req, PoolingEndpoint::Pooling).await
        }
        (&Method::POST, "/classify") => {
            http_pooling::pooling(&state, req, PoolingEndpoint::Classify).await
        }
        (&Method::POST, "/score" | "/v1/score") => http_pooling::score(&state, req, false).await,
        (&Method::POST, "/rerank" | "/v1/rerank" | "/v2/rerank") => {
            http_pooling::score(&state, req, true).await
        }
        (&Method::POST, "/v1/responses") => http_responses::create(&state, req).await,
        (&Method::POST, "/v1/load_lora_adapter") if state.runtime_lora => {
            http_lora::load(&state, req).await
        }
        (&Method::POST, "/v1/unload_lora_adapter") if state.runtime_lora => {
            http_lora::unload(&state, req).await
        }
        (_, "/v1/load_lora_adapter" | "/v1/unload_lora_adapter") if state.runtime_lora => {
            Err(ApiError::method_not_allowed())
        }
        (method, p) if stored_response_id(p).is_some() => match *method {
            Method::GET => http_responses::retrieve(&state, stored_response_id(p).unwrap_or("")),
            _ => Err(ApiError::method_not_allowed()),
        },
        (
            _,
            "/health"
            | "/v1/models"
            | "/metrics"
            | "/v1/completions"
            | "/v1/chat/completions"
            | "/tokenize"
            | "/detokenize"
            | "/v1/embeddings"
            | "/pooling"
            | "/classify"
            | "/score"
            | "/v1/score"
            | "/rerank"
            | "/v1/rerank"
            | "/v2/rerank"
            | "/v1/responses",
        ) => Err(ApiError::method_not_allowed()),
        _ => Err(ApiError::not_found(format!("Not Found: {path}"))),
    };
    Ok(resp.unwrap_or_else(ApiError::into_response))
}

/// The id of `GET /v1/responses/{id}`: one path segment after the prefix.
fn stored_response_id(path: &str) -> Option<&str> {
    path.strip_prefix("/v1/responses/")
        .filter(|id| !id.is_empty() && !id.contains('/'))
}

pub(super) fn json_response(status: StatusCode, body: Bytes) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

pub(super) async fn read_body(
    state: &AppState,
    req: Request<Incoming>,
) -> Result<(http::request::Parts, Bytes), ApiError> {
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > state.max_body_bytes) {
        return Err(ApiError::too_large(state.max_body_bytes));
    }
    match Limited::new(body, state.max_body_bytes).collect().await {
        Ok(c) => Ok((parts, c.to_bytes())),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ApiError::too_large(state.max_body_bytes))
        }
        Err(e) => Err(ApiError::bad_request(format!(
            "could not read the request body: {e}"
        ))),
    }
}

fn models(state: &AppState) -> Response<Body> {
    let created = unix_now();
    let models = state.models();
    let base = &models.served[0];
    let card = |id: &str, root: &str, parent: Option<&str>| {
        json!({
            "id": id, "object": "model", "created": created, "owned_by": "vllm",
            "root": root, "parent": parent, "max_model_len": state.engine.max_model_len,
            "permission": [],
        })
    };
    let mut data: Vec<Value> = models.served.iter().map(|m| card(m, base, None)).collect();
    data.extend(
        models
            .loras
            .iter()
            .map(|l| card(&l.name, &l.path, Some(base))),
    );
    let body = json!({"object": "list", "data": data});
    json_response(StatusCode::OK, Bytes::from(body.to_string()))
}

async fn metrics(state: &AppState) -> Result<Response<Body>, ApiError> {
    let snap = state
        .driver
        .snapshot()
        .await
        .ok_or_else(ApiError::unavailable)?;
    let text = metrics_text::render(
        &state.labels,
        &snap.gauges,
        &snap.stats,
        snap.transfers.as_ref(),
        snap.epoch_unix_s,
    );
    let mut resp = Response::new(full(text));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(metrics_text::CONTENT_TYPE),
    );
    Ok(resp)
}

async fn tokenize(state: &AppState, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let (_, body) = read_body(state, req).await?;
    let tokens = openai::parse_tokenize(&body, &state.models(), &state.media)?;
    let body = json!({
        "count": tokens.len(),
        "max_model_len": state.engine.max_model_len,
        "tokens": tokens,
        "token_strs": null,
    });
    Ok(json_response(StatusCode::OK, Bytes::from(body.to_string())))
}

async fn generate(
    state: &AppState,
    req: Request<Incoming>,
    endpoint: Endpoint,
) -> Result<Response<Body>, ApiError> {
    let (parts, body) = read_body(state, req).await?;
    let generation = match endpoint {
        Endpoint::Completions => openai::parse_completion(&body, &state.models())?,
        Endpoint::Chat => openai::parse_chat_with_media(&body, &state.models(), &state.media)?,
    };
    let leg = match state.connector {
        // vLLM keeps the params on the request, but only a KV connector reads them: without
        // one, a prefill leg is an ordinary request (answered with `kv_transfer_params: null`)
        // and a decode leg prefills its prompt itself.
        None => Leg::Whole,
        Some(KvConnector::Nixl) => params::parse(generation.kv_transfer_params.as_ref())
            .map_err(|e| ApiError::bad_param("kv_transfer_params", e))?,
    };
    if leg != Leg::Whole && generation.prompts.len() > 1 {
        return Err(ApiError::bad_param(
            "kv_transfer_params",
            "kvmesh-sim serves disaggregated legs of one prompt only, not of a batch",
        ));
    }
    let first_id = state
        .next_id
        .fetch_add(generation.prompts.len() as u64, Ordering::Relaxed);
    let requests = engine_requests(state, &generation, &leg, first_id)?;
    let prefix = match endpoint {
        Endpoint::Completions => "cmpl",
        Endpoint::Chat => "chatcmpl",
    };
    let id_body = id_body(state, &parts, first_id);
    // Only a prefill leg shows its internal id (as `remote_request_id`); other requests skip
    // building it.
    let internal_ids = if leg == Leg::Prefill {
        internal_ids(state, endpoint, &id_body, first_id, requests.len())
    } else {
        Vec::new()
    };
    let meta = ResponseMeta {
        id: format!("{prefix}-{id_body}"),
        created: unix_now(),
        model: generation.model.name.clone(),
        endpoint,
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let choices = requests.len();
    let remote = match leg {
        Leg::Decode(remote) => Some(remote),
        _ => None,
    };
    let submission = Submission {
        requests,
        internal_ids: internal_ids.clone(),
        remote,
        sink: tx,
    };
    if !state.driver.submit(submission) {
        return Err(ApiError::unavailable());
    }
    if generation.stream {
        return Ok(stream_response(state, meta, generation, choices, rx));
    }
    let done = finish_all(rx, choices).await?;
    let mut usage = Usage::default();
    let mut cached = 0;
    let mut kv_params = None;
    for (i, Done { finished: f, .. }) in done.iter().enumerate() {
        usage.prompt_tokens += f.prompt_tokens;
        usage.completion_tokens += f.completion_tokens;
        cached += f.cached_tokens;
        if let (Some(blocks), Some(side_channel), Some(internal_id)) = (
            &f.remote_block_ids,
            &state.side_channel,
            internal_ids.get(i),
        ) {
            kv_params = Some(params::prefill_answer(
                &state.engine_id,
                internal_id,
                (&side_channel.0, side_channel.1),
                blocks,
            ));
        }
    }
    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
    if state.prompt_tokens_details {
        usage.prompt_tokens_details = Some(PromptTokensDetails {
            cached_tokens: cached,
        });
    }
    let choices: Vec<ChoiceResult> = done
        .into_iter()
        .map(|done| ChoiceResult {
            finish_reason: done.finished.reason.as_str(),
            text: done.text,
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        responses::full_response(&meta, &choices, usage, kv_params),
    ))
}

/// The id of a response without its prefix: the client's `X-Request-Id` (vLLM uses it as
/// the base of its ids), else one unique to this process and request.
pub(super) fn id_body(state: &AppState, parts: &http::request::Parts, first_id: u64) -> String {
    parts
        .headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .unwrap_or_else(|| fresh_id(state, first_id))
}

/// A process-unique 32-hex-digit id for request `first_id`.
pub(super) fn fresh_id(state: &AppState, first_id: u64) -> String {
    format!(
        "{:016x}{:016x}",
        mix64(state.id_salt),
        mix64(first_id ^ state.id_salt)
    )
}

/// A finished engine request: its text and how it ended.
pub(super) struct Done {
    /// Generated text.
    pub text: String,
    /// Finish details.
    pub finished: Finished,
}

/// Hands `requests` to the engine and waits until every one has finished, so they queue,
/// batch, hit the prefix cache and count in the metrics like any other request.
pub(super) async fn run_to_end(
    state: &AppState,
    requests: Vec<EngineRequest>,
) -> Result<Vec<Done>, ApiError> {
    let n = requests.len();
    let (tx, rx) = mpsc::unbounded_channel();
    let submission = Submission {
        requests,
        internal_ids: Vec::new(),
        remote: None,
        sink: tx,
    };
    if !state.driver.submit(submission) {
        return Err(ApiError::unavailable());
    }
    finish_all(rx, n).await
}

/// The `n` requests of a submission, each to its end (in submission order): an error if one
/// failed, or if the engine dropped one before it finished.
async fn finish_all(
    mut rx: mpsc::UnboundedReceiver<TokenEvent>,
    n: usize,
) -> Result<Vec<Done>, ApiError> {
    let mut texts = vec![String::new(); n];
    let mut finished: Vec<Option<Finished>> = vec![None; n];
    while let Some((index, out)) = rx.recv().await {
        let i = index as usize;
        texts[i].push_str(out.text);
        if let Some(f) = out.finished {
            if f.reason == FinishReason::Error {
                return Err(ApiError::generation_failed());
            }
            finished[i] = Some(f);
        }
    }
    texts
        .into_iter()
        .zip(finished)
        .map(|(text, f)| {
            f.map(|finished| Done { text, finished })
                .ok_or_else(ApiError::dropped)
        })
        .collect()
}

/// The engine's internal request ids, shaped as vLLM's: the endpoint's prefix, the
/// client's id (or a fresh one), the choice index for completions, and a random suffix
/// (vLLM appends one so that client-chosen ids cannot collide inside the engine).
fn internal_ids(
    state: &AppState,
    endpoint: Endpoint,
    base: &str,
    first_id: u64,
    n: usize,
) -> Vec<String> {
    (0..n)
        .map(|i| {
            let suffix = mix64((first_id + i as u64) ^ state.id_salt) as u32;
            match endpoint {
                Endpoint::Completions => format!("cmpl-{base}-{i}-{suffix:08x}"),
                Endpoint::Chat => format!("chatcmpl-{base}-{suffix:08x}"),
            }
        })
        .collect()
}

fn engine_requests(
    state: &AppState,
    g: &Generation,
    leg: &Leg,
    first_id: u64,
) -> Result<Vec<EngineRequest>, ApiError> {
    let kv_transfer = match leg {
        Leg::Whole => KvTransfer::None,
        Leg::Prefill => KvTransfer::RemoteDecode,
        Leg::Decode(remote) => KvTransfer::RemotePrefill {
            remote_blocks: remote.block_ids.len(),
        },
    };
    let mut out = Vec::with_capacity(g.prompts.len());
    for (i, prompt) in g.prompts.iter().enumerate() {
        let room = (state.engine.max_model_len as usize).saturating_sub(prompt.len()) as u32;
        let max_tokens = match (g.max_tokens, g.endpoint) {
            (Some(m), _) => m,
            (None, Endpoint::Completions) => 16,
            (None, Endpoint::Chat) => room.max(1),
        };
        validate(&state.engine, prompt.len(), max_tokens)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        out.push(EngineRequest {
            id: first_id + i as u64,
            prompt: prompt.clone(),
            max_tokens,
            min_tokens: g.min_tokens,
            ignore_eos: g.ignore_eos,
            lora: g.model.lora.clone(),
            cache_salt: g.cache_salt.clone(),
            kv_transfer: kv_transfer.clone(),
            // A chat has one prompt, and only a chat has media.
            media: g.media.clone(),
        });
    }
    Ok(out)
}

/// State of one SSE response.
struct StreamState {
    rx: mpsc::UnboundedReceiver<TokenEvent>,
    meta: ResponseMeta,
    pending: std::collections::VecDeque<Bytes>,
    open: usize,
    usage: Usage,
    cached: u32,
    include_usage: bool,
    details: bool,
    /// The engine failed the request: the stream ends with vLLM's error event.
    failed: bool,
    done: bool,
}

impl StreamState {
    fn push_token(&mut self, (index, out): TokenEvent) {
        if out.finished.as_ref().map(|f| f.reason) == Some(FinishReason::Error) {
            // Headers went out with the stream: like vLLM, report the failure in the stream.
            self.pending
                .push_back(responses::sse_error(&ApiError::generation_failed()));
            self.open = 0;
            self.failed = true;
            return;
        }
        let finish = out.finished.as_ref().map(|f| f.reason.as_str());
        self.pending
            .push_back(responses::token_chunk(&self.meta, index, out.text, finish));
        if let Some(f) = out.finished {
            self.open -= 1;
            self.usage.prompt_tokens += f.prompt_tokens;
            self.usage.completion_tokens += f.completion_tokens;
            self.cached += f.cached_tokens;
        }
    }

    fn finish(&mut self) {
        if self.include_usage && !self.failed {
            self.usage.total_tokens = self.usage.prompt_tokens + self.usage.completion_tokens;
            if self.details {
                self.usage.prompt_tokens_details = Some(PromptTokensDetails {
                    cached_tokens: self.cached,
                });
            }
            self.pending
                .push_back(responses::usage_chunk(&self.meta, self.usage));
        }
        self.pending.push_back(responses::sse_done());
        self.done = true;
    }
}

fn stream_response(
    state: &AppState,
    meta: ResponseMeta,
    g: Generation,
    choices: usize,
    rx: mpsc::UnboundedReceiver<TokenEvent>,
) -> Response<Body> {
    let mut pending = std::collections::VecDeque::new();
    if meta.endpoint == Endpoint::Chat {
        for i in 0..choices {
            pending.push_back(responses::chat_role_chunk(&meta, i as u32));
        }
    }
    let st = StreamState {
        rx,
        meta,
        pending,
        open: choices,
        usage: Usage::default(),
        cached: 0,
        include_usage: g.include_usage,
        details: state.prompt_tokens_details,
        failed: false,
        done: false,
    };
    // Each body frame carries every chunk available at that moment: one write per engine
    // step instead of one per token when several tokens arrive together.
    let stream = futures::stream::unfold(st, |mut st| async move {
        loop {
            while st.open > 0 {
                match st.rx.try_recv() {
                    Ok(ev) => st.push_token(ev),
                    Err(_) => break,
                }
            }
            if st.open == 0 && !st.done {
                st.finish();
            }
            if !st.pending.is_empty() {
                let mut frame = BytesMut::new();
                for b in st.pending.drain(..) {
                    frame.extend_from_slice(&b);
                }
                return Some((frame.freeze(), st));
            }
            if st.done {
                return None;
            }
            match st.rx.recv().await {
                Some(ev) => st.push_token(ev),
                // The engine dropped the request: end the stream without [DONE].
                None => return None,
            }
        }
    });
    let body = StreamBody::new(stream.map(|b| Ok::<_, Infallible>(Frame::data(b))));
    let mut resp = Response::new(BodyExt::boxed(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    resp
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
