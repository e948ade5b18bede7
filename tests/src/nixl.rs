//! The mock engine's NixlConnector from the outside, as a prefill/decode proxy drives it: a
//! prefill leg that keeps the KV for a remote decode, then a decode leg that pulls it (vLLM's
//! `kv_transfer_params`). Shared by `tests/pd_engine.rs` and `benches/pd_transfer.rs`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::engine::Engine;
use crate::http::{OpenResponse, Request, Response};
use crate::openai::COMPLETIONS;
use crate::{EngineConfig, Timing};

/// Bound of one leg.
pub const LEG_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound on metrics settling after a leg.
pub const SETTLE: Duration = Duration::from_secs(10);
/// The toy proxy's client id, sent on both legs.
pub const CLIENT_ID: &str = "0b5e7a52-94b4-4a36-a7a4-e2a9f2f0c6a1";

/// A prompt of exactly `tokens` tokens (the mock's tokenizer reads 4 bytes per token).
pub fn prompt(seed: u32, tokens: u32) -> String {
    (0..tokens)
        .map(|i| format!("{:04x}", (i * 7919 + seed * 104_729) % 65_536))
        .collect()
}

pub fn nixl_engine(name: &str, timing: Timing, extra: &[&str]) -> Engine {
    let mut config = EngineConfig::new(name, &["mock"])
        .timing(timing)
        .arg("--kv-connector")
        .arg("nixl")
        .arg("--enable-prompt-tokens-details");
    for a in extra {
        config = config.arg(a);
    }
    let engine = config.start();
    engine.printed_endpoint("nixl side channel on ");
    engine
}

/// The toy proxy's prefill leg of `body`.
pub fn prefill_body(mut body: Value) -> Value {
    body["max_tokens"] = json!(1);
    body["stream"] = json!(false);
    body.as_object_mut().unwrap().remove("stream_options");
    body["kv_transfer_params"] = json!({"do_remote_decode": true, "do_remote_prefill": false,
        "remote_engine_id": null, "remote_block_ids": null, "remote_host": null,
        "remote_port": null});
    body
}

pub fn post(engine: &Engine, body: &Value) -> Response {
    Request::post_json(COMPLETIONS, body)
        .header("x-request-id", CLIENT_ID)
        .timeout(LEG_TIMEOUT)
        .send(engine.addr())
        .expect("leg")
}

pub fn open(engine: &Engine, body: &Value) -> OpenResponse {
    Request::post_json(COMPLETIONS, body)
        .header("x-request-id", CLIENT_ID)
        .timeout(LEG_TIMEOUT)
        .open(engine.addr())
        .expect("leg")
}

/// Runs the prefill leg on `p`; returns its `kv_transfer_params`.
pub fn prefill_leg(p: &Engine, body: &Value) -> Value {
    let r = post(p, &prefill_body(body.clone()));
    assert_eq!(r.status, 200, "{}", r.describe());
    r.json()["kv_transfer_params"].clone()
}

pub fn decode_body(body: &Value, params: &Value) -> Value {
    let mut body = body.clone();
    body["kv_transfer_params"] = params.clone();
    body
}
