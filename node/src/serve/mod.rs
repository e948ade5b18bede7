//! `kvmesh serve`: the sidecar, assembled.
//!
//! Start-up: load the identity, bind the HTTP listener, start the mesh, poll the engine,
//! publish the digest, keep the view of peers, serve forwarded requests, serve clients.
//! SIGTERM or Ctrl-C drains: the node stops being a target at once (its digest says
//! unhealthy), stops accepting clients once peers had time to see that, lets in-flight
//! requests finish up to the drain timeout, and leaves the mesh.

pub mod config;
pub mod declare;
pub mod engine_queue;
pub mod media_config;
pub mod options;
pub mod publish;
pub mod routing;
pub mod state;

use crate::engine::{EngineClient, LocalEngine};
use crate::front;
use crate::mesh::{Mesh, MeshConfig};
use crate::metrics::NodeMetrics;
use crate::prefix::{IndexMode, LocalPrefixes};
use crate::tls::{TlsReload, TlsSource};
use crate::view::{SharedView, encode_loadable};
use anyhow::Context;
use config::ServeConfig;
use engine_queue::EngineQueue;
use kvmesh_protocol::gossip_keys;
use kvmesh_protocol::lifecycle::EntryState;
use kvmesh_protocol::route::{Gauges, node_key};
use prometheus_client::registry::Registry;
use state::{AppState, SharedState};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Longest wait for the first engine poll before announcing readiness anyway (the engine may be
/// down: the node is still an entry point).
const FIRST_POLL_WAIT: Duration = Duration::from_secs(5);
/// How long a drained node waits for its peers to acknowledge that it closed the mesh.
const MESH_CLOSE_WAIT: Duration = Duration::from_secs(1);

/// Runs the sidecar until SIGTERM or Ctrl-C has drained it. The caller resolves the
/// configuration first: it says how many threads the runtime gets.
pub async fn run(config: ServeConfig) -> anyhow::Result<()> {
    let tls = TlsSource {
        dir: config.tls_dir.clone(),
        name: config.node_id.clone(),
        crl: config.crl.clone(),
    };
    let identity = tls
        .load()
        .with_context(|| format!("loading the TLS identity of node `{}`", config.node_id))?;
    let client = EngineClient::new(&config.backend, config.backend_api_key.clone())?;
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding the HTTP listener on {}", config.listen))?;
    let http_addr = listener.local_addr()?;

    let mut mesh_config =
        MeshConfig::new(config.mesh, config.cluster_id.clone(), config.seeds.clone());
    mesh_config.advertise = config.advertise;
    mesh_config.gossip.interval = config.gossip_interval;
    mesh_config.tls_reload = Some(TlsReload {
        source: tls,
        interval: config.tls_reload_interval,
    });
    let mesh = Arc::new(
        Mesh::start(mesh_config, identity)
            .await
            .context("starting the mesh")?,
    );
    let (engine, poller) = LocalEngine::spawn(client, config.digest_interval);

    let metrics = NodeMetrics::default();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    mesh.metrics().register(&mut registry);
    if let Some(intents) = &config.intents {
        intents.register(&mut registry);
    }

    let state: SharedState = Arc::new(AppState {
        node_name: config.node_id.clone(),
        node_key: node_key(&config.node_id),
        mesh: mesh.clone(),
        engine,
        view: SharedView::default(),
        self_digest: RwLock::new(None),
        entry: Mutex::new(EntryState::default()),
        prefixes: Mutex::new(
            LocalPrefixes::new(
                config.summary,
                mesh.gossip().self_node().generation,
                match config.kv_events {
                    Some(_) => IndexMode::Exact,
                    None => IndexMode::Approximate,
                },
            )
            .map_err(anyhow::Error::msg)?,
        ),
        engine_queue: EngineQueue::new(
            metrics.clone(),
            config.route.assumed.default_prefill_tokens_per_s,
        ),
        metrics,
        registry,
        start: Instant::now(),
        draining: AtomicBool::new(false),
        refusing: AtomicBool::new(false),
        inflight_forwarded: AtomicU32::new(0),
        peer_seen: AtomicBool::new(false),
        recent: Default::default(),
        response_homes: Default::default(),
        adapters: crate::engine::adapters::AdapterLoader::new(
            config.digest_interval * crate::engine::poller::MODELS_EVERY as u32,
        ),
        media_fetcher: config
            .media
            .fetch
            .clone()
            .map(crate::front::media_fetch::MediaFetcher::new)
            .transpose()?,
        config,
    });
    mesh.gossip()
        .set(gossip_keys::HTTP, &http_addr.to_string())
        .await?;
    mesh.gossip()
        .set(gossip_keys::VERSION, env!("CARGO_PKG_VERSION"))
        .await?;
    if let Some(intents) = &state.config.intents {
        // Peers show it in their /debug/cluster: a node that decides intents differently is
        // visible there. Nodes without an intents file gossip no such key.
        mesh.gossip()
            .set(gossip_keys::INTENTS, &intents.hash)
            .await?;
        let path = intents.path.display();
        tracing::info!(%path, hash = %intents.hash, "intent routing");
    }

    let loadable = &state.config.lora.loadable;
    if !loadable.is_empty() {
        // Every entry node places an adapter no engine serves among the engines that may
        // load it: it must know which those are.
        mesh.gossip()
            .set(gossip_keys::LORA, &encode_loadable(loadable))
            .await?;
        let rules: Vec<String> = loadable
            .rules
            .iter()
            .map(|rule| format!("{}={}", rule.pattern, rule.base))
            .collect();
        tracing::info!(?rules, "LoRA adapters loadable here at run time");
    }

    let mut tasks = vec![
        poller,
        tokio::spawn(poll_loop(state.clone())),
        tokio::spawn(view_loop(state.clone())),
        tokio::spawn(watch_join(state.clone())),
        tokio::spawn(publish::publish_loop(state.clone())),
    ];
    let incoming = mesh
        .take_incoming_forwards()
        .context("forward streams already taken")?;
    if let Some(kv_events) = state.config.kv_events.clone() {
        let block_tokens = state.config.hashing.token_prompt_block_tokens;
        tasks.push(crate::kv_events::spawn(
            state.clone(),
            kv_events,
            block_tokens,
        ));
    }
    if let Some(tokenizer) = &state.config.tokenizer {
        let path = tokenizer.path().display();
        tracing::info!(%path, "completions prompts are tokenized here, not by the engine");
    }
    tasks.push(tokio::spawn(crate::forward::serving::serve_forwards(
        state.clone(),
        incoming,
    )));
    // Ready means routable: wait (bounded) for the first look at the local engine, so the
    // first request does not find this node knowing no model at all.
    let mut engine_state = state.engine.watch();
    let _ = tokio::time::timeout(FIRST_POLL_WAIT, engine_state.wait_for(|s| s.polls > 0)).await;
    publish::publish_once(&state).await;
    let (stop_tx, stop_rx) = watch::channel(false);
    let front = tokio::spawn(front::server::serve(
        state.clone(),
        listener,
        stop_rx,
        state.config.drain_timeout,
    ));

    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "kvmesh listening on http://{http_addr} mesh {} node {}",
            mesh.advertise_addr(),
            state.node_name
        )?;
        out.flush()?;
    }

    shutdown_signal().await;
    drain(&state, stop_tx, front).await;
    for task in tasks {
        task.abort();
    }
    // Closing the endpoint tells every connected peer at once, so their pooled connections
    // fail now rather than at the idle timeout.
    state.mesh.shutdown(MESH_CLOSE_WAIT).await;
    Ok(())
}

/// Tells the engine queue each time the engine's gauges were read, so that it counts as
/// queued exactly what the gauges cannot show yet. A poll that failed read nothing new: its
/// gauges are the last ones, already told.
async fn poll_loop(state: SharedState) {
    let mut engine = state.engine.watch();
    let mut told: Option<Instant> = None;
    loop {
        let current = engine.borrow_and_update().clone();
        state.metrics.engine_healthy.set(i64::from(current.healthy));
        if let Some(asked_at) = current.metrics_asked_at
            && told != Some(asked_at)
        {
            told = Some(asked_at);
            state.engine_queue.polled(
                Gauges {
                    running: current.metrics.running.max(0.0) as u32,
                    waiting: current.metrics.waiting.max(0.0) as u32,
                    kv_usage: current.metrics.kv_usage as f32,
                    queued_tokens: None,
                },
                current.prefill_tokens_per_s,
                asked_at,
            );
        }
        if engine.changed().await.is_err() {
            return;
        }
    }
}

/// Keeps the shared view in step with gossip.
async fn view_loop(state: SharedState) {
    let mut membership = state.mesh.gossip().watch();
    loop {
        let snapshot = membership.borrow_and_update().clone();
        state.mesh.metrics().peers_alive.set(snapshot.len() as i64);
        if !snapshot.is_empty() {
            state.peer_seen.store(true, Ordering::Relaxed);
        }
        let before = state.view.load();
        state.view.update(&snapshot, state.now_ms(), &state.metrics);
        for gone in before
            .peers
            .iter()
            .filter(|p| snapshot.get(&p.name).is_none())
        {
            tracing::info!(peer = gone.name, "peer left or was declared dead");
            // Listening for the peer takes a while: not in the way of the next view.
            let (mesh, addr) = (state.mesh.clone(), gone.mesh_addr);
            tokio::spawn(async move { mesh.close_peer(addr).await });
        }
        if membership.changed().await.is_err() {
            return;
        }
    }
}

/// Says loudly when a node with seeds finds no live peer within its join wait (every seed
/// unreachable, or refusing its certificate): it then serves alone, which `/ready` allows so
/// that a mesh of one can start, but an operator must hear of it. Says so again when a peer
/// appears after all.
async fn watch_join(state: SharedState) {
    if state.config.seeds.is_empty() {
        return;
    }
    tokio::time::sleep(state.config.join_wait).await;
    let mut membership = state.mesh.gossip().watch();
    loop {
        let joined = state.peer_seen.load(Ordering::Relaxed);
        let alone = !joined && membership.borrow_and_update().is_empty();
        let was_alone = state.metrics.mesh_unjoined.get() == 1;
        if alone && !was_alone {
            let mesh = state.mesh.metrics();
            tracing::error!(
                seeds = ?state.config.seeds,
                waited_s = state.config.join_wait.as_secs(),
                connect_failures = mesh.connect_failures.get(),
                handshakes_rejected = mesh.handshakes_rejected.get(),
                "no live peer after the join wait: serving alone, not part of the mesh \
                 (check the seeds, the mesh port over UDP, and that every node's certificate \
                 comes from the same CA)"
            );
        } else if !alone && was_alone {
            tracing::info!("joined the mesh after all");
        }
        state.metrics.mesh_unjoined.set(i64::from(alone));
        if !alone || membership.changed().await.is_err() {
            return;
        }
    }
}

async fn drain(state: &SharedState, stop: watch::Sender<bool>, front: tokio::task::JoinHandle<()>) {
    tracing::info!(node = state.node_name, "draining");
    state.draining.store(true, Ordering::Relaxed);
    // The next digest says unhealthy; give peers a few gossip rounds to stop routing here
    // while this node still serves what they send meanwhile.
    tokio::time::sleep(state.config.gossip_interval * 3 + state.config.digest_interval).await;
    state.refusing.store(true, Ordering::Relaxed);
    let _ = stop.send(true);
    let deadline = Instant::now() + state.config.drain_timeout;
    let _ = tokio::time::timeout(state.config.drain_timeout, front).await;
    while (state.inflight_forwarded.load(Ordering::Relaxed) > 0 || state.metrics.inflight.get() > 0)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::info!(node = state.node_name, "drained; leaving the mesh");
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
