//! Everything the request path shares.

use crate::engine::LocalEngine;
use crate::mesh::Mesh;
use crate::metrics::NodeMetrics;
use crate::prefix::LocalPrefixes;
use crate::serve::config::ServeConfig;
use crate::serve::engine_queue::EngineQueue;
use crate::view::{SharedView, monotonic_ms};
use kvmesh_protocol::LoadDigest;
use kvmesh_protocol::lifecycle::EntryState;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// How long an engine judged unhealthy must have begun no answer for before the requests
/// waiting at it are given back (see [`AppState::engine_stalled`]): two of the poller's
/// timeouts, so that an engine whose answers merely queue behind a burst is not taken for a
/// frozen one.
pub const ENGINE_STALL: Duration = Duration::from_secs(2);

pub struct AppState {
    pub node_name: String,
    pub node_key: u64,
    pub config: ServeConfig,
    pub mesh: Arc<Mesh>,
    pub engine: LocalEngine,
    pub view: SharedView,
    /// This node's own latest digest and when it was built (monotonic ms).
    pub self_digest: RwLock<Option<(Arc<LoadDigest>, u64)>>,
    /// The entry side of the routing lifecycle: this node's recent sends (pending loads,
    /// optimistic prefix matches) and the loads peers reported back.
    pub entry: Mutex<EntryState>,
    /// This node's own engine cache index and its summary.
    pub prefixes: Mutex<LocalPrefixes>,
    /// The serving side: this node's engine's exact queue; admits or declines requests.
    pub engine_queue: EngineQueue,
    pub metrics: NodeMetrics,
    pub registry: Registry,
    pub start: Instant,
    /// Set by SIGTERM: the node stops being a target and finishes what it has.
    pub draining: AtomicBool,
    /// Set once peers had time to learn of the drain: requests still sent here are refused
    /// (and retried elsewhere). Until then they are served, which beats a retry.
    pub refusing: AtomicBool,
    /// Requests peers forwarded here that have not finished. (Requests that entered here are
    /// counted by the `inflight` gauge of [`NodeMetrics`].)
    pub inflight_forwarded: AtomicU32,
    /// Set once any peer was live: this node has joined the mesh (for `/ready`).
    pub peer_seen: AtomicBool,
    /// The last requests that entered here (`/debug/recent`, the dashboard).
    pub recent: crate::front::recent::RecentRequests,
    /// Which node's engine stored each Responses API answer this node relayed.
    pub response_homes: Arc<crate::front::responses::ResponseHomes>,
    /// LoRA adapters being loaded into this node's engine for requests placed here.
    pub adapters: crate::engine::adapters::AdapterLoader,
    /// `--fetch-media`'s client, when on.
    pub media_fetcher: Option<crate::front::media_fetch::MediaFetcher>,
}

impl AppState {
    pub fn now_ms(&self) -> u64 {
        monotonic_ms(self.start)
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Whether requests routed to this node's engine are turned away (late in a drain).
    pub fn refuses_new_requests(&self) -> bool {
        self.refusing.load(Ordering::Relaxed)
    }

    pub fn self_digest(&self) -> Option<(Arc<LoadDigest>, u64)> {
        self.self_digest
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What chains of requests for `model` are seeded by: the weights the name stands for,
    /// when an engine's card says (the least `root` any engine serving the name reports, so
    /// that every node picks the same), so that every name of one model meets the others'
    /// cache. A LoRA adapter keeps its own name, as vLLM's KV events name it. `None` while no
    /// card is known: the name itself.
    pub fn model_identity(&self, model: &str) -> Option<String> {
        let engine = self.engine.state();
        let view = self.view.load();
        let peers = view.peers.iter().flat_map(|peer| peer.models.iter());
        engine
            .cards
            .iter()
            .chain(peers)
            .filter(|card| card.id == model && !card.is_adapter())
            .filter_map(|card| card.root.as_deref())
            .min()
            .map(str::to_owned)
    }

    /// Makes sure this node's engine has the adapter `model` names before a request for it is
    /// handed over, loading it when this node may (see [`crate::engine::adapters`]).
    pub async fn ensure_adapter(&self, model: &str) -> Result<(), String> {
        let engine = self.engine.state();
        self.adapters
            .ensure(
                &engine,
                &self.engine.client,
                &self.config.lora,
                &self.metrics,
                model,
            )
            .await
    }

    /// Resolves once this node's engine is judged unhealthy and has begun no answer for
    /// [`ENGINE_STALL`] (at once if it never began one): a frozen or hung engine, whose
    /// requests waiting for their first byte are given back to be served elsewhere. An engine
    /// too busy to answer its poller in time but still beginning answers keeps them: given
    /// back, they would start over at the back of another engine's queue, and a burst that
    /// makes every engine this slow would run twice.
    pub async fn engine_stalled(&self) {
        loop {
            self.engine.unhealthy().await;
            match self.engine_queue.since_last_answer() {
                Some(quiet) if quiet < ENGINE_STALL => {
                    tokio::time::sleep(ENGINE_STALL - quiet).await
                }
                _ => return,
            }
        }
    }

    /// This node's engine accepted a request with `chain`: its blocks are now cached there.
    pub fn observe_served(&self, chain: &[u64]) {
        if !chain.is_empty() {
            lock(&self.prefixes).observe_chain(chain);
        }
    }
}

/// Locks a mutex, ignoring poisoning: every value behind these locks stays consistent
/// between statements, so a panic elsewhere leaves nothing half-updated.
pub fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counts something in flight for as long as it lives.
pub struct InflightGuard<'a>(&'a AtomicU32);

impl<'a> InflightGuard<'a> {
    pub fn new(counter: &'a AtomicU32) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(counter)
    }
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

pub type SharedState = Arc<AppState>;
