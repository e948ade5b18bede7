//! How much of the recent traffic each prefix carries: what says a prefix needs more holders.
//!
//! The decision prefers an engine that holds a request's prefix, which is right for the
//! request it places: the holder skips the prefill. But a prefix carrying a large share of the
//! traffic (one system prompt behind most requests) then stays on the few engines that hold
//! it, which run every step of its requests while the others idle, and lose to a plain
//! least-loaded router that, by spreading everything, ends up with the prefix everywhere. A
//! copy's one prefill is repaid by every later request it serves. So a prefix with share `s`
//! of an entry's recent requests is owed `⌊s × N⌋` holders among `N` engines, the number its
//! traffic fills in a balanced cluster; while it has fewer, the decision counts it held by
//! every engine (see [`crate::route::decide`]).
//!
//! The share is counted over the last requests this node routed, not over time, so it means
//! the same at any rate; entry nodes each see a sample of the traffic, and a share is the same
//! in every sample. A chain's block hash commits to every block before it, so one counter per
//! depth counts a prefix; only some depths are counted, four per doubling (1, 2, 3, 4, 5, 6,
//! 7, 8, 10, 12, 14, 16, 20, …): about 50 counters for a 100,000-token prompt. A popular prefix
//! then ends between a counted depth and the next, which bounds how far it is credited.
//!
//! The window also says whether prompts share prefixes at all
//! ([`PrefixTraffic::prefixes_recur`]): of the distinct first blocks in it, the share that
//! more than one request began with. Where few do (a trace of unrelated prompts, or the own
//! prompts beside one hot system prompt), a new prefix is unlikely to be asked for again, and
//! sending it to the engine every entry node would pick for it (rendezvous) only queues it
//! behind that engine's work; it goes to an engine that looks idle, if any, instead (see
//! [`crate::route::ColdPrefixes::unshared_to_idle`]), or to the least loaded of a few
//! ([`crate::route::ColdPrefixes::unshared_choices`], off by default). Each entry
//! node counts its own sample of the traffic, in which a prefix that recurs only a few times
//! cluster-wide is rarely seen twice: such prefixes gain least from meeting on one engine, and
//! once an engine holds one, gossip says so and its next requests go there anyway.

use super::decide::RouteRequest;
use crate::block_map::BlockMap;
use crate::hashing::BlockHash;
use std::collections::VecDeque;

/// Requests the shares are counted over. Default of [`PrefixTraffic::default`].
pub const TRAFFIC_WINDOW: usize = 512;
/// A prefix seen fewer times than this in the window has no share: a handful of requests says
/// nothing about a prefix's traffic.
pub const MIN_SIGHTINGS: u32 = 8;
/// Requests the window must hold before it may say that prefixes do not recur: until then
/// they are assumed to (see [`PrefixTraffic::prefixes_recur`]).
pub const MIN_RECURRENCE_SAMPLE: usize = 64;
/// The fraction of the window's distinct first blocks that must each begin more than one of
/// its requests for prefixes to count as recurring.
pub const RECURRING_SHARE: f64 = 0.1;

/// A prefix of the request's chain and its share of the recent traffic.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct PrefixShare {
    /// Leading blocks of the chain.
    pub blocks: u32,
    /// Of the last requests routed, the fraction that began with these blocks, 0..=1.
    pub share: f64,
    /// The most leading blocks the shared prefix can span, for all the counts say: one less
    /// than the next depth counted, or the chain's length at the last depth.
    pub until: u32,
}

/// Counts of the sampled prefixes of the last [`TRAFFIC_WINDOW`] requests.
#[derive(Debug)]
pub struct PrefixTraffic {
    /// Per request in the window, oldest first: its sampled prefixes' last block hashes.
    window: VecDeque<Vec<BlockHash>>,
    /// Block hash → requests in the window whose chain has it at a sampled depth.
    counts: BlockMap<BlockHash, u32>,
    /// First block → requests in the window that began with it (apart from `counts`, whose
    /// hashes of every depth share one map).
    first_blocks: BlockMap<BlockHash, u32>,
    /// Of those first blocks, the ones more than one request in the window began with.
    repeated_first_blocks: usize,
    capacity: usize,
}

impl Default for PrefixTraffic {
    fn default() -> Self {
        Self::new(TRAFFIC_WINDOW)
    }
}

impl PrefixTraffic {
    /// Counts over the last `capacity` requests (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            window: VecDeque::new(),
            counts: BlockMap::default(),
            first_blocks: BlockMap::default(),
            repeated_first_blocks: 0,
            capacity: capacity.max(1),
        }
    }

    /// Counts a request with `chain`, forgetting the oldest beyond the window.
    pub fn record(&mut self, chain: &[BlockHash]) {
        let sampled: Vec<BlockHash> = sampled_depths(chain.len())
            .map(|blocks| chain[blocks as usize - 1])
            .collect();
        for hash in &sampled {
            *self.counts.entry(*hash).or_default() += 1;
        }
        if let Some(&first) = sampled.first() {
            let count = self.first_blocks.entry(first).or_default();
            *count += 1;
            if *count == 2 {
                self.repeated_first_blocks += 1;
            }
        }
        self.window.push_back(sampled);
        while self.window.len() > self.capacity {
            let Some(oldest) = self.window.pop_front() else {
                break;
            };
            if let Some(first) = oldest.first()
                && let Some(count) = self.first_blocks.get_mut(first)
            {
                *count -= 1;
                match *count {
                    0 => {
                        self.first_blocks.remove(first);
                    }
                    1 => self.repeated_first_blocks = self.repeated_first_blocks.saturating_sub(1),
                    _ => {}
                }
            }
            for hash in oldest {
                if let Some(count) = self.counts.get_mut(&hash) {
                    *count -= 1;
                    if *count == 0 {
                        self.counts.remove(&hash);
                    }
                }
            }
        }
    }

    /// Whether requests in this traffic share prefixes: at least [`RECURRING_SHARE`] of the
    /// distinct first blocks in the window began more than one request, or the window holds
    /// too few requests to tell ([`MIN_RECURRENCE_SAMPLE`]). Where they do not, a new prefix
    /// is unlikely to be asked for again, and keeping its copies on one engine buys nothing
    /// (see [`RouteRequest::prefixes_recur`]).
    pub fn prefixes_recur(&self) -> bool {
        let requests = self.window.len();
        requests < MIN_RECURRENCE_SAMPLE
            || self.repeated_first_blocks as f64 >= RECURRING_SHARE * self.first_blocks.len() as f64
    }

    /// The sampled prefixes of `chain` seen at least [`MIN_SIGHTINGS`] times in the window,
    /// with their shares, shortest first, into `out` (cleared first).
    pub fn shares(&self, chain: &[BlockHash], out: &mut Vec<PrefixShare>) {
        out.clear();
        let requests = self.window.len() as f64;
        let mut depths = sampled_depths(chain.len()).peekable();
        while let Some(blocks) = depths.next() {
            match self.counts.get(&chain[blocks as usize - 1]) {
                Some(&count) if count >= MIN_SIGHTINGS => out.push(PrefixShare {
                    blocks,
                    share: f64::from(count) / requests,
                    until: depths.peek().map_or(chain.len() as u32, |next| next - 1),
                }),
                // A longer prefix was begun by no more requests than this one.
                _ => break,
            }
        }
    }

    /// `request` weighed by this traffic: its chain's shares, written into `shares`, as its
    /// popular prefixes.
    pub fn weigh<'a>(
        &self,
        request: &RouteRequest<'a>,
        shares: &'a mut Vec<PrefixShare>,
    ) -> RouteRequest<'a> {
        self.shares(request.chain, shares);
        RouteRequest {
            popular: shares,
            prefixes_recur: self.prefixes_recur(),
            ..*request
        }
    }

    /// Requests in the window.
    pub fn len(&self) -> usize {
        self.window.len()
    }

    pub fn is_empty(&self) -> bool {
        self.window.is_empty()
    }
}

/// The depths counted, up to `chain_len`: 1, 2, 3, then four per doubling (4, 5, 6, 7, 8, 10,
/// 12, 14, 16, 20, …: no gap over a quarter of the depth), and `chain_len` itself, so that a
/// request repeated whole counts.
pub(crate) fn sampled_depths(chain_len: usize) -> impl Iterator<Item = u32> {
    let len = chain_len.min(u32::MAX as usize) as u32;
    let steps = std::iter::successors(Some(1u32), |&d| {
        // From 4 on, a quarter of the power of two at or below `d`.
        let step = (1u32 << d.ilog2()).div_ceil(4).max(1);
        d.checked_add(step)
    });
    let counted = steps.take_while(move |&d| d < len);
    counted.chain((len > 0).then_some(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(prefix: u64, own: u64, len: u64) -> Vec<BlockHash> {
        // The first half is the shared prefix's, the rest the request's own.
        (0..len)
            .map(|i| {
                if i < len / 2 {
                    prefix * 1000 + i
                } else {
                    own * 1_000_000 + i
                }
            })
            .collect()
    }

    #[test]
    fn depths_are_the_powers_of_two_and_the_whole_chain() {
        assert_eq!(sampled_depths(0).collect::<Vec<_>>(), Vec::<u32>::new());
        assert_eq!(sampled_depths(1).collect::<Vec<_>>(), [1]);
        assert_eq!(
            sampled_depths(8).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5, 6, 7, 8]
        );
        assert_eq!(
            sampled_depths(27).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 27]
        );
        let long: Vec<u32> = sampled_depths(6_250).collect();
        assert!(long.len() < 55, "{}", long.len());
        assert!(
            long.windows(2).all(|w| w[1] - w[0] <= w[0] / 4 + 1),
            "{long:?}"
        );
    }

    #[test]
    fn a_prefix_behind_most_requests_has_their_share() {
        let mut traffic = PrefixTraffic::new(100);
        for i in 0..100 {
            // Four in five requests share prefix 1; the rest each have their own.
            let prefix = if i % 5 == 0 { 10 + i } else { 1 };
            traffic.record(&chain(prefix, i, 16));
        }
        let mut out = Vec::new();
        traffic.shares(&chain(1, 999, 16), &mut out);
        let depths: Vec<u32> = out.iter().map(|s| s.blocks).collect();
        assert_eq!(
            depths,
            [1, 2, 3, 4, 5, 6, 7, 8],
            "the shared half only: {out:?}"
        );
        assert_eq!(
            out.last().map(|s| s.until),
            Some(9),
            "it may span to before block 10"
        );
        assert!(out.iter().all(|s| (s.share - 0.8).abs() < 1e-9), "{out:?}");
        traffic.shares(&chain(10, 0, 16), &mut out);
        assert!(out.is_empty(), "a prefix seen once has no share: {out:?}");
    }

    #[test]
    fn the_window_forgets_the_oldest_requests() {
        let mut traffic = PrefixTraffic::new(20);
        for i in 0..20 {
            traffic.record(&chain(1, i, 4));
        }
        let mut out = Vec::new();
        traffic.shares(&chain(1, 99, 4), &mut out);
        assert_eq!(out.first().map(|s| s.share), Some(1.0));
        for i in 0..20 {
            traffic.record(&chain(2, i, 4));
        }
        assert_eq!(traffic.len(), 20);
        traffic.shares(&chain(1, 99, 4), &mut out);
        assert!(out.is_empty(), "prefix 1 left the window: {out:?}");
        assert!(
            !traffic.counts.contains_key(&1000) && !traffic.counts.contains_key(&1001),
            "no count outlives its requests"
        );
    }

    #[test]
    fn prefixes_recur_where_enough_first_blocks_begin_several_requests() {
        let mut traffic = PrefixTraffic::new(200);
        // Too few requests to tell: assumed to recur.
        for i in 0..(MIN_RECURRENCE_SAMPLE as u64 - 1) {
            traffic.record(&chain(100 + i, i, 4));
        }
        assert!(traffic.prefixes_recur());
        // Every prompt its own.
        traffic.record(&chain(999, 999, 4));
        assert!(!traffic.prefixes_recur());
        // One hot prefix behind most requests, the rest their own: one first block of many
        // recurs, and a new one is still unlikely to.
        let mut hot = PrefixTraffic::new(200);
        for i in 0..200 {
            let prefix = if i % 5 == 0 { 10 + i } else { 1 };
            hot.record(&chain(prefix, i, 4));
        }
        assert!(!hot.prefixes_recur(), "1 of 41 first blocks recurs");
        // Conversations of three turns: every first block recurs.
        let mut turns = PrefixTraffic::new(200);
        for i in 0..200 {
            turns.record(&chain(10 + i / 3, i, 4));
        }
        assert!(turns.prefixes_recur());
        // The counts follow the window: once the own prompts are gone, the turns recur.
        for i in 0..200 {
            hot.record(&chain(10 + i / 3, i, 4));
        }
        assert!(hot.prefixes_recur());
        assert_eq!(hot.first_blocks.len(), 67);
        assert_eq!(hot.repeated_first_blocks, 67);
    }

    #[test]
    fn an_empty_chain_counts_as_a_request_of_no_prefix() {
        let mut traffic = PrefixTraffic::new(10);
        traffic.record(&[]);
        assert_eq!(traffic.len(), 1);
        let mut out = Vec::new();
        traffic.shares(&[], &mut out);
        assert!(out.is_empty());
    }
}
