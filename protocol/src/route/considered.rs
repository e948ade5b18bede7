//! Stage 1 continued, what the decision reads of each eligible candidate, once: how much of
//! the prompt it holds (offload tiers at a discount), whether it has room for the rest, its
//! load as the bound, the queue and gossip count it, and its readiness for an adapter.

use super::config::RouteConfig;
use super::decide::{Candidate, RouteRequest};
use super::eligible::is_fresh;
use super::load_cap;
use crate::digest::{LoadDigest, LoraReadiness};
use crate::hashing::{BlockHash, HASH_VERSION};
use crate::summary::PeerSummary;

/// A candidate as this decision considers it: its match and its load, read once.
#[derive(Copy, Clone, Debug)]
pub(super) struct Considered {
    /// Its index in the candidate slice.
    pub index: usize,
    pub node_key: u64,
    /// Blocks of the prompt it holds: on its GPU, plus those in an offload tier at a discount.
    pub matched: u32,
    /// What the load bound counts (see [`super::BoundOn`]).
    pub bounded: u32,
    /// Waiting plus pending.
    pub queued: u32,
    /// Gauges read at this very millisecond (this node's own engine, read live) show nothing
    /// in flight there, and nothing was sent since.
    pub idle_now: bool,
    /// The engine has room for the blocks this request would add to its cache without
    /// evicting any (its summary's blocks plus those, at most its capacity): an engine that
    /// holds little takes near-equal requests first, so that it fills with prefixes of its own
    /// instead of being passed over for every prompt that meets a few blocks elsewhere. Not
    /// known of a candidate without a summary (this decision is shown none).
    pub evicts_nothing: bool,
    /// Requests in flight there (running, waiting, pending) as the gossiped digest shows
    /// them: what every entry node sees alike.
    pub shared_load: u32,
    /// For a request naming a LoRA adapter, how ready the engine is to run it (see
    /// [`LoraReadiness`]); the highest for a base model.
    pub ready: LoraReadiness,
    /// Its gauges are fresh (see [`super::eligible::is_fresh`]).
    pub fresh: bool,
}

impl Considered {
    /// Reads `candidate`, the `index`-th of the slice, for `request`.
    pub(super) fn read(
        index: usize,
        candidate: &Candidate<'_>,
        request: &RouteRequest<'_>,
        config: &RouteConfig,
        now_ms: u64,
    ) -> Self {
        let digest = candidate.digest;
        let gauges = candidate.gauges();
        let on_gpu = gpu_match(candidate, request.chain);
        Considered {
            index,
            node_key: candidate.node_key,
            matched: on_gpu + offload_worth(candidate, request.chain, on_gpu, config),
            evicts_nothing: evicts_nothing(candidate, request, on_gpu),
            shared_load: digest.load().saturating_add(candidate.digest_pending),
            bounded: load_cap::bounded(config.load.bound_on, &gauges, candidate.pending),
            queued: gauges.waiting.saturating_add(candidate.pending),
            ready: readiness(digest, request.model),
            idle_now: candidate.digest_received_ms >= now_ms
                && gauges.load() == 0
                && candidate.pending == 0,
            fresh: is_fresh(candidate, config, now_ms),
        }
    }
}

#[cfg(test)]
impl Considered {
    /// A fresh candidate `node_key` that holds nothing, runs nothing and is ready, for the
    /// stages' tests to adjust.
    pub(super) fn blank(node_key: u64) -> Self {
        Considered {
            index: 0,
            node_key,
            matched: 0,
            bounded: 0,
            queued: 0,
            idle_now: false,
            evicts_nothing: false,
            shared_load: 0,
            ready: LoraReadiness::Running,
            fresh: true,
        }
    }
}

/// Leading blocks of `chain` that `summary` shows, when its engine's node hashes as this one
/// does (another hash version's blocks never match).
pub(super) fn summary_match(
    digest: &LoadDigest,
    summary: Option<&PeerSummary>,
    chain: &[BlockHash],
) -> u32 {
    match summary {
        Some(summary) if digest.hash_version == HASH_VERSION => {
            (summary.longest_match(chain) as u32).min(chain.len() as u32)
        }
        _ => 0,
    }
}

/// Leading blocks of `chain` on the candidate's GPU: its summary's, or what this node itself
/// recently sent there, whichever is longer.
pub(super) fn gpu_match(candidate: &Candidate<'_>, chain: &[BlockHash]) -> u32 {
    summary_match(candidate.digest, candidate.summary, chain)
        .max(candidate.recent_match)
        .min(chain.len() as u32)
}

/// Blocks past the GPU match that an offload tier holds, counted at `offload_weight` each.
fn offload_worth(
    candidate: &Candidate<'_>,
    chain: &[BlockHash],
    on_gpu: u32,
    config: &RouteConfig,
) -> u32 {
    let offloaded =
        summary_match(candidate.digest, candidate.offload, chain).saturating_sub(on_gpu);
    (f64::from(offloaded) * config.hit.offload_weight.clamp(0.0, 1.0)).round() as u32
}

/// Whether the blocks `request` would add to the candidate's cache fit beside what it holds.
fn evicts_nothing(candidate: &Candidate<'_>, request: &RouteRequest<'_>, on_gpu: u32) -> bool {
    let digest = candidate.digest;
    // In the chain's blocks, which the summary counts; the digest counts the engine's.
    let capacity = f64::from(digest.kv_capacity_blocks) * f64::from(digest.block_size)
        / f64::from(request.tokens_per_block).max(1.0);
    let adds = f64::from(request.chain.len() as u32 - on_gpu);
    let held = candidate
        .held_blocks
        .or_else(|| candidate.summary.map(|s| s.estimated_blocks() as u64));
    held.is_some_and(|held| held as f64 + adds <= capacity)
}

/// How ready the engine is to run `model` if it is one of its adapters; else running.
fn readiness(digest: &LoadDigest, model: &str) -> LoraReadiness {
    match digest.loras.iter().any(|lora| lora == model) {
        true => digest.lora_use.readiness(model),
        false => LoraReadiness::Running,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::LoraUse;
    use crate::route::tests::{candidate, digest, request};
    use crate::route::{HitRules, LoadBound};

    const NOW: u64 = 10_000;

    #[test]
    fn recent_sends_count_as_held_up_to_the_chain() {
        let load = digest(0);
        let mut sent = candidate("a", &load, None);
        sent.recent_match = 9;
        assert_eq!(gpu_match(&sent, &[1, 2, 3]), 3);
        sent.recent_match = 2;
        assert_eq!(gpu_match(&sent, &[1, 2, 3]), 2);
    }

    fn summary_of(hashes: &[u64]) -> PeerSummary {
        let mut builder =
            crate::summary::SummaryBuilder::new(crate::summary::SummaryConfig::default(), 1)
                .unwrap();
        for &hash in hashes {
            builder.insert(hash);
        }
        let mut summary = PeerSummary::new();
        for shard in builder.publish_dirty() {
            summary.apply_bytes(&shard.bytes).unwrap();
        }
        summary
    }

    #[test]
    fn offloaded_blocks_past_the_gpu_match_count_at_their_weight() {
        let load = digest(0);
        let chain = [1, 2, 3, 4, 5, 6, 7, 8];
        let offloaded = summary_of(&chain);
        let mut c = candidate("a", &load, None);
        c.recent_match = 4;
        let read = |c: &Candidate<'_>, weight: f64| {
            let config = RouteConfig {
                hit: HitRules {
                    offload_weight: weight,
                    ..Default::default()
                },
                ..RouteConfig::default()
            };
            Considered::read(0, c, &request(&chain), &config, NOW).matched
        };
        assert_eq!(read(&c, 0.5), 4, "no offload tier: the GPU's blocks alone");
        c.offload = Some(&offloaded);
        assert_eq!(read(&c, 0.5), 4 + 2, "the 4 blocks past the GPU's at half");
        assert_eq!(read(&c, 0.0), 4);
        assert_eq!(read(&c, 3.0), 8, "never more than a GPU block");
        c.recent_match = 8;
        assert_eq!(read(&c, 0.5), 8, "blocks on the GPU count once");
    }

    #[test]
    fn the_bound_the_queue_and_the_shared_load_count_different_things() {
        let load = LoadDigest {
            running: 5,
            ..digest(3)
        };
        let mut c = candidate("a", &load, None);
        c.pending = 2;
        c.digest_pending = 1;
        let chain = [1];
        let read = |config: &RouteConfig| Considered::read(7, &c, &request(&chain), config, NOW);
        let queued = read(&RouteConfig::default());
        assert_eq!(queued.index, 7);
        assert_eq!(queued.bounded, 3 + 2, "waiting plus pending");
        assert_eq!(queued.queued, 3 + 2);
        assert_eq!(
            queued.shared_load,
            5 + 3 + 1,
            "the digest's load plus its sends"
        );
        let in_flight = read(&RouteConfig {
            load: LoadBound {
                bound_on: crate::route::BoundOn::InFlight,
                ..Default::default()
            },
            ..RouteConfig::default()
        });
        assert_eq!(in_flight.bounded, 5 + 3 + 2);
        assert!(!queued.idle_now);
    }

    #[test]
    fn idle_now_needs_gauges_read_this_millisecond_showing_nothing() {
        let idle = LoadDigest {
            running: 0,
            ..digest(0)
        };
        let mut c = candidate("a", &idle, None);
        let chain = [1];
        let config = RouteConfig::default();
        assert!(!Considered::read(0, &c, &request(&chain), &config, NOW).idle_now);
        c.digest_received_ms = NOW;
        assert!(Considered::read(0, &c, &request(&chain), &config, NOW).idle_now);
        c.pending = 1;
        assert!(!Considered::read(0, &c, &request(&chain), &config, NOW).idle_now);
    }

    #[test]
    fn room_is_known_only_with_a_count_of_held_blocks() {
        // 10,000 blocks of 16 tokens: 10,000 blocks of the chain's 16 tokens.
        let load = digest(0);
        let chain = [1, 2, 3, 4];
        let mut c = candidate("a", &load, None);
        assert!(
            !evicts_nothing(&c, &request(&chain), 0),
            "no summary: not known"
        );
        c.held_blocks = Some(9_996);
        assert!(evicts_nothing(&c, &request(&chain), 0));
        c.held_blocks = Some(9_997);
        assert!(!evicts_nothing(&c, &request(&chain), 0));
        assert!(
            evicts_nothing(&c, &request(&chain), 1),
            "held blocks add nothing"
        );
    }

    #[test]
    fn an_adapters_readiness_is_read_from_its_use_and_a_base_model_runs() {
        let mut adapter = digest(0);
        adapter.loras = vec!["m".into()];
        adapter.lora_use = LoraUse {
            max_loras: 1,
            running: vec!["other".into()],
            waiting: vec![],
        };
        assert_eq!(readiness(&adapter, "m"), LoraReadiness::NoSlot);
        assert_eq!(readiness(&digest(0), "m"), LoraReadiness::Running);
    }

    #[test]
    fn another_hash_version_never_matches() {
        let summary = summary_of(&[11, 12]);
        let ours = digest(0);
        assert_eq!(summary_match(&ours, Some(&summary), &[11, 12, 13]), 2);
        let theirs = LoadDigest {
            hash_version: HASH_VERSION.wrapping_add(1),
            ..digest(0)
        };
        assert_eq!(summary_match(&theirs, Some(&summary), &[11, 12, 13]), 0);
        assert_eq!(summary_match(&ours, None, &[11]), 0);
    }
}
