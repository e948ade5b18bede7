//! Handlers of the Responses API: `POST /v1/responses` (whole or streamed) and
//! `GET /v1/responses/{id}`.
//!
//! A response is one chat generation through the engine, so it is timed, batched, cached and
//! counted like `/v1/chat/completions`. A continued conversation renders the stored turn
//! first, so its prompt starts with the previous prompt and answer and hits their KV blocks.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use tokio::sync::mpsc;

use super::body::Body;
use super::driver::{Submission, TokenEvent};
use super::errors::ApiError;
use super::http::{AppState, fresh_id, json_response, read_body, run_to_end, unix_now};
use super::responses;
use super::responses_api::{
    self, Counts, EventWriter, Meta, ResponseStore, ResponsesRequest, Stored,
};
use crate::engine::model::chat_prompt::{ChatTurn, render_chat_prompt};
use crate::engine::model::{EngineRequest, FinishReason, KvTransfer, validate};

/// `POST /v1/responses`.
pub async fn create(state: &AppState, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let (_, body) = read_body(state, req).await?;
    let r = responses_api::parse(&body, &state.models(), &state.media)?;
    let prev = responses_api::previous(&state.responses, &r)?;
    let messages = responses_api::conversation(&r, prev.as_ref());
    let rendered = render_chat_prompt(&messages, true);
    let prompt = rendered.tokens;
    let max_model_len = state.engine.max_model_len;
    if prompt.len() >= max_model_len as usize {
        return Err(responses_api::prompt_too_long(prompt.len(), max_model_len));
    }
    // vLLM's `get_max_tokens`: what was asked for, at most the rest of the context.
    let room = max_model_len - prompt.len() as u32;
    let max_tokens = r.max_output_tokens.map_or(room, |m| m.min(room));
    validate(&state.engine, prompt.len(), max_tokens)
        .map_err(|e| ApiError::bad_param("input", e.to_string()))?;
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let hex = fresh_id(state, id);
    let meta = Meta {
        id: r
            .request_id
            .clone()
            .unwrap_or_else(|| format!("resp_{hex}")),
        message_id: format!("msg_{hex}"),
        created_at: unix_now(),
        max_output_tokens: max_tokens,
    };
    let request = EngineRequest {
        id,
        prompt,
        max_tokens,
        min_tokens: 0,
        ignore_eos: r.ignore_eos,
        lora: r.model.lora.clone(),
        cache_salt: r.cache_salt.clone(),
        kv_transfer: KvTransfer::None,
        media: rendered.media,
    };
    if r.stream {
        let (tx, rx) = mpsc::unbounded_channel();
        let submission = Submission {
            requests: vec![request],
            internal_ids: Vec::new(),
            remote: None,
            sink: tx,
        };
        if !state.driver.submit(submission) {
            return Err(ApiError::unavailable());
        }
        return Ok(stream(state.responses.clone(), r, meta, messages, rx));
    }
    let mut done = run_to_end(state, vec![request]).await?;
    let Some(d) = done.pop() else {
        return Err(ApiError::dropped());
    };
    let counts = Counts {
        input: d.finished.prompt_tokens,
        cached: d.finished.cached_tokens,
        output: d.finished.completion_tokens,
    };
    let body = responses_api::response_object(
        &r,
        &meta,
        &d.text,
        Some(d.finished.reason.as_str()),
        Some(counts),
    );
    keep(&state.responses, &r, &meta, messages, d.text, &body);
    Ok(json_response(StatusCode::OK, Bytes::from(body.to_string())))
}

/// `GET /v1/responses/{id}`: a stored response, or vLLM's 404.
pub fn retrieve(state: &AppState, id: &str) -> Result<Response<Body>, ApiError> {
    let stored = state
        .responses
        .get(id)
        .ok_or_else(|| responses_api::not_found(id))?;
    Ok(json_response(
        StatusCode::OK,
        Bytes::from(stored.body.to_string()),
    ))
}

/// Stores a finished response when the request asked for it (`store`, default true).
fn keep(
    store: &ResponseStore,
    r: &ResponsesRequest,
    meta: &Meta,
    messages: Vec<ChatTurn>,
    output: String,
    body: &serde_json::Value,
) {
    if r.store {
        store.insert(
            meta.id.clone(),
            Stored {
                messages,
                output,
                body: body.clone(),
            },
        );
    }
}

/// State of one streamed response.
struct Streaming {
    rx: mpsc::UnboundedReceiver<TokenEvent>,
    store: Arc<ResponseStore>,
    req: ResponsesRequest,
    meta: Meta,
    messages: Vec<ChatTurn>,
    writer: EventWriter,
    text: String,
    frame: BytesMut,
    done: bool,
}

impl Streaming {
    fn push(&mut self, (_, out): TokenEvent) {
        let Some(f) = out.finished.as_ref() else {
            self.text.push_str(out.text);
            self.writer.delta(&self.meta, out.text, &mut self.frame);
            return;
        };
        if f.reason == FinishReason::Error {
            // Headers went out with the stream: report the failure in it, as vLLM does.
            self.frame
                .extend_from_slice(&responses::sse_error(&ApiError::generation_failed()));
            self.done = true;
            return;
        }
        self.text.push_str(out.text);
        if !out.text.is_empty() {
            self.writer.delta(&self.meta, out.text, &mut self.frame);
        }
        let counts = Counts {
            input: f.prompt_tokens,
            cached: f.cached_tokens,
            output: f.completion_tokens,
        };
        let body = responses_api::response_object(
            &self.req,
            &self.meta,
            &self.text,
            Some(f.reason.as_str()),
            Some(counts),
        );
        self.writer
            .finish(&self.meta, &self.text, &body, &mut self.frame);
        keep(
            &self.store,
            &self.req,
            &self.meta,
            std::mem::take(&mut self.messages),
            self.text.clone(),
            &body,
        );
        self.done = true;
    }
}

fn stream(
    store: Arc<ResponseStore>,
    req: ResponsesRequest,
    meta: Meta,
    messages: Vec<ChatTurn>,
    rx: mpsc::UnboundedReceiver<TokenEvent>,
) -> Response<Body> {
    let mut writer = EventWriter::default();
    let first = writer.start(&req, &meta);
    let st = Streaming {
        rx,
        store,
        req,
        meta,
        messages,
        writer,
        text: String::new(),
        frame: BytesMut::from(&first[..]),
        done: false,
    };
    // Like the completions stream: one body frame per wake-up, holding every event ready.
    let events = futures::stream::unfold(st, |mut st| async move {
        loop {
            while !st.done {
                match st.rx.try_recv() {
                    Ok(ev) => st.push(ev),
                    Err(_) => break,
                }
            }
            if !st.frame.is_empty() {
                let frame = st.frame.split().freeze();
                return Some((frame, st));
            }
            if st.done {
                return None;
            }
            match st.rx.recv().await {
                Some(ev) => st.push(ev),
                // The engine dropped the request: end the stream without `response.completed`.
                None => return None,
            }
        }
    });
    let body = StreamBody::new(events.map(|b| Ok::<_, Infallible>(Frame::data(b))));
    let mut resp = Response::new(BodyExt::boxed(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    resp
}
