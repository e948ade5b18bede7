//! `kvmesh-sim engine`: a mock vLLM engine.
//!
//! [`model`] is the sans-IO engine; [`server`] is the HTTP shell around it; [`kv_events`]
//! publishes the cache state over ZMQ; [`run`] wires them together for the CLI.

pub mod config;
pub mod kv_events;
pub mod model;
pub mod server;

use std::net::SocketAddr;

use anyhow::Context;
use tokio::net::TcpListener;

use self::config::EngineArgs;
use self::kv_events::KvEventsConfig;

/// Addresses a started engine listens on.
#[derive(Debug, Clone)]
pub struct EngineAddrs {
    /// HTTP address.
    pub http: SocketAddr,
    /// KV-event PUB endpoint.
    pub kv_events: Option<String>,
    /// KV-event replay endpoint.
    pub kv_events_replay: Option<String>,
}

/// Binds everything, then returns the addresses and the future that serves HTTP forever.
pub async fn start(
    args: &EngineArgs,
) -> anyhow::Result<(
    EngineAddrs,
    impl std::future::Future<Output = std::io::Result<()>>,
)> {
    anyhow::ensure!(!args.models.is_empty(), "at least one --model is required");
    let listener = TcpListener::bind((args.host, args.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    let http = listener.local_addr()?;
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
    };
    let state = server::app_state(args, http, publisher.map(|p| p.sender));
    Ok((addrs, server::serve(listener, state)))
}
