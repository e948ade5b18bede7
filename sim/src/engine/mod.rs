//! `kvmesh-sim engine`: a mock vLLM engine.
//!
//! [`model`] is the sans-IO engine; [`server`] is the HTTP shell around it; [`kv_events`]
//! publishes the cache state over ZMQ; [`nixl`] speaks vLLM's NixlConnector protocol for
//! disaggregated prefill; [`start`] wires them together for the CLI.

pub mod config;
pub mod kv_events;
pub mod model;
pub mod nixl;
pub mod server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;

use self::config::EngineArgs;
use self::kv_events::KvEventsConfig;
use self::nixl::side_channel::{self, SideChannel};

/// Addresses a started engine listens on.
#[derive(Debug, Clone)]
pub struct EngineAddrs {
    /// HTTP address.
    pub http: SocketAddr,
    /// KV-event PUB endpoint.
    pub kv_events: Option<String>,
    /// KV-event replay endpoint.
    pub kv_events_replay: Option<String>,
    /// NIXL side channel, with `--kv-connector nixl`.
    pub nixl_side_channel: Option<SocketAddr>,
}

/// Binds everything, then returns the addresses and the future that serves HTTP forever.
pub async fn start(
    args: &EngineArgs,
) -> anyhow::Result<(
    EngineAddrs,
    impl std::future::Future<Output = std::io::Result<()>>,
)> {
    anyhow::ensure!(!args.models.is_empty(), "at least one --model is required");
    args.validate().map_err(anyhow::Error::msg)?;
    let listener = TcpListener::bind((args.host, args.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    let http = listener.local_addr()?;
    let side_listener = match args.kv_connector {
        Some(_) => {
            let host = args.nixl_side_channel_host.unwrap_or(args.host);
            let port = args.nixl_side_channel_port;
            Some(TcpListener::bind((host, port)).await.with_context(|| {
                format!("cannot listen on {host}:{port} for the NIXL side channel")
            })?)
        }
        None => None,
    };
    let nixl_side_channel = side_listener.as_ref().map(|l| l.local_addr()).transpose()?;
    let publisher = match &args.kv_events {
        Some(ep) => Some(
            kv_events::start(KvEventsConfig {
                endpoint: ep.clone(),
                replay_endpoint: args.kv_events_replay.clone(),
                topic: args.kv_events_topic.clone(),
                format: args.kv_events_format,
                buffer: args.kv_events_buffer,
            })
            .await?,
        ),
        None => None,
    };
    let addrs = EngineAddrs {
        http,
        kv_events: publisher.as_ref().map(|p| p.endpoint.clone()),
        kv_events_replay: publisher.as_ref().and_then(|p| p.replay_endpoint.clone()),
        nixl_side_channel,
    };
    let state = server::app_state(args, http, nixl_side_channel, publisher.map(|p| p.sender));
    if let Some(listener) = side_listener {
        let ctx = Arc::new(SideChannel {
            engine_id: state.engine_id.clone(),
            block_size: state.engine.block_size,
            fault: args.nixl_fault,
            fault_delay: Duration::from_millis(args.nixl_fault_delay_ms),
            driver: state.driver.clone(),
        });
        tokio::spawn(side_channel::serve(listener, ctx));
    }
    Ok((addrs, server::serve(listener, state)))
}
