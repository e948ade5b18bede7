//! `GET /dashboard`: a live page of the cluster as this node sees it (nodes, their load and
//! cache, recent requests and why they went where they did, decisions by reason, gossip).
//!
//! One HTML file compiled into the binary: no CDN, no build step, nothing to install. The page
//! polls this node's `/debug/cluster`, `/debug/recent` and `/metrics`; with `--api-key` it asks
//! for the key once and keeps it for the browser tab.

use super::body::{ResponseBody, full};
use hyper::Response;

const PAGE: &str = include_str!("dashboard.html");

pub fn page() -> Response<ResponseBody> {
    let mut response = Response::new(full(PAGE));
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // The page only ever talks to the node that served it.
    headers.insert(
        http::header::CONTENT_SECURITY_POLICY,
        http::HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
             connect-src 'self'",
        ),
    );
    response
}
