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

/// The only paths a peer may ask this node's engine for: a forwarded request never reaches
/// any other URL.
pub const FORWARDABLE_PATHS: [&str; 2] = ["/v1/completions", "/v1/chat/completions"];
