//! HTTP/1.1 client to the local engine: pooled keep-alive connections with TCP_NODELAY (a
//! streamed answer through a proxy stalls tens of milliseconds per chunk with Nagle on).

use super::progress::Progress;
use bytes::Bytes;
use http::{Method, Request, Response, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// Why the engine could not be used.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid engine URL {0:?}: {1}")]
    Url(String, String),
    #[error("engine unreachable: {0}")]
    Unreachable(String),
    #[error("engine did not answer within {0:?}")]
    Timeout(Duration),
    #[error("engine answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("reading the engine's answer failed: {0}")]
    Body(String),
}

/// A client bound to one engine base URL such as `http://127.0.0.1:8001`.
#[derive(Clone, Debug)]
pub struct EngineClient {
    base: String,
    authority: http::uri::Authority,
    client: Client<HttpConnector, Full<Bytes>>,
    api_key: Option<String>,
    /// When the engine last answered anything (see [`Progress`]).
    progress: Progress,
}

impl EngineClient {
    /// `api_key`: sent as a bearer token when the engine itself runs with `--api-key`.
    pub fn new(base_url: &str, api_key: Option<String>) -> Result<Self, EngineError> {
        let base = base_url.trim_end_matches('/').to_owned();
        let uri: Uri = base.parse().map_err(|e: http::uri::InvalidUri| {
            EngineError::Url(base_url.to_owned(), e.to_string())
        })?;
        if uri.scheme_str() != Some("http") {
            return Err(EngineError::Url(
                base_url.to_owned(),
                "only http:// is supported".into(),
            ));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| EngineError::Url(base_url.to_owned(), "no host".into()))?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(256)
            .build(connector);
        Ok(Self {
            base,
            authority,
            client,
            api_key,
            progress: Progress::default(),
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The engine's last sign of work on inference: the heads and body chunks of the answers
    /// the forwarding path reads note it (not the poller's, `/tokenize`'s or adapter loads':
    /// the API server answers those without the engine core).
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// Sends a request to `path` (e.g. `/v1/completions`) of this engine and returns as soon
    /// as the response head arrives; the body streams.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(String, String)],
        body: Bytes,
    ) -> Result<Response<Incoming>, EngineError> {
        let uri = format!("{}{}", self.base, path);
        let mut builder = Request::builder().method(method).uri(uri);
        builder = builder.header(http::header::HOST, self.authority.as_str());
        for (name, value) in headers {
            builder = builder.header(name.as_str(), value.as_str());
        }
        if let Some(key) = &self.api_key {
            builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let request = builder
            .body(Full::new(body))
            .map_err(|e| EngineError::Unreachable(format!("building the request: {e}")))?;
        self.client
            .request(request)
            .await
            .map_err(|e| EngineError::Unreachable(error_chain(&e)))
    }

    /// GETs `path` and returns the body if the status is 200, within `within`.
    pub async fn get_text(&self, path: &str, within: Duration) -> Result<String, EngineError> {
        let fetch = async {
            let response = self.send(Method::GET, path, &[], Bytes::new()).await?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| EngineError::Body(e.to_string()))?
                .to_bytes();
            let text = String::from_utf8_lossy(&body).into_owned();
            if status != http::StatusCode::OK {
                return Err(EngineError::Status {
                    status: status.as_u16(),
                    body: text,
                });
            }
            Ok(text)
        };
        tokio::time::timeout(within, fetch)
            .await
            .map_err(|_| EngineError::Timeout(within))?
    }
}

/// The error with its sources, on one line (hyper's top-level message alone says little).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
