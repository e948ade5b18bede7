//! One simulated node: the engine model, the node's approximate prefix index and the summary
//! built from it, and the load digest it publishes.

use std::collections::HashMap;
use std::time::Duration;

use kvmesh_protocol::cadence::DigestPublisher;
use kvmesh_protocol::engine_metrics::{PrefillCounters, PrefillMeter, ewma};
use kvmesh_protocol::index::{IndexChanges, PrefixIndex};
use kvmesh_protocol::lifecycle::ServingState;
use kvmesh_protocol::route::Gauges;
use kvmesh_protocol::{EngineFacts, LoadDigest, Role, SummaryBuilder, SummaryConfig};

use super::histogram::LogHistogram;
use crate::engine::model::{Engine, EngineConfig, EngineRequest, Output};

/// The model name every simulated engine serves.
pub const MODEL: &str = "sim-model";

/// What an engine did to a request, for the run's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineEvent {
    FirstToken {
        request: u64,
        at_ns: u64,
    },
    Finished {
        request: u64,
        at_ns: u64,
        completion_tokens: u32,
    },
}

#[derive(Debug)]
pub struct SimNode {
    /// `node_key("node-{i + 1}")`, as a real node derives it from its id: the demo's node
    /// `i` (0-based) is `node-{i + 1}`, so that both rank the same chain's engines alike.
    pub key: u64,
    pub engine: Engine,
    pub index: PrefixIndex,
    pub summary: SummaryBuilder,
    /// Requests submitted and not finished.
    pub inflight: u32,
    /// Requests submitted in total.
    pub served: u64,
    pub ttft_ewma_ms: f64,
    /// First tokens since the last poll: (sum of their TTFTs in ms, how many).
    ttft_since_poll: (f64, u32),
    /// The engine's prefill speed as the sidecar measures it, tokens/s (0: not yet).
    pub prefill_tokens_per_s: f64,
    /// The engine's prefill speed, measured from its counters at each poll.
    prefill: PrefillMeter,
    /// The sidecar's exact count of its engine's queue (the gossiping policies' serving side).
    pub serving: ServingState,
    /// Numbers its digests and says which are gossiped, as the sidecar's does.
    publisher: DigestPublisher,
    /// The wake-up time queued for this engine, to skip stale queue entries.
    wake_ns: Option<u64>,
    /// Arrival times of submitted requests that have no first token yet.
    awaiting_first: HashMap<u64, u64>,
    /// The engine's role, as its digest announces it.
    pub role: Role,
    /// Time of each running request's last token, for the gaps between tokens.
    last_token_ns: HashMap<u64, u64>,
    /// Gaps between consecutive tokens of one request (inter-token latency), seconds.
    pub itl: LogHistogram,
}

impl SimNode {
    /// Node `index` over an engine of `config`. Its queue assumes `assumed_prefill_tokens_per_s`
    /// until it measures its engine's speed (see `digest`), as the sidecar's engine queue
    /// assumes the speed entries assume of an engine whose digest reports none.
    pub fn new(
        index: u32,
        config: EngineConfig,
        summary: SummaryConfig,
        assumed_prefill_tokens_per_s: f64,
    ) -> Self {
        let capacity = config.num_gpu_blocks as usize;
        let mut serving = ServingState::new();
        serving.set_prefill_speed(assumed_prefill_tokens_per_s);
        Self {
            key: kvmesh_protocol::route::node_key(&super::cluster::node_name(index)),
            engine: Engine::new(config),
            index: PrefixIndex::new(capacity),
            summary: SummaryBuilder::new(summary, 1).expect("validated summary geometry"),
            inflight: 0,
            served: 0,
            ttft_ewma_ms: 0.0,
            ttft_since_poll: (0.0, 0),
            prefill_tokens_per_s: 0.0,
            prefill: PrefillMeter::default(),
            serving,
            publisher: DigestPublisher::new(),
            wake_ns: None,
            awaiting_first: HashMap::new(),
            role: Role::Mixed,
            last_token_ns: HashMap::new(),
            itl: LogHistogram::default(),
        }
    }

    /// Hands a request that arrived at `arrival_ns` to the engine. Requests are validated
    /// against the engine's limits when routed, so refusal here is a bug worth a warning.
    pub fn submit(&mut self, request: EngineRequest, arrival_ns: u64) -> bool {
        let id = request.id;
        match self.engine.submit(request, Self::now(arrival_ns)) {
            Ok(()) => {
                self.awaiting_first.insert(id, arrival_ns);
                self.inflight += 1;
                self.served += 1;
                true
            }
            Err(error) => {
                tracing::warn!(%error, request = id, "engine refused a validated request");
                false
            }
        }
    }

    /// Runs the engine through every event up to `until_ns`, appending what happened to
    /// `events`. Each call of the engine's `advance` is made at the time of its next event, so
    /// every output is stamped with the end of the step that produced it.
    pub fn advance_to(
        &mut self,
        until_ns: u64,
        buffer: &mut Vec<Output>,
        events: &mut Vec<EngineEvent>,
    ) {
        let mut last = None;
        while let Some(next) = self.engine.next_event_time() {
            let at_ns = next.as_nanos() as u64;
            if at_ns > until_ns {
                break;
            }
            if last == Some(at_ns) && buffer.is_empty() {
                // Nothing came out of the previous advance at this same time and nothing
                // changed since: the engine waits for an arrival.
                break;
            }
            last = Some(at_ns);
            buffer.clear();
            self.engine.advance_into(next, buffer);
            self.record_outputs(at_ns, buffer, events);
        }
    }

    /// The event loop's wake-up at `now_ns`: runs the engine if this is still the wake-up it
    /// queued (a later submission may have queued another), and says whether it ran.
    pub fn wake(
        &mut self,
        now_ns: u64,
        buffer: &mut Vec<Output>,
        events: &mut Vec<EngineEvent>,
    ) -> bool {
        if self.wake_ns != Some(now_ns) {
            return false;
        }
        self.wake_ns = None;
        buffer.clear();
        self.engine.advance_into(Self::now(now_ns), buffer);
        self.record_outputs(now_ns, buffer, events);
        true
    }

    /// The time of the engine's next event, if the event loop must queue a wake-up for it (it
    /// has one and that one is not queued yet).
    pub fn next_wake(&mut self, now_ns: u64) -> Option<u64> {
        let at = (self.engine.next_event_time()?.as_nanos() as u64).max(now_ns);
        (self.wake_ns != Some(at)).then(|| {
            self.wake_ns = Some(at);
            at
        })
    }

    fn record_outputs(&mut self, at_ns: u64, outputs: &[Output], events: &mut Vec<EngineEvent>) {
        // The engine queues KV-cache events for a publisher; nobody subscribes here (the
        // approximate index is fed by routing), so drop them or they pile up without bound.
        drop(self.engine.take_kv_events());
        for out in outputs {
            if let Some(previous) = self.last_token_ns.insert(out.request, at_ns) {
                self.itl
                    .observe(at_ns.saturating_sub(previous) as f64 / 1e9);
            }
            if let Some(arrival) = self.awaiting_first.remove(&out.request) {
                self.observe_ttft(at_ns.saturating_sub(arrival) as f64 / 1e6);
                events.push(EngineEvent::FirstToken {
                    request: out.request,
                    at_ns,
                });
            }
            if let Some(finished) = &out.finished {
                self.last_token_ns.remove(&out.request);
                self.inflight -= 1;
                events.push(EngineEvent::Finished {
                    request: out.request,
                    at_ns,
                    completion_tokens: finished.completion_tokens,
                });
            }
        }
    }

    /// Records that `chain` was sent to this node's engine; returns what the index changed.
    pub fn index_chain(&mut self, chain: &[u64]) -> IndexChanges {
        let changes = self.index.insert_chain(chain);
        for &h in &changes.added {
            self.summary.insert(h);
        }
        for &h in &changes.evicted {
            self.summary.remove(h);
        }
        changes
    }

    /// A first token: counted towards the next digest's TTFT average.
    pub fn observe_ttft(&mut self, ttft_ms: f64) {
        self.ttft_since_poll.0 += ttft_ms;
        self.ttft_since_poll.1 += 1;
    }

    /// The engine's gauges as its `/metrics` shows them now.
    pub fn engine_gauges(&self) -> Gauges {
        let gauges = self.engine.gauges();
        Gauges {
            running: gauges.running as u32,
            waiting: gauges.waiting as u32,
            kv_usage: gauges.kv_usage.clamp(0.0, 1.0) as f32,
            queued_tokens: None,
        }
    }

    /// The sidecar's poll of its engine, every digest interval: the serving state's gauges,
    /// the TTFT average and the prefill speed.
    pub fn poll(&mut self, now_ns: u64) {
        let gauges = self.engine_gauges();
        self.serving.polled(gauges, now_ns / 1_000_000);
        // As the node's poller: the average moves once per poll, towards the mean TTFT of
        // the requests that had their first token since the last one.
        let (sum, count) = std::mem::take(&mut self.ttft_since_poll);
        // And the prefill speed as the poller measures it, from the engine's prefill time
        // (`vllm:request_prefill_time_seconds`, which the mock engine exposes as vLLM V1
        // does); nothing when no prefill ended.
        let stats = self.engine.stats();
        let counted = PrefillCounters {
            prompt_tokens: stats.prompt_tokens as f64,
            prefix_hits: stats.prefix_cache_hits as f64,
            seconds: stats.prefill_time.sum(),
        };
        let speed = self.prefill.observe(counted);
        if count > 0 {
            self.ttft_ewma_ms = ewma(self.ttft_ewma_ms, sum / f64::from(count));
        }
        if let Some(speed) = speed {
            self.prefill_tokens_per_s = ewma(self.prefill_tokens_per_s, speed);
            self.serving.set_prefill_speed(self.prefill_tokens_per_s);
        }
    }

    /// The digest of the engine's state now, as the sidecar builds it: the serving state's
    /// gauges (the last poll's, with the exact queue) and the poller's figures.
    pub fn digest(&mut self, now_ns: u64) -> LoadDigest {
        let version = self.publisher.next_version();
        self.serving.set_digest_version(version);
        let queue = self.serving.gauges(now_ns / 1_000_000);
        let config = self.engine.config();
        let facts = EngineFacts {
            kv_capacity_blocks: u64::from(config.num_gpu_blocks),
            block_size: config.block_size,
            ttft_ewma_ms: self.ttft_ewma_ms,
            prefill_tokens_per_s: self.prefill_tokens_per_s,
            inflight_forwarded: 0,
            role: self.role,
            healthy: true,
            models: vec![MODEL.to_owned()],
            loras: vec![],
            lora_use: Default::default(),
        };
        LoadDigest::new(version, now_ns / 1_000_000, queue, facts)
    }

    /// Whether the real node would gossip `digest` now (the sidecar's rule,
    /// [`DigestPublisher::should_gossip`]).
    pub fn should_gossip(&mut self, digest: &LoadDigest, now_ns: u64) -> bool {
        self.publisher.should_gossip(digest, now_ns / 1_000_000)
    }

    pub fn now(ns: u64) -> Duration {
        Duration::from_nanos(ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvmesh_protocol::gossip_keys;

    /// The speed a node's queue assumes before it measures its engine's: the entries' default.
    fn assumed() -> f64 {
        kvmesh_protocol::RouteConfig::default()
            .assumed
            .default_prefill_tokens_per_s
    }

    /// As the sidecar's poller: prompt tokens computed over the engine's prefill time (from
    /// first scheduling to first token), nothing before the first prefill ends.
    #[test]
    fn the_prefill_speed_is_measured_as_the_sidecar_measures_it() {
        let mut node = SimNode::new(
            0,
            EngineConfig::default(),
            SummaryConfig::default(),
            assumed(),
        );
        node.poll(0);
        assert_eq!(node.digest(0).prefill_tokens_per_s, 0.0, "not measured yet");
        // Long enough for a window of the meter (`MIN_PREFILL_WINDOW_S` of prefill time:
        // ~0.35 s on the default h100-8b engine).
        let prompt: Vec<u32> = (0..12_000).collect();
        // One token out: the request finishes in its first step, so its prompt tokens count.
        assert!(node.submit(EngineRequest::new(1, prompt, 1), 0));
        let (mut buffer, mut events) = (Vec::new(), Vec::new());
        node.advance_to(10_000_000_000, &mut buffer, &mut events);
        let Some(EngineEvent::FirstToken { at_ns, .. }) = events.first().copied() else {
            panic!("no first token: {events:?}");
        };
        node.poll(10_000_000_000);
        let measured = f64::from(node.digest(10_000_000_000).prefill_tokens_per_s);
        // Scheduled at once on an idle engine: its prefill time is its TTFT.
        let want = 12_000.0 / (at_ns as f64 / 1e9);
        assert!((measured - want).abs() < 1.0, "{measured} vs {want}");
        assert!(
            want < EngineConfig::default().timing.prefill_tokens_per_s(),
            "a step's overhead counts too: a lower bound"
        );
    }

    #[test]
    fn digests_are_the_sidecars_numbered_decodable_and_gossiped_by_its_rule() {
        let config = EngineConfig::default();
        let mut node = SimNode::new(0, config.clone(), SummaryConfig::default(), assumed());
        let first = node.digest(0);
        assert_eq!(first.version, 1);
        // What a peer's view decodes from the value gossiped under the digest key.
        let value = gossip_keys::encode_digest(&first);
        let decoded = gossip_keys::decode_digest(&value).unwrap();
        assert_eq!(decoded, first);
        assert_eq!(decoded.hash_version, kvmesh_protocol::hashing::HASH_VERSION);
        assert_eq!(decoded.kv_capacity_blocks, config.num_gpu_blocks);
        assert!(decoded.serves(MODEL));
        assert!(node.should_gossip(&first, 0));
        let quiet = node.digest(100_000_000);
        assert_eq!(quiet.version, 2);
        assert!(!node.should_gossip(&quiet, 100_000_000));
        // Only the TTFT average moved: the sidecar gossips it, so the simulator does.
        node.observe_ttft(250.0);
        let unpolled = node.digest(150_000_000);
        assert_eq!(
            unpolled.ttft_ewma_ms, 0.0,
            "the poller's figure, not yet polled"
        );
        node.poll(200_000_000);
        let moved = node.digest(200_000_000);
        assert!(moved.ttft_ewma_ms > 0.0);
        assert!(node.should_gossip(&moved, 200_000_000));
        let quiet = node.digest(1_100_000_000);
        assert!(!node.should_gossip(&quiet, 1_100_000_000));
        let due = node.digest(1_200_000_000);
        assert!(node.should_gossip(&due, 1_200_000_000), "once a second");
    }
}
