//! The load generator's HTTP client: pooled keep-alive connections with TCP_NODELAY, and the
//! measurement of one request from its real byte stream.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

use super::sse::{ResponseUsage, SseEvent, SseParser};

/// The response header a kvmesh sidecar adds to name the node that served a request.
pub const NODE_HEADER: &str = "x-kvmesh-node";
/// Why kvmesh chose that node.
pub const REASON_HEADER: &str = "x-kvmesh-reason";
/// The node whose engine ran a disaggregated request's prefill leg.
pub const PREFILL_NODE_HEADER: &str = "x-kvmesh-prefill-node";

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// Could not connect or send.
    Connect,
    /// No complete answer within the timeout.
    Timeout,
    /// A non-2xx status.
    Http(u16),
    /// The stream ended early, broke, or carried an error event.
    Stream,
    /// A 2xx body that is not a valid response.
    Body,
}

impl ErrorKind {
    /// Stable name used in reports (`connect`, `timeout`, `http_503`, `stream`, `body`).
    pub fn name(&self) -> String {
        match self {
            ErrorKind::Connect => "connect".into(),
            ErrorKind::Timeout => "timeout".into(),
            ErrorKind::Http(code) => format!("http_{code}"),
            ErrorKind::Stream => "stream".into(),
            ErrorKind::Body => "body".into(),
        }
    }
}

/// What one request measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// HTTP status, when a response arrived.
    pub status: Option<u16>,
    /// Time to the first generated text (streaming), or to the whole response.
    pub ttft: Option<Duration>,
    /// Gaps between consecutive text chunks, seconds (streaming only).
    pub itl: Vec<f32>,
    /// Time to the end of the response.
    pub e2e: Duration,
    /// `usage.prompt_tokens`, when reported.
    pub prompt_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`, when reported.
    pub cached_tokens: Option<u64>,
    /// Generated tokens (`usage.completion_tokens`, else text chunks).
    pub output_tokens: u64,
    /// Generated text, when asked for.
    pub text: String,
    /// Value of the `x-kvmesh-node` response header.
    pub node: Option<String>,
    /// Value of the `x-kvmesh-reason` response header.
    pub reason: Option<String>,
    /// Value of the `x-kvmesh-prefill-node` response header (disaggregated requests).
    pub prefill_node: Option<String>,
    /// Set when the request failed.
    pub error: Option<ErrorKind>,
}

/// A pooled HTTP/1.1 client.
#[derive(Clone)]
pub struct LoadClient {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for LoadClient {
    fn default() -> Self {
        Self::new()
    }
}

impl LoadClient {
    /// A client with keep-alive pooling and TCP_NODELAY on every connection.
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        Self { client }
    }

    /// `GET url`, returning status and body text.
    pub async fn get_text(&self, url: &str) -> Result<(StatusCode, String), String> {
        let req = Request::builder()
            .method(Method::GET)
            .uri(url)
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// `POST url` with a JSON body, returning status, headers and the whole body.
    pub async fn post_json(
        &self,
        url: &str,
        body: impl Into<Bytes>,
    ) -> Result<(StatusCode, http::HeaderMap, Bytes), String> {
        let req = Request::builder()
            .method(Method::POST)
            .uri(url)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(body.into()))
            .map_err(|e| e.to_string())?;
        let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((parts.status, parts.headers, body))
    }

    /// Sends one generation request and measures it. `headers` are added to the request;
    /// `keep_text` copies the generated text into the outcome.
    pub async fn measure(
        &self,
        url: &str,
        body: Bytes,
        headers: &[(&'static str, HeaderValue)],
        stream: bool,
        keep_text: bool,
        timeout: Duration,
    ) -> Outcome {
        let start = Instant::now();
        let mut outcome = Outcome::default();
        let run = self.measure_inner(url, body, headers, stream, keep_text, start, &mut outcome);
        if tokio::time::timeout(timeout, run).await.is_err() {
            outcome.error = Some(ErrorKind::Timeout);
        }
        outcome.e2e = start.elapsed();
        outcome
    }

    #[allow(clippy::too_many_arguments)]
    async fn measure_inner(
        &self,
        url: &str,
        body: Bytes,
        headers: &[(&'static str, HeaderValue)],
        stream: bool,
        keep_text: bool,
        start: Instant,
        out: &mut Outcome,
    ) {
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri(url)
            .header(header::CONTENT_TYPE, "application/json");
        for (k, v) in headers {
            builder = builder.header(*k, v.clone());
        }
        let Ok(req) = builder.body(Full::new(body)) else {
            out.error = Some(ErrorKind::Connect);
            return;
        };
        let resp = match self.client.request(req).await {
            Ok(r) => r,
            Err(_) => {
                out.error = Some(ErrorKind::Connect);
                return;
            }
        };
        out.status = Some(resp.status().as_u16());
        out.node = resp
            .headers()
            .get(NODE_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        out.reason = resp
            .headers()
            .get(REASON_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        out.prefill_node = resp
            .headers()
            .get(PREFILL_NODE_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let ok = resp.status().is_success();
        let mut body = resp.into_body();
        if !ok {
            let _ = body.collect().await;
            out.error = Some(ErrorKind::Http(out.status.unwrap_or(0)));
            return;
        }
        if !stream {
            let bytes = match body.collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => {
                    out.error = Some(ErrorKind::Stream);
                    return;
                }
            };
            out.ttft = Some(start.elapsed());
            parse_full(&bytes, keep_text, out);
            return;
        }
        let mut parser = SseParser::new();
        let mut events = Vec::new();
        let mut last: Option<Instant> = None;
        let mut chunks = 0u64;
        let mut done = false;
        let mut usage_out = None;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else {
                out.error = Some(ErrorKind::Stream);
                return;
            };
            let Some(data) = frame.data_ref() else {
                continue;
            };
            let now = Instant::now();
            parser.feed(data, keep_text, &mut events);
            for ev in events.drain(..) {
                match ev {
                    SseEvent::Content(t) => {
                        chunks += 1;
                        match last {
                            None => out.ttft = Some(now - start),
                            Some(prev) => out.itl.push((now - prev).as_secs_f32()),
                        }
                        last = Some(now);
                        if keep_text {
                            out.text.push_str(&t);
                        }
                    }
                    SseEvent::Usage(usage) => {
                        out.prompt_tokens = Some(usage.prompt_tokens);
                        out.cached_tokens = usage.cached_tokens;
                        usage_out = Some(usage.completion_tokens);
                    }
                    SseEvent::Done => done = true,
                    SseEvent::Empty => {}
                    SseEvent::Error(_) => out.error = Some(ErrorKind::Stream),
                }
            }
        }
        out.output_tokens = usage_out.unwrap_or(chunks);
        if !done || parser.has_partial() {
            out.error.get_or_insert(ErrorKind::Stream);
        }
    }
}

#[derive(Deserialize)]
struct FullResponse {
    #[serde(default)]
    choices: Vec<FullChoice>,
    #[serde(default)]
    usage: Option<ResponseUsage>,
}

#[derive(Deserialize)]
struct FullChoice {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    message: Option<FullMessage>,
}

#[derive(Deserialize)]
struct FullMessage {
    #[serde(default)]
    content: Option<String>,
}

fn parse_full(bytes: &[u8], keep_text: bool, out: &mut Outcome) {
    let Ok(r) = serde_json::from_slice::<FullResponse>(bytes) else {
        out.error = Some(ErrorKind::Body);
        return;
    };
    if r.choices.is_empty() {
        out.error = Some(ErrorKind::Body);
        return;
    }
    if let Some(u) = r.usage {
        out.prompt_tokens = Some(u.prompt_tokens);
        out.cached_tokens = u.cached_tokens;
        out.output_tokens = u.completion_tokens;
    }
    if keep_text {
        for c in r.choices {
            if let Some(t) = c.text.or(c.message.and_then(|m| m.content)) {
                out.text.push_str(&t);
            }
        }
    }
}
