//! The sidecar's own Prometheus metrics (`GET /metrics`): what an operator asks of a router.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Outcomes of KV-event batches (`kvmesh_kv_event_batches_total`), as `kv_events` counts them.
pub const KV_EVENT_OUTCOMES: [&str; 6] = [
    "applied",
    "replayed",
    "lost",
    "before_start",
    "undecodable",
    "malformed",
];

/// Outcomes of media parts (`kvmesh_media_parts_total`), see `Metrics::media_pinned`.
pub const MEDIA_PART_OUTCOMES: [&str; 6] = [
    "pinned",
    "replaced",
    "unverified",
    "moved",
    "fetched",
    "fetch_failed",
];

/// Why a disaggregated request ran whole after all (`kvmesh_pd_fallbacks_total`):
/// - `prefill_failed`: every prefill engine tried failed before answering;
/// - `no_transfer_params`: the prefill answered without `kv_transfer_params` (it did not stop
///   on its length: nothing to pull);
/// - `no_decode`: no decode engine could take the decode leg;
/// - `decode_failed`: the decode leg failed again after its prefill ran a second time.
pub const PD_FALLBACK_CAUSES: [&str; 4] = [
    "prefill_failed",
    "no_transfer_params",
    "no_decode",
    "decode_failed",
];

/// Why a request a peer forwarded here was refused before it reached the engine (the
/// `reason` of `kvmesh_peer_requests_refused_total`):
/// - `malformed`: frames that do not decode, no head, or a frame out of place;
/// - `too_large`: a frame or body over its limit;
/// - `slow`: the whole request did not arrive in time;
/// - `not_forwardable`: a method, path or hop count a peer may not send.
pub const PEER_REFUSAL_REASONS: [&str; 4] = ["malformed", "too_large", "slow", "not_forwardable"];

/// Why an attempt was given up before its first byte (`kvmesh_attempts_abandoned_total`).
pub const ABANDON_PEER_DEAD: &str = "peer_dead";
pub const ABANDON_ENGINE_UNHEALTHY: &str = "engine_unhealthy";
pub const ABANDON_PEER_SILENT: &str = "peer_silent";

/// Outcome of a request that entered at this node.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Outcome {
    /// The engine answered (any status it chose; see `engine_status`).
    Answered,
    /// Refused by this node before routing (bad input, auth, size, unknown model).
    Rejected,
    /// No engine could take it (503).
    NoTarget,
    /// Every attempt failed before a response started (502).
    Failed,
    /// The response started, then broke.
    Interrupted,
    /// The client went away before the whole answer was relayed (the engine's request was
    /// cancelled).
    Cancelled,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Answered => "answered",
            Outcome::Rejected => "rejected",
            Outcome::NoTarget => "no_target",
            Outcome::Failed => "failed",
            Outcome::Interrupted => "interrupted",
            Outcome::Cancelled => "cancelled",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub reason: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetLabels {
    /// `local` (this node's engine) or `peer` (over QUIC).
    pub target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabels {
    pub version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    /// `live`, `report` or `digest` (see `lifecycle::Source`).
    pub source: String,
}

/// Cheap to clone: every field is a shared handle.
#[derive(Clone, Debug)]
pub struct NodeMetrics {
    pub requests: Family<RequestLabels, Counter>,
    pub forward_latency: Family<TargetLabels, Histogram>,
    pub retries: Counter,
    pub inflight: Gauge,
    /// Requests this node's engine served, by where they entered.
    pub served: Family<TargetLabels, Counter>,
    pub digest_decode_errors: Counter,
    pub summary_decode_errors: Counter,
    /// Bytes of this node's prefix summary as last published.
    pub summary_bytes: Gauge,
    /// Summary shards re-published (churn).
    pub summary_shards_published: Counter,
    /// Estimated false-match rate of this node's summary, from its fill.
    pub summary_false_match_rate: Gauge<f64, AtomicU64>,
    /// Blocks in this node's approximate index of its engine's cache, and its capacity.
    pub index_blocks: Gauge,
    pub index_capacity_blocks: Gauge,
    /// Exact mode: blocks the engine holds in CPU or storage tiers (not advertised).
    pub index_offload_blocks: Gauge,
    /// Exact mode: KV-event batches by outcome.
    pub kv_event_batches: Family<OutcomeLabels, Counter>,
    /// Exact mode: stored blocks that got no mesh hash, by reason.
    pub kv_event_blocks_skipped: Family<ReasonLabels, Counter>,
    /// Exact mode: events skipped because they did not decode (their batch is still applied).
    pub kv_event_bad_events: Counter,
    /// Exact mode: 1 from start until the KV-event socket is subscribed (connected, or
    /// listening under `--kv-events-bind`) and again while it is retried: meanwhile the node
    /// does not hear its engine's cache. Always 0 without `--kv-events`.
    pub kv_events_retrying: Gauge,
    /// Exact mode: prompts the engine could not tokenize for routing (routed by load).
    pub tokenize_failures: Counter,
    /// Exact mode: how long tokenizing a prompt for routing took, by where: `local` (the
    /// loaded `tokenizer.json`) or `engine` (a round trip to the engine's `/tokenize`, which
    /// waits behind whatever else the engine's API server is doing).
    pub tokenize_seconds: Family<SourceLabels, Histogram>,
    /// New prefixes this node's engine is computing (see `serve::engine_queue`).
    pub new_prefixes_in_flight: Gauge,
    /// Requests queued at this node's engine as this node counts them exactly.
    pub engine_queued: Gauge,
    /// Requests entering here whose prefix, popular in this node's recent traffic, had fewer
    /// holders than its share owes, by where they went (`holder`, `new_holder`).
    pub popular_prefix_routes: Family<OutcomeLabels, Counter>,
    /// 1 while the prompts entering here share prefixes (a new prefix goes to its rendezvous
    /// engine), 0 while they do not (to an engine that looks idle, else the least loaded of its
    /// first `unshared_choices`): see `PrefixTraffic::prefixes_recur`.
    pub prefixes_recur: Gauge,
    /// LoRA adapters this node loaded into its engine for a request, by outcome.
    pub lora_loads: Family<OutcomeLabels, Counter>,
    /// Media parts of requests entering here, by what pinning their identity did.
    pub media_parts: Family<OutcomeLabels, Counter>,
    /// Requests this node declined (late binding), by reason.
    pub declined: Family<ReasonLabels, Counter>,
    /// Attempts of requests that entered here that their serving node declined.
    pub attempts_declined: Counter,
    /// Load reports peers sent back on answers and declines, applied to this node's view.
    pub load_reports: Counter,
    /// Per request placed as it arrived, the age of the load the decision read for the
    /// engine it ranked first, by where that load came from.
    pub route_load_age: Family<SourceLabels, Histogram>,
    /// Attempts given up before their first byte, by cause: `peer_dead` (the failure
    /// detector declared the serving peer dead), `peer_silent` (its connection went silent)
    /// or `engine_unhealthy` (this node's engine stopped answering its poller).
    pub attempts_abandoned: Family<ReasonLabels, Counter>,
    /// Requests peers forwarded here that were refused as bad input, by reason (see
    /// `PEER_REFUSAL_REASONS`): a misbehaving peer shows here.
    pub peer_requests_refused: Family<ReasonLabels, Counter>,
    /// Disaggregated requests that ran whole after all, by cause (see `PD_FALLBACK_CAUSES`).
    pub pd_fallbacks: Family<ReasonLabels, Counter>,
    /// Disaggregated requests whose prefill ran again after their decode leg's pull failed.
    pub pd_prefill_reruns: Counter,
    /// Disaggregated requests whose client left between the legs: the prefill engine keeps
    /// their blocks until its lease ends.
    pub pd_abandoned: Counter,
    /// 1 while this node has seeds but has never seen a live peer after its join wait: it
    /// serves alone, cut off from the mesh it was told to join.
    pub mesh_unjoined: Gauge,
    /// 1 while this node's engine is healthy (a routing target), 0 while it is not.
    pub engine_healthy: Gauge,
    /// Always 1, labelled with the sidecar's version: lets a dashboard show what runs where.
    pub build_info: Family<VersionLabels, Gauge>,
}

impl Default for NodeMetrics {
    fn default() -> Self {
        fn latency_histogram() -> Histogram {
            // 100 µs .. ~100 s: the router's own overhead up to a long generation.
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.0001, 2.5, 16,
            ))
        }
        fn age_histogram() -> Histogram {
            // 1 ms .. ~8 s: a report just received up to a digest a failing gossip left.
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.001, 2.0, 14,
            ))
        }
        Self {
            requests: Family::default(),
            forward_latency: Family::new_with_constructor(latency_histogram),
            retries: Counter::default(),
            inflight: Gauge::default(),
            served: Family::default(),
            digest_decode_errors: Counter::default(),
            summary_decode_errors: Counter::default(),
            summary_bytes: Gauge::default(),
            summary_shards_published: Counter::default(),
            summary_false_match_rate: Gauge::default(),
            index_blocks: Gauge::default(),
            index_capacity_blocks: Gauge::default(),
            index_offload_blocks: Gauge::default(),
            kv_event_batches: Family::default(),
            kv_event_blocks_skipped: Family::default(),
            kv_event_bad_events: Counter::default(),
            kv_events_retrying: Gauge::default(),
            tokenize_failures: Counter::default(),
            new_prefixes_in_flight: Gauge::default(),
            engine_queued: Gauge::default(),
            popular_prefix_routes: Family::default(),
            prefixes_recur: Gauge::default(),
            lora_loads: Family::default(),
            media_parts: Family::default(),
            declined: Family::default(),
            attempts_declined: Counter::default(),
            load_reports: Counter::default(),
            route_load_age: Family::new_with_constructor(age_histogram),
            tokenize_seconds: Family::new_with_constructor(latency_histogram),
            attempts_abandoned: Family::default(),
            peer_requests_refused: Family::default(),
            pd_fallbacks: Family::default(),
            pd_prefill_reruns: Counter::default(),
            pd_abandoned: Counter::default(),
            mesh_unjoined: Gauge::default(),
            engine_healthy: Gauge::default(),
            build_info: Family::default(),
        }
    }
}

impl NodeMetrics {
    pub fn record_request(&self, reason: &str, outcome: Outcome) {
        let labels = RequestLabels {
            reason: reason.to_owned(),
            outcome: outcome.as_str().to_owned(),
        };
        self.requests.get_or_create(&labels).inc();
    }

    /// One adapter load ended.
    pub fn lora_load(&self, outcome: crate::engine::adapters::LoadOutcome) {
        let labels = OutcomeLabels {
            outcome: outcome.as_str().to_owned(),
        };
        self.lora_loads.get_or_create(&labels).inc();
    }

    /// One request whose popular prefix was owed more holders went to `placement`.
    pub fn popular_prefix_routed(&self, placement: kvmesh_protocol::lifecycle::PopularPlacement) {
        let labels = OutcomeLabels {
            outcome: placement.as_str().to_owned(),
        };
        self.popular_prefix_routes.get_or_create(&labels).inc();
    }

    /// A request placed on load from `source` that was `age_ms` old (see
    /// [`Self::route_load_age`]).
    pub fn route_load_read(&self, source: kvmesh_protocol::lifecycle::Source, age_ms: u64) {
        let labels = SourceLabels {
            source: source.as_str().to_owned(),
        };
        let seconds = age_ms as f64 / 1000.0;
        self.route_load_age.get_or_create(&labels).observe(seconds);
    }

    /// What pinning did to one request's media parts.
    pub fn media_pinned(&self, report: &kvmesh_protocol::hashing::PinReport) {
        let counts = [
            ("pinned", report.pinned - report.replaced),
            ("replaced", report.replaced),
            ("unverified", report.unverified),
            ("moved", report.moved),
        ];
        for (outcome, count) in counts {
            if count > 0 {
                let labels = OutcomeLabels {
                    outcome: outcome.to_owned(),
                };
                self.media_parts
                    .get_or_create(&labels)
                    .inc_by(u64::from(count));
            }
        }
    }

    /// One media URL fetched for `--fetch-media`, by outcome.
    pub fn media_fetched(&self, outcome: &str) {
        let labels = OutcomeLabels {
            outcome: outcome.to_owned(),
        };
        self.media_parts.get_or_create(&labels).inc();
    }

    /// Counts `n` attempts abandoned for `cause` (`ABANDON_*`).
    pub fn abandoned(&self, cause: &str, n: u64) {
        self.attempts_abandoned
            .get_or_create(&ReasonLabels {
                reason: cause.to_owned(),
            })
            .inc_by(n);
    }

    pub fn target_labels(local: bool) -> TargetLabels {
        TargetLabels {
            target: if local { "local" } else { "peer" }.to_owned(),
        }
    }

    /// Creates, at zero, the series of every label value known in advance. A series that
    /// first appears at 1 shows Prometheus no increase, so `increase(...{outcome="lost"}[15m])`
    /// would miss the first lost KV-event batch; and a family with no series is not exported
    /// at all, which leaves dashboards empty and hides the metric's existence.
    fn zero_known_series(&self) {
        // Creating the series is the point; the handles are not needed.
        for local in [true, false] {
            let _ = self.served.get_or_create(&Self::target_labels(local));
            let _ = self
                .forward_latency
                .get_or_create(&Self::target_labels(local));
        }
        for reason in kvmesh_protocol::lifecycle::DeclineReason::ALL {
            let _ = self.declined.get_or_create(&ReasonLabels {
                reason: reason.as_str().to_owned(),
            });
        }
        for reason in PEER_REFUSAL_REASONS {
            let _ = self.peer_requests_refused.get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            });
        }
        for cause in [
            ABANDON_PEER_DEAD,
            ABANDON_PEER_SILENT,
            ABANDON_ENGINE_UNHEALTHY,
        ] {
            self.abandoned(cause, 0);
        }
        for cause in PD_FALLBACK_CAUSES {
            let _ = self.pd_fallbacks.get_or_create(&ReasonLabels {
                reason: cause.to_owned(),
            });
        }
        for outcome in crate::engine::adapters::LoadOutcome::ALL {
            let _ = self.lora_loads.get_or_create(&OutcomeLabels {
                outcome: outcome.as_str().to_owned(),
            });
        }
        for placement in kvmesh_protocol::lifecycle::PopularPlacement::ALL {
            let _ = self.popular_prefix_routes.get_or_create(&OutcomeLabels {
                outcome: placement.as_str().to_owned(),
            });
        }
        for outcome in MEDIA_PART_OUTCOMES {
            let _ = self.media_parts.get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            });
        }
        for outcome in KV_EVENT_OUTCOMES {
            let _ = self.kv_event_batches.get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            });
        }
    }

    pub fn register(&self, registry: &mut Registry) {
        self.zero_known_series();
        let registry = registry.sub_registry_with_prefix("kvmesh");
        registry.register(
            "requests",
            "Requests that entered at this node, by routing reason and outcome",
            self.requests.clone(),
        );
        registry.register(
            "forward_latency_seconds",
            "Time from routing decision to the response head, by target",
            self.forward_latency.clone(),
        );
        registry.register(
            "retries",
            "Attempts retried on the next candidate after a failure before the response started",
            self.retries.clone(),
        );
        registry.register(
            "inflight_requests",
            "Requests in flight that entered here",
            self.inflight.clone(),
        );
        registry.register(
            "served",
            "Requests this node's engine served, by where they entered (local or peer)",
            self.served.clone(),
        );
        registry.register(
            "attempts_abandoned",
            "Attempts given up before their first byte because the serving peer was declared dead (peer_dead) or went silent (peer_silent), or its engine unhealthy (engine_unhealthy)",
            self.attempts_abandoned.clone(),
        );
        registry.register(
            "peer_requests_refused",
            "Requests peers forwarded here refused as bad input, by reason",
            self.peer_requests_refused.clone(),
        );
        registry.register(
            "mesh_unjoined",
            "1 while this node has seeds but found no live peer within its join wait",
            self.mesh_unjoined.clone(),
        );
        registry.register(
            "pd_fallbacks",
            "Disaggregated requests that ran whole after all, by cause",
            self.pd_fallbacks.clone(),
        );
        registry.register(
            "pd_prefill_reruns",
            "Disaggregated requests whose prefill ran again after a failed KV pull",
            self.pd_prefill_reruns.clone(),
        );
        registry.register(
            "pd_abandoned",
            "Disaggregated requests whose client left between the prefill and the decode leg",
            self.pd_abandoned.clone(),
        );
        registry.register(
            "digest_decode_errors",
            "Peer load digests rejected by validation",
            self.digest_decode_errors.clone(),
        );
        registry.register(
            "prefix_shard_decode_errors",
            "Peer prefix-summary shards rejected by validation",
            self.summary_decode_errors.clone(),
        );
        registry.register(
            "prefix_shard_bytes",
            "Bytes of this node's prefix summary as last published",
            self.summary_bytes.clone(),
        );
        registry.register(
            "prefix_shards_published",
            "Prefix-summary shards re-published because they changed",
            self.summary_shards_published.clone(),
        );
        registry.register(
            "prefix_false_match_rate",
            "Estimated false-match rate of this node's prefix summary",
            self.summary_false_match_rate.clone(),
        );
        registry.register(
            "index_blocks",
            "Blocks this node advertises: its approximate index, or in exact mode the GPU tier",
            self.index_blocks.clone(),
        );
        registry.register(
            "index_capacity_blocks",
            "Capacity of that index: the engine's KV capacity in hash blocks",
            self.index_capacity_blocks.clone(),
        );
        registry.register(
            "index_offload_blocks",
            "Exact mode: blocks the engine holds in CPU or storage tiers (not advertised yet)",
            self.index_offload_blocks.clone(),
        );
        registry.register(
            "kv_event_batches",
            "Exact mode: KV-event batches by outcome (applied, replayed, lost, before_start, \
             undecodable, malformed)",
            self.kv_event_batches.clone(),
        );
        registry.register(
            "kv_event_blocks_skipped",
            "Exact mode: stored blocks that got no mesh hash, by reason",
            self.kv_event_blocks_skipped.clone(),
        );
        registry.register(
            "kv_event_bad_events",
            "Exact mode: KV events skipped because they did not decode; the rest of their batch \
             is applied",
            self.kv_event_bad_events.clone(),
        );
        registry.register(
            "kv_events_retrying",
            "Exact mode: 1 until the KV-event socket is subscribed (connected, or listening under \
             --kv-events-bind) and while it is retried: the node does not hear its engine's \
             cache meanwhile; always 0 without --kv-events",
            self.kv_events_retrying.clone(),
        );
        registry.register(
            "tokenize_failures",
            "Exact mode: prompts the engine could not tokenize, routed by load alone",
            self.tokenize_failures.clone(),
        );
        registry.register(
            "tokenize_seconds",
            "Exact mode: time to tokenize a prompt for routing, by source: local (the loaded \
             tokenizer.json) or engine (a round trip to the engine's /tokenize)",
            self.tokenize_seconds.clone(),
        );
        registry.register(
            "new_prefixes_in_flight",
            "Requests with a prefix no engine held, sent to this node's engine and not yet answered with a first byte",
            self.new_prefixes_in_flight.clone(),
        );
        registry.register(
            "popular_prefix_routes",
            "Requests entering at this node whose prefix, behind a share of its recent requests, was held by fewer engines than that share fills, so that every engine counted as holding it, by where they went: holder (an engine that held it) or new_holder (one that did not, and holds it after)",
            self.popular_prefix_routes.clone(),
        );
        registry.register(
            "prefixes_recur",
            "1 while the recent requests entering at this node share prefixes (of their distinct first blocks, at least a tenth begin several requests; or too few requests to tell), so that a new prefix goes to the engine every node picks for it; 0 while they do not, so that a new prefix goes to an engine that looks idle (unshared_to_idle), else to the least loaded of its first unshared_choices rendezvous engines (default 1: its rendezvous engine)",
            self.prefixes_recur.clone(),
        );
        registry.register(
            "media_parts",
            "Media parts (images, audio, video) of chat requests entering at this node, by outcome: pinned (bytes hashed, identity written as the part's uuid), replaced (pinned over a client uuid), unverified (a URL whose bytes this node did not see), moved (a part whose bytes this node did not see, media or not, whose client uuid posed as a verified one; also counted as unverified when it is media), fetched or fetch_failed (--fetch-media)",
            self.media_parts.clone(),
        );
        registry.register(
            "lora_loads",
            "LoRA adapters this node loaded into its engine (vLLM's /v1/load_lora_adapter) for a request placed here, by outcome: loaded, already_loaded, failed or timeout",
            self.lora_loads.clone(),
        );
        registry.register(
            "engine_queued",
            "Requests this node handed to its engine that have not started, as this node counts them (streamed ones until their first byte; others from the engine's waiting gauge)",
            self.engine_queued.clone(),
        );
        registry.register(
            "declined",
            "Requests this node declined because its engine's queue was over the entry's bound (the entry tried the next in rank), by reason: new-prefix or queue",
            self.declined.clone(),
        );
        registry.register(
            "attempts_declined",
            "Attempts of requests that entered at this node that their serving node declined",
            self.attempts_declined.clone(),
        );
        registry.register(
            "load_reports",
            "Engine load reports that came back with answers and declines and refreshed this node's view",
            self.load_reports.clone(),
        );
        registry.register(
            "route_load_age_seconds",
            "Per request placed as it arrived, how old the load was that the routing decision read for the engine it ranked first, by source: live (this node's own engine, read now), report (the peer's last answer or decline) or digest (gossip; the time before it arrived here is not counted)",
            self.route_load_age.clone(),
        );
        registry.register(
            "engine_healthy",
            "1 while this node's engine is healthy and a routing target, 0 while it is down, failing or not polled yet",
            self.engine_healthy.clone(),
        );
        self.build_info
            .get_or_create(&VersionLabels {
                version: env!("CARGO_PKG_VERSION").to_owned(),
            })
            .set(1);
        registry.register(
            "build_info",
            "Always 1; the label carries this sidecar's version",
            self.build_info.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_known_in_advance_are_exported_at_zero_from_the_start() {
        let metrics = NodeMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for series in [
            "kvmesh_kv_event_batches_total{outcome=\"lost\"} 0\n",
            "kvmesh_kv_event_batches_total{outcome=\"applied\"} 0\n",
            "kvmesh_declined_total{reason=\"new-prefix\"} 0\n",
            "kvmesh_declined_total{reason=\"queue\"} 0\n",
            "kvmesh_popular_prefix_routes_total{outcome=\"new_holder\"} 0\n",
            "kvmesh_served_total{target=\"peer\"} 0\n",
            "kvmesh_forward_latency_seconds_count{target=\"local\"} 0\n",
            "kvmesh_engine_healthy 0\n",
            "kvmesh_lora_loads_total{outcome=\"failed\"} 0\n",
            "kvmesh_media_parts_total{outcome=\"moved\"} 0\n",
        ] {
            assert!(text.contains(series), "no {series:?} in\n{text}");
        }
    }
}
