//! `--fetch-media`: media given by plain URL, fetched from allowed hosts and inlined.
//!
//! A URL names content only as long as the content does not change, and the engine fetches it
//! itself: routing and caching by URL trusts both. With `--fetch-media` the entry fetches the
//! bytes (from the allow-listed hosts only, under a size cap and a timeout), and replaces the
//! URL with a `data:` URL of exactly those bytes, so the identity it pins (`pin_media_uuids`)
//! is the identity of what the engine computes on: no second fetch that could see other
//! content. A fetch that fails, is too large or too slow leaves the URL as it was: the request
//! is still served, routed by the URL.

use crate::metrics::NodeMetrics;
use crate::serve::media_config::FetchMedia;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kvmesh_protocol::hashing::{MediaPart, content_parts_mut};
use serde_json::Value;

/// Fetches media URLs for one node.
pub struct MediaFetcher {
    rules: FetchMedia,
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
}

impl MediaFetcher {
    pub fn new(rules: FetchMedia) -> anyhow::Result<Self> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(rules.timeout));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())?
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).build(https);
        Ok(Self { rules, client })
    }

    /// Replaces every fetchable media URL of a chat body's messages with a `data:` URL of its
    /// bytes; returns how many were inlined. Fetches run concurrently.
    pub async fn inline_urls(&self, body: &mut Value, metrics: &NodeMetrics) -> usize {
        let targets: Vec<(&mut Value, String)> = content_parts_mut(body)
            .filter_map(|part| {
                let url = match MediaPart::of(part) {
                    Some(MediaPart::Url(url)) if self.fetchable(url) => url.to_owned(),
                    _ => return None,
                };
                Some((part, url))
            })
            .collect();
        let fetches = targets.iter().map(|(_, url)| self.fetch(url));
        let fetched = futures::future::join_all(fetches).await;
        let mut inlined = 0;
        for ((part, url), result) in targets.into_iter().zip(fetched) {
            match result {
                Ok((content_type, bytes)) => {
                    metrics.media_fetched("fetched");
                    let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
                    replace_url(part, &url, format!("data:{content_type};base64,{b64}"));
                    inlined += 1;
                }
                Err(why) => {
                    metrics.media_fetched("fetch_failed");
                    tracing::debug!(%url, %why, "media not fetched; routed by its URL");
                }
            }
        }
        inlined
    }

    fn fetchable(&self, url: &str) -> bool {
        let Ok(uri) = url.parse::<http::Uri>() else {
            return false;
        };
        matches!(uri.scheme_str(), Some("http" | "https"))
            && uri.host().is_some_and(|host| self.rules.allows(host))
    }

    /// The content type and bytes at `url`, within the size cap and the timeout.
    async fn fetch(&self, url: &str) -> Result<(String, Bytes), String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("bad URL: {e}"))?;
        let fetch = async {
            let response = self.client.get(uri).await.map_err(|e| e.to_string())?;
            if !response.status().is_success() {
                return Err(format!("answered {}", response.status()));
            }
            // The media type alone (`image/png; q=1` → `image/png`): the engine reads the
            // data URL's type to choose a decoder.
            let content_type = response
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(';').next())
                .map(str::trim)
                .filter(|v| !v.is_empty() && !v.contains([',', ' ']))
                .unwrap_or("application/octet-stream")
                .to_owned();
            let limited = Limited::new(response.into_body(), self.rules.max_bytes);
            let bytes = limited
                .collect()
                .await
                .map_err(|e| format!("body: {e}"))?
                .to_bytes();
            Ok((content_type, bytes))
        };
        tokio::time::timeout(self.rules.timeout, fetch)
            .await
            .map_err(|_| format!("no answer within {:?}", self.rules.timeout))?
    }
}

/// Writes `data_url` where the part kept `url` (`{"image_url": {"url": …}}` or the bare
/// string form).
fn replace_url(part: &mut Value, url: &str, data_url: String) {
    let Some(object) = part.as_object_mut() else {
        return;
    };
    for field in object.values_mut() {
        match field {
            Value::String(text) if text == url => {
                *text = data_url;
                return;
            }
            Value::Object(inner) => {
                if let Some(Value::String(text)) = inner.get_mut("url")
                    && text == url
                {
                    *text = data_url;
                    return;
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvmesh_protocol::hashing::{MediaId, pin_media_uuids};
    use serde_json::json;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const PICTURE: &[u8] = b"\x89PNG\r\n\x1a\n not really, but bytes all the same";

    /// A one-connection-at-a-time HTTP/1.1 server: `/cat.png` is the picture, `/big` is over
    /// the cap, `/slow` never answers, anything else is a 404.
    async fn origin() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut request = vec![0u8; 4096];
                    let n = socket.read(&mut request).await.unwrap_or(0);
                    let request = String::from_utf8_lossy(&request[..n]).into_owned();
                    let path = request.split(' ').nth(1).unwrap_or("").to_owned();
                    let (status, body) = match path.as_str() {
                        "/cat.png" => ("200 OK", PICTURE.to_vec()),
                        "/big" => ("200 OK", vec![7u8; 5000]),
                        "/slow" => {
                            tokio::time::sleep(Duration::from_secs(30)).await;
                            return;
                        }
                        _ => ("404 Not Found", b"no".to_vec()),
                    };
                    let head = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: image/png; x=1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = socket.write_all(head.as_bytes()).await;
                    let _ = socket.write_all(&body).await;
                });
            }
        });
        address
    }

    fn chat(urls: &[String]) -> Value {
        let parts: Vec<Value> = urls
            .iter()
            .map(|url| json!({"type": "image_url", "image_url": {"url": url}}))
            .collect();
        json!({"model": "m", "messages": [{"role": "user", "content": parts}]})
    }

    #[tokio::test]
    async fn allowed_urls_are_inlined_and_everything_else_is_left_as_it_came() {
        let origin = origin().await;
        let fetcher = MediaFetcher::new(FetchMedia {
            hosts: vec!["127.0.0.1".into()],
            max_bytes: 1000,
            timeout: Duration::from_millis(500),
        })
        .unwrap();
        let metrics = NodeMetrics::default();
        let url = |path: &str| format!("http://{origin}{path}");
        let urls = [
            url("/cat.png"),
            url("/big"),
            url("/missing"),
            url("/slow"),
            format!("http://localhost:{}/cat.png", origin.port()),
        ];
        let mut body = chat(&urls);
        let started = std::time::Instant::now();
        assert_eq!(fetcher.inline_urls(&mut body, &metrics).await, 1);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "fetches are bounded"
        );
        let parts = body["messages"][0]["content"].clone();
        let inlined = parts[0]["image_url"]["url"].as_str().unwrap();
        assert!(inlined.starts_with("data:image/png;base64,"), "{inlined}");
        for (i, original) in urls.iter().enumerate().skip(1) {
            assert_eq!(parts[i]["image_url"]["url"], json!(original), "part {i}");
        }
        // The pinned identity is the identity of the fetched bytes.
        pin_media_uuids(&mut body);
        let uuid = body["messages"][0]["content"][0]["uuid"].clone();
        assert_eq!(uuid, json!(MediaId::of_bytes(PICTURE).uuid()));
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        let mut exposed = String::new();
        prometheus_client::encoding::text::encode(&mut exposed, &registry).unwrap();
        assert!(
            exposed.contains("kvmesh_media_parts_total{outcome=\"fetched\"} 1"),
            "{exposed}"
        );
        assert!(
            exposed.contains("kvmesh_media_parts_total{outcome=\"fetch_failed\"} 3"),
            "{exposed}"
        );
    }
}
