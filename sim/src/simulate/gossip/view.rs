//! What the other nodes see of one publisher, at each lag class.
//!
//! A viewer `v` sees publisher `p` with a fixed lag drawn for the pair `(v, p)` from the
//! gossip delay distribution, quantized into a few classes: the viewer holds `p`'s digest as
//! it was published `lag` ago and the summary made of the shards published until `lag` ago
//! (applied at each tick, so a shard becomes visible at the first tick after its arrival:
//! within a tick interval views are fixed and entry nodes can decide in parallel).
//! The lag is fixed per pair (it does not vary per update) so that a view never goes back in
//! time; the spread over pairs is the epidemic's spread. The shards are the real encoded bytes
//! from `SummaryBuilder`, decoded and validated once, applied to one `PeerSummary` per class.

use std::collections::VecDeque;

use kvmesh_protocol::LoadDigest;
use kvmesh_protocol::PeerSummary;
use kvmesh_protocol::summary::DecodedShard;

use super::epidemic::DelayDistribution;
use kvmesh_protocol::mix64;

/// The lags of the classes, ascending, plus a final zero-lag class for the publisher itself.
#[derive(Debug, Clone)]
pub struct LagClasses {
    lags_ns: Vec<u64>,
    seed: u64,
}

impl LagClasses {
    /// `classes` classes at the centres of equal-probability slices of `delays`.
    pub fn new(delays: &DelayDistribution, classes: usize, seed: u64) -> Self {
        let classes = classes.max(1);
        let mut lags_ns: Vec<u64> = (0..classes)
            .map(|c| (delays.quantile((c as f64 + 0.5) / classes as f64) * 1e9) as u64)
            .collect();
        lags_ns.push(0);
        Self { lags_ns, seed }
    }

    /// Number of classes, the self class included.
    pub fn len(&self) -> usize {
        self.lags_ns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lags_ns.is_empty()
    }

    pub fn lag_ns(&self, class: usize) -> u64 {
        self.lags_ns[class]
    }

    /// The class of the self view.
    pub fn own(&self) -> usize {
        self.lags_ns.len() - 1
    }

    /// The class through which `viewer` sees `publisher`.
    pub fn class_of(&self, viewer: u32, publisher: u32) -> usize {
        if viewer == publisher {
            return self.own();
        }
        let u = mix64(self.seed ^ (u64::from(viewer) << 32 | u64::from(publisher)));
        ((u as u128 * (self.lags_ns.len() - 1) as u128) >> 64) as usize
    }
}

/// Publication time of the initial digest ([`Published::publish_initial_digest`]).
const INITIAL: u64 = u64::MAX;

#[derive(Debug, Default)]
struct Replica {
    summary: PeerSummary,
    /// Absolute index of the next batch to apply.
    next: u64,
}

/// One publisher's recent history and its lagged replicas.
#[derive(Debug)]
pub struct Published {
    digests: VecDeque<(u64, LoadDigest)>,
    batches: VecDeque<(u64, Vec<DecodedShard>)>,
    first_batch: u64,
    replicas: Vec<Replica>,
}

impl Published {
    /// A publisher seen through `lags`: one summary replica per peer class, plus one with no
    /// lag for the publisher itself when `own_summary` (otherwise the node reads only its own
    /// digest, as `node/src/serve/routing.rs` does today).
    pub fn new(lags: &LagClasses, own_summary: bool) -> Self {
        let replicas = if own_summary { lags.len() } else { lags.own() };
        Self {
            digests: VecDeque::new(),
            batches: VecDeque::new(),
            first_batch: 0,
            replicas: (0..replicas).map(|_| Replica::default()).collect(),
        }
    }

    pub fn publish_digest(&mut self, now_ns: u64, digest: LoadDigest) {
        self.digests.push_back((now_ns, digest));
    }

    /// The digest every node holds when the run starts: the mesh converged before the first
    /// request (as the demo and the tests wait for), so it is visible through every class at
    /// once.
    pub fn publish_initial_digest(&mut self, digest: LoadDigest) {
        self.digests.clear();
        self.digests.push_back((INITIAL, digest));
    }

    pub fn publish_shards(&mut self, now_ns: u64, shards: Vec<DecodedShard>) {
        if !shards.is_empty() {
            self.batches.push_back((now_ns, shards));
        }
    }

    /// Brings the replica of `class` up to `now`.
    pub fn sync(&mut self, lags: &LagClasses, class: usize, now_ns: u64) {
        let lag = lags.lag_ns(class);
        let Some(replica) = self.replicas.get_mut(class) else {
            return;
        };
        while let Some((at, shards)) = self.batches.get((replica.next - self.first_batch) as usize)
        {
            if at + lag > now_ns {
                break;
            }
            for shard in shards {
                replica.summary.apply(shard.clone());
            }
            replica.next += 1;
        }
    }

    /// Syncs every replica and forgets history that no class can still need.
    pub fn sync_all_and_trim(&mut self, lags: &LagClasses, now_ns: u64) {
        for class in 0..self.replicas.len() {
            self.sync(lags, class, now_ns);
        }
        let applied = self.replicas.iter().map(|r| r.next).min().unwrap_or(0);
        while self.first_batch < applied {
            self.batches.pop_front();
            self.first_batch += 1;
        }
        let slowest = (0..lags.len()).map(|c| lags.lag_ns(c)).max().unwrap_or(0);
        while self.digests.len() > 1 && self.digests[1].0.saturating_add(slowest) <= now_ns {
            self.digests.pop_front();
        }
    }

    /// The summary as seen through `class` (call [`Self::sync`] first); none for the own
    /// class.
    pub fn summary(&self, class: usize) -> Option<&PeerSummary> {
        self.replicas.get(class).map(|r| &r.summary)
    }

    /// The newest digest visible through `class` at `now`, with its arrival time.
    pub fn digest(
        &self,
        lags: &LagClasses,
        class: usize,
        now_ns: u64,
    ) -> Option<(&LoadDigest, u64)> {
        let lag = lags.lag_ns(class);
        self.digests
            .iter()
            .rev()
            .find(|(at, _)| *at == INITIAL || at + lag <= now_ns)
            .map(|(at, d)| (d, if *at == INITIAL { 0 } else { at + lag }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvmesh_protocol::summary::{ShardWire, SummaryBuilder, SummaryConfig};

    fn lags() -> LagClasses {
        LagClasses {
            lags_ns: vec![100, 300, 0],
            seed: 0,
        }
    }

    #[test]
    fn each_class_sees_what_was_published_its_lag_ago() {
        let lags = lags();
        let mut published = Published::new(&lags, false);
        let mut builder = SummaryBuilder::new(SummaryConfig::default(), 1).unwrap();
        builder.insert(42);
        let shards: Vec<_> = builder
            .publish_dirty()
            .iter()
            .map(|s| ShardWire::decode(&s.bytes).unwrap())
            .collect();
        published.publish_shards(1_000, shards);
        for class in 0..2 {
            published.sync(&lags, class, 1_150);
        }
        assert!(
            published.summary(0).unwrap().contains(42),
            "lag 100 sees it at 1100"
        );
        assert!(
            !published.summary(1).unwrap().contains(42),
            "lag 300 not before 1300"
        );
        published.sync_all_and_trim(&lags, 1_300);
        assert!(published.summary(1).unwrap().contains(42));
        assert_eq!(published.batches.len(), 0, "applied everywhere, trimmed");
    }

    #[test]
    fn digests_arrive_after_the_lag_and_newest_wins() {
        let lags = lags();
        let mut published = Published::new(&lags, false);
        let digest = |version| LoadDigest {
            version,
            timestamp_ms: 0,
            running: 0,
            waiting: 0,
            kv_usage: 0.0,
            queued_tokens: None,
            kv_capacity_blocks: 1,
            block_size: 16,
            ttft_ewma_ms: 0.0,
            prefill_tokens_per_s: 0.0,
            inflight_forwarded: 0,
            role: kvmesh_protocol::Role::Mixed,
            healthy: true,
            hash_version: 1,
            models: vec![],
            loras: vec![],
            lora_use: Default::default(),
        };
        published.publish_digest(1_000, digest(1));
        published.publish_digest(2_000, digest(2));
        assert!(published.digest(&lags, 1, 1_200).is_none());
        let (d, at) = published.digest(&lags, 1, 2_200).unwrap();
        assert_eq!((d.version, at), (1, 1_300));
        let (d, at) = published.digest(&lags, 0, 2_200).unwrap();
        assert_eq!((d.version, at), (2, 2_100));
        let (d, at) = published.digest(&lags, lags.own(), 2_000).unwrap();
        assert_eq!(
            (d.version, at),
            (2, 2_000),
            "a node sees its own digest at once"
        );
        assert_eq!(lags.class_of(5, 5), 2);
        assert!(lags.class_of(5, 6) < 2);
    }
}
