//! Header policy of the proxy.

use http::HeaderMap;

/// Hop-by-hop headers (RFC 9110 §7.6.1) and those the proxy sets itself.
const NEVER_FORWARDED: [&str; 11] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "host",
    "content-length",
    "authorization",
    "proxy-authorization",
];

/// Client headers the engine should see: everything but hop-by-hop headers, the client's
/// credentials for kvmesh, and kvmesh's own `x-kvmesh-*`.
pub fn request_headers_for_engine(headers: &HeaderMap, request_id: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = headers
        .iter()
        .filter(|(name, _)| {
            let name = name.as_str();
            !NEVER_FORWARDED.contains(&name)
                && !name.starts_with("x-kvmesh-")
                && name != "x-request-id"
        })
        .filter_map(|(name, value)| {
            Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
        })
        .collect();
    out.push(("x-request-id".to_owned(), request_id.to_owned()));
    out
}

/// Engine response headers the client should see.
pub fn response_headers_from_engine(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| !NEVER_FORWARDED.contains(&name.as_str()))
        .filter_map(|(name, value)| {
            Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
        })
        .collect()
}

/// Whether a response is a server-sent event stream.
pub fn is_event_stream(headers: &[(String, String)]) -> bool {
    headers.iter().any(|(name, value)| {
        name.eq_ignore_ascii_case("content-type") && value.starts_with("text/event-stream")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_hop_by_hop_headers_stay_behind() {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Bearer client-key".parse().unwrap());
        headers.insert("connection", "keep-alive".parse().unwrap());
        headers.insert("content-type", "application/json".parse().unwrap());
        headers.insert("x-kvmesh-anything", "1".parse().unwrap());
        headers.insert("x-request-id", "client-id".parse().unwrap());
        headers.insert("x-custom", "kept".parse().unwrap());
        let out = request_headers_for_engine(&headers, "rid");
        let names: Vec<&str> = out.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.contains(&"content-type") && names.contains(&"x-custom"));
        assert!(!names.contains(&"authorization") && !names.contains(&"connection"));
        assert!(out.contains(&("x-request-id".into(), "rid".into())));
        assert_eq!(out.iter().filter(|(n, _)| n == "x-request-id").count(), 1);
    }
}
