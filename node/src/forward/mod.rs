//! Forwarding a request to the engine the decision chose, and serving requests peers forward.
//!
//! - [`headers`]: which headers cross the proxy in each direction.
//! - [`attempts`]: a leg's attempts in rank order until one answers.
//! - [`entry`]: one attempt from the entry node, to the local engine or over a QUIC stream.
//! - [`relay`]: streaming an upstream body to the client, unbuffered, with a clean SSE error
//!   event when it breaks after the first byte.
//! - [`transfer`]: the NixlConnector protocol's bodies (prefill leg, decode leg).
//! - [`serving`]: the peer side: accept a forward stream, call the local engine, stream back.

pub mod attempts;
pub mod entry;
pub mod headers;
pub mod relay;
pub mod serving;
pub mod transfer;

/// The generation endpoints: hashed into prefix chains, routed cache-aware.
const GENERATION_PATHS: [&str; 2] = ["/v1/completions", "/v1/chat/completions"];

/// vLLM's endpoints outside `/v1/` that take a `model` and are routed by model and load.
const ROOT_PATHS: [&str; 7] = [
    "/pooling",
    "/classify",
    "/score",
    "/rerank",
    "/v2/rerank",
    "/tokenize",
    "/detokenize",
];

/// vLLM's administrative endpoints under `/v1/`: they change an engine, so no client reaches
/// them through a sidecar, and no peer through the mesh.
const ADMIN_PATHS: [&str; 2] = ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"];

/// Whether a `POST` to `path` is an inference request a sidecar forwards to an engine (and
/// the only paths a peer may ask this node's engine for): the generation endpoints, vLLM's
/// pooling, scoring and tokenizer endpoints, and any other `/v1/…` path but the
/// administrative ones (`/v1/embeddings`, `/v1/responses`, `/v1/score`, `/v1/rerank`, and
/// what later vLLM versions add). A path with anything but plain segments is not.
pub fn forwardable(path: &str) -> bool {
    let plain = path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'-'))
        && !path.contains("//")
        && !path.ends_with('/');
    plain
        && (GENERATION_PATHS.contains(&path)
            || ROOT_PATHS.contains(&path)
            || (path.starts_with("/v1/") && !ADMIN_PATHS.contains(&path)))
}

#[cfg(test)]
mod tests {
    use super::forwardable;

    #[test]
    fn inference_paths_are_forwarded_admin_and_odd_ones_are_not() {
        for path in [
            "/v1/completions",
            "/v1/chat/completions",
            "/v1/embeddings",
            "/v1/responses",
            "/v1/rerank",
            "/rerank",
            "/score",
            "/tokenize",
            "/v1/audio/transcriptions",
        ] {
            assert!(forwardable(path), "{path}");
        }
        for path in [
            "/v1/load_lora_adapter",
            "/v1/unload_lora_adapter",
            "/v1/",
            "/v1",
            "/metrics",
            "/health",
            "/v1/../metrics",
            "/v1//completions",
            "/v1/completions?x=1",
            "/v1/%2e%2e/metrics",
            "/sleep",
        ] {
            assert!(!forwardable(path), "{path}");
        }
    }
}
