//! The subscription task: connect, receive, judge, replay, apply.

use super::replay::replay;
use crate::metrics::{OutcomeLabels, ReasonLabels};
use crate::serve::config::KvEventsConfig;
use crate::serve::state::{SharedState, lock};
use bytes::Bytes;
use kvmesh_protocol::kv_events::{
    EventChanges, ExactCache, KvEvent, SeqTracker, SeqVerdict, SkipReason, Tier, decode_batch,
};
use std::time::Duration;
use tokio::task::JoinHandle;
use zeromq::{Socket, SocketRecv, SubSocket};

/// Bound on one connection attempt (the engine may not be up yet).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between connection attempts.
const RETRY_PAUSE: Duration = Duration::from_secs(1);
/// Bound on one replay exchange.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the wait for the engine's first model list is reported.
const MODELS_WAIT_WARNING: Duration = Duration::from_secs(30);

/// Starts exact mode; the task runs until aborted.
pub fn spawn(state: SharedState, config: KvEventsConfig, block_tokens: usize) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut subscription = Subscription {
            cache: ExactCache::new(block_tokens),
            block_tokens,
            warned_block_size: false,
            seq: SeqTracker::new(),
            state,
            config,
        };
        subscription.run().await;
    })
}

struct Subscription {
    state: SharedState,
    config: KvEventsConfig,
    cache: ExactCache,
    /// The mesh's `--block-tokens`, which must equal vLLM's `--block-size`.
    block_tokens: usize,
    /// Whether the operator was told that the two differ (once: every event would repeat it).
    warned_block_size: bool,
    seq: SeqTracker,
}

impl Subscription {
    async fn run(&mut self) {
        self.state.metrics.kv_events_retrying.set(1);
        // Root blocks are seeded with the served model's name: wait until the engine said it,
        // telling the operator why nothing is subscribed meanwhile.
        let mut engine = self.state.engine.watch();
        while tokio::time::timeout(
            MODELS_WAIT_WARNING,
            engine.wait_for(|s| !s.models.is_empty()),
        )
        .await
        .is_err()
        {
            tracing::warn!(
                engine = self.state.engine.client.base_url(),
                "the engine has listed no model yet; KV events are not subscribed until it does"
            );
        }
        let mut socket = self.connect().await;
        loop {
            let message = match socket.recv().await {
                Ok(message) => message.into_vec(),
                Err(error) => {
                    // zeromq reconnects a SUB by itself; an error here is the socket's end.
                    tracing::warn!(%error, "KV-event subscription failed; reconnecting");
                    self.state.metrics.kv_events_retrying.set(1);
                    tokio::time::sleep(RETRY_PAUSE).await;
                    socket = self.connect().await;
                    continue;
                }
            };
            let [_topic, seq, payload] = &message[..] else {
                self.count("malformed", 1);
                continue;
            };
            let Ok(seq) = <[u8; 8]>::try_from(&seq[..]).map(u64::from_be_bytes) else {
                self.count("malformed", 1);
                continue;
            };
            self.receive(seq, payload).await;
        }
    }

    /// The subscribed socket: connected to the engine's publisher, or (`--kv-events-bind`)
    /// listening for the engine to connect.
    async fn connect(&self) -> SubSocket {
        let endpoint = &self.config.endpoint;
        let bind = self.config.bind;
        loop {
            let mut socket = SubSocket::new();
            let attempt = async {
                if bind {
                    socket.bind(endpoint).await?;
                } else {
                    socket.connect(endpoint).await?;
                }
                socket.subscribe(&self.config.topic).await
            };
            let outcome = tokio::time::timeout(CONNECT_TIMEOUT, attempt).await;
            let subscribed = matches!(outcome, Ok(Ok(())));
            let retrying = &self.state.metrics.kv_events_retrying;
            retrying.set(i64::from(!subscribed));
            match outcome {
                Ok(Ok(())) if bind => {
                    tracing::info!(endpoint, "listening for the engine's KV events");
                    return socket;
                }
                Ok(Ok(())) => {
                    tracing::info!(endpoint, "subscribed to the engine's KV events");
                    return socket;
                }
                Ok(Err(zeromq::ZmqError::Network(error)))
                    if bind && error.kind() == std::io::ErrorKind::AddrInUse =>
                {
                    tracing::warn!(
                    endpoint,
                    %error,
                    "cannot listen for KV events: another socket holds the port. If it is in \
                     the kernel's ephemeral range (net.ipv4.ip_local_port_range), the engine's \
                     own connection attempts to it can take it (a TCP self-connect) while \
                     nothing listens there: choose a port below that range, as 5557"
                    )
                }
                Ok(Err(error)) => tracing::warn!(endpoint, bind, %error, "KV-event subscription"),
                Err(_) => tracing::warn!(
                    endpoint,
                    "KV-event publisher not reachable yet (vLLM binds only a wildcard endpoint \
                     such as tcp://*:5557; given a host it connects, and this node must listen \
                     there: --kv-events-bind)"
                ),
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    async fn receive(&mut self, seq: u64, payload: &Bytes) {
        let first = !self.seq.started();
        match self.seq.live(seq) {
            SeqVerdict::InOrder => {}
            SeqVerdict::Gap { from, to } => self.fill_gap(from, to, first).await,
            SeqVerdict::Restarted => {
                tracing::warn!(seq, "KV-event publisher restarted; forgetting its cache");
                let cleared = self.cache.clear();
                self.publish(&cleared);
            }
        }
        self.apply(payload, "applied");
    }

    async fn fill_gap(&mut self, from: u64, to: u64, first: bool) {
        let missing = to - from;
        let mut recovered = 0;
        if let Some(endpoint) = self.config.replay_endpoint.clone() {
            let (batches, outcome) = replay(&endpoint, from, to, REPLAY_TIMEOUT).await;
            for (seq, payload) in &batches {
                if SeqTracker::replayed(*seq, from, to) {
                    self.apply(payload, "replayed");
                    recovered += 1;
                }
            }
            if let Err(error) = outcome {
                tracing::warn!(%error, from, to, recovered, "KV-event replay failed");
            }
        }
        let lost = missing.saturating_sub(recovered);
        if lost > 0 {
            // Before the first batch the engine may simply have been running a while; later,
            // a lost batch may hide an eviction, which the capacity bound does not correct.
            let outcome = if first { "before_start" } else { "lost" };
            self.count(outcome, lost);
            if !first {
                tracing::warn!(from, to, lost, "KV-event batches lost");
            }
        }
    }

    fn apply(&mut self, payload: &[u8], outcome: &str) {
        let batch = match decode_batch(payload) {
            Ok(batch) => batch,
            Err(error) => {
                tracing::warn!(%error, "undecodable KV-event batch");
                self.count("undecodable", 1);
                return;
            }
        };
        let metrics = &self.state.metrics;
        if let Some(error) = &batch.first_error {
            // Logged once per batch: a vLLM whose connector sends a shape we cannot read
            // would otherwise log every event.
            tracing::warn!(%error, bad_events = batch.bad_events, "skipped undecodable KV events");
            metrics.kv_event_bad_events.inc_by(batch.bad_events as u64);
        }
        // Root blocks are seeded as requests for the engine's model are (see
        // `AppState::model_identity`).
        let model = self.state.engine.state().models.first().cloned();
        let model = model.unwrap_or_default();
        let model = self.state.model_identity(&model).unwrap_or(model);
        let mut prefixes = lock(&self.state.prefixes);
        for event in &batch.events {
            let changes = self.cache.apply(event, &model);
            if let Some((reason, blocks)) = changes.skipped {
                if let KvEvent::BlockStored {
                    block_size,
                    token_ids,
                    ..
                } = event
                    && reason == SkipReason::BlockSizeMismatch
                    && !token_ids.is_empty()
                    && *block_size > 0
                    && !self.warned_block_size
                {
                    // A configuration error, not a transient: nothing this engine caches can
                    // be advertised until the two sizes agree.
                    tracing::error!(
                        vllm_block_size = block_size,
                        block_tokens = self.block_tokens,
                        "vLLM's --block-size differs from --block-tokens: no block can be \
                         advertised; set --block-tokens {block_size} on every node"
                    );
                    self.warned_block_size = true;
                }
                metrics
                    .kv_event_blocks_skipped
                    .get_or_create(&ReasonLabels {
                        reason: reason.as_str().to_owned(),
                    })
                    .inc_by(blocks as u64);
            }
            prefixes.apply_events(
                &changes.gpu,
                &changes.offload,
                self.cache.len(Tier::Gpu),
                self.cache.len(Tier::Offload),
            );
        }
        drop(prefixes);
        self.count(outcome, 1);
    }

    /// Hands changes to the summary (gossiped by the publish loop).
    fn publish(&self, changes: &EventChanges) {
        lock(&self.state.prefixes).apply_events(
            &changes.gpu,
            &changes.offload,
            self.cache.len(Tier::Gpu),
            self.cache.len(Tier::Offload),
        );
    }

    fn count(&self, outcome: &str, batches: u64) {
        self.state
            .metrics
            .kv_event_batches
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc_by(batches);
    }
}
