//! The HTTP server of the mock engine (hyper 1).

pub mod body;
mod chat_parts;
pub mod driver;
pub mod errors;
pub mod http;
pub mod http_lora;
pub mod http_pooling;
pub mod http_responses;
pub mod metrics_text;
pub mod openai;
pub mod pooling;
pub mod responses;
pub mod responses_api;
pub mod vectors;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use self::http::AppState;
use self::metrics_text::MetricsLabels;
use self::openai::Models;
use super::config::EngineArgs;
use super::model::{Engine, KvCacheEvent};
use super::nixl::puller::PullerConfig;
use kvmesh_protocol::mix64;

/// Builds the shared state and starts the engine driver on the current runtime.
/// `side_channel` is the NIXL side channel's address, with `--kv-connector nixl`.
pub fn app_state(
    args: &EngineArgs,
    local: SocketAddr,
    side_channel: Option<SocketAddr>,
    events: Option<mpsc::UnboundedSender<Vec<KvCacheEvent>>>,
) -> Arc<AppState> {
    let cfg = args.engine_config();
    let engine = Engine::new(cfg.clone());
    let engine_cfg = engine.config().clone();
    let pulls = args.kv_connector.map(|_| PullerConfig {
        block_size: engine_cfg.block_size,
        bytes_per_block: args.kv_bytes_per_block(),
        timing: engine_cfg.timing.clone(),
        lease: engine_cfg.kv_lease,
    });
    let driver = driver::spawn(engine, events, pulls);
    let id_salt = mix64(args.seed ^ (u64::from(local.port()) << 32) ^ std::process::id() as u64);
    Arc::new(AppState {
        models: RwLock::new(Models::new(args.models.clone(), &args.loras)),
        runtime_lora: args.allow_runtime_lora_updating,
        lora_load: engine_cfg.timing.lora_load_duration(),
        labels: MetricsLabels {
            model_name: args.models[0].clone(),
            engine: args.engine_index.to_string(),
            block_size: engine_cfg.block_size,
            num_gpu_blocks: engine_cfg.num_gpu_blocks,
            max_loras: engine_cfg.max_loras,
        },
        engine: engine_cfg,
        driver,
        connector: args.kv_connector,
        engine_id: args
            .engine_id
            .clone()
            .unwrap_or_else(|| fresh_engine_id(id_salt)),
        side_channel: side_channel.map(|a| (a.ip().to_string(), a.port())),
        max_body_bytes: args.max_body_bytes,
        prompt_tokens_details: args.enable_prompt_tokens_details,
        media: args.media_config(),
        next_id: AtomicU64::new(0),
        id_salt,
        responses: Arc::default(),
    })
}

/// A uuid4-shaped engine id, new for every process (vLLM draws a uuid4 per engine), so a
/// restarted prefill engine is a different peer to decode engines.
fn fresh_engine_id(salt: u64) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let hi = mix64(salt ^ nanos);
    let lo = mix64(hi ^ 0x6b76_6d65_7368);
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xfff,
        lo >> 52,
        lo & 0xffff_ffff_ffff
    )
}

/// Accepts connections forever, serving each with HTTP/1.1 keep-alive and TCP_NODELAY.
pub async fn serve(listener: TcpListener, state: Arc<AppState>) -> std::io::Result<()> {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Running out of file descriptors must not end the server.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| http::handle(state.clone(), req));
            if let Err(e) = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
}
