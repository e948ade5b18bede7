//! The HTTP front: what clients and operators see.
//!
//! - [`server`]: the listener (TCP_NODELAY, keep-alive, graceful drain).
//! - [`handlers`]: one function per endpoint.
//! - [`inference`]: the request path of `/v1/completions` and `/v1/chat/completions`:
//!   parse → hash → decide → forward → relay.
//! - [`disaggregated`]: the request path of a request split into a prefill and a decode leg.
//! - [`ready`]: `GET /ready`, the readiness verdict (draining, engine, joined the mesh).
//! - [`exposition`]: `/metrics` as OpenMetrics or as the Prometheus text format, as asked.
//! - [`responses`]: where a Responses API continuation goes (the engine that stored it).
//! - [`recent`]: the last requests that entered here (`/debug/recent`, the dashboard).
//! - [`dashboard`]: `GET /dashboard`, a live page of the cluster, self-contained.
//! - [`debug_match`]: `POST /debug/match`, which nodes this node believes hold a prefix.
//! - [`intent`]: `model: "auto"` rewritten to the model of the prompt's intent (`--intents`).
//! - [`hashing`]: a body into its prefix chain (asking the engine's tokenizer in token mode).
//! - [`errors`], [`body`]: the OpenAI error shape and response bodies.

pub mod body;
pub mod dashboard;
pub mod debug_match;
pub mod disaggregated;
pub mod errors;
pub mod exposition;
pub mod handlers;
pub mod hashing;
pub mod inference;
pub mod intent;
pub mod media;
pub mod media_fetch;
pub mod ready;
pub mod recent;
pub mod responses;
pub mod server;
