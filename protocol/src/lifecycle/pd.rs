//! Prefill/decode disaggregation, sans-IO: whether a request is split into a prefill and a
//! decode leg, where the prefill goes when the request arrives, and where the decode goes when
//! the prefill answers (runtime redirection: a burst that loaded a decode engine while the
//! prefill ran gets no more decodes there).
//!
//! The entry judges each request on the engine it would otherwise run on: it is disaggregated
//! when the part of its prompt the best whole-request engine does not hold is long enough
//! ([`PdConfig::min_uncached_tokens`]) and the best prefill engine is not busy
//! ([`PdConfig::max_prefill_wait_ms`]). The prefill engine is chosen cache-aware, as any request
//! is ([`EntryState::route`] over the prefill engines); the decode engine by
//! [`decide_decode`]. Clusters without prefill engines never disaggregate.

use super::entry::{EntryState, PeerInput};
use super::plan::{Plan, uncached_tokens};
use crate::digest::Role;
use crate::route::{PdConfig, RouteConfig, RouteError, RouteRequest, decide_decode};

/// How long a request would wait behind the prefills queued at `prefill`'s first choice:
/// the prompt tokens queued there (in the sizes its serving node reported, else each as long
/// as this request's there), at that engine's prefill speed.
fn prefill_wait_ms(prefill: &Plan, peers: &[PeerInput<'_>], config: &RouteConfig) -> f64 {
    let Some(first) = prefill.ranked_keys().next() else {
        return 0.0;
    };
    let ahead = f64::from(prefill.tokens_ahead_at_first());
    prefill_ms(ahead, first, peers, config)
}

/// Milliseconds `key`'s engine takes to prefill `tokens`, at its gossiped speed.
fn prefill_ms(tokens: f64, key: u64, peers: &[PeerInput<'_>], config: &RouteConfig) -> f64 {
    let speed = peers
        .iter()
        .find(|peer| peer.key == key)
        .map(|peer| f64::from(peer.digest.prefill_tokens_per_s))
        .filter(|speed| *speed > 0.0)
        .unwrap_or(config.assumed.default_prefill_tokens_per_s.max(1.0));
    tokens / speed * 1000.0
}

/// A decode engine counts as connected to a prefill engine this long after its last pull
/// from it (a NIXL agent keeps its peers' metadata until one restarts).
pub const PAIR_TTL_MS: u64 = 600_000;

/// What became of disaggregation for one request; a response header and a metric label.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum PdReason {
    /// Prefill on a prefill engine, decode on a decode engine.
    Pd,
    /// The uncached part of the prompt is too short to be worth a transfer: run whole.
    SkipShort,
    /// Every prefill engine is busy: run whole rather than wait for one.
    SkipBusy,
    /// Disaggregation was meant but could not be done (no decode engine, or a leg failed):
    /// the request ran whole.
    Fallback,
}

impl PdReason {
    pub const ALL: [PdReason; 4] = [
        PdReason::Pd,
        PdReason::SkipShort,
        PdReason::SkipBusy,
        PdReason::Fallback,
    ];

    /// The stable name used in headers and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            PdReason::Pd => "pd",
            PdReason::SkipShort => "pd-skip-short",
            PdReason::SkipBusy => "pd-skip-busy",
            PdReason::Fallback => "pd-fallback",
        }
    }
}

/// How a request is to be served.
#[derive(Clone, Debug, PartialEq)]
pub enum PdRoute {
    /// On one engine. `pd`: why it was not disaggregated, `None` where no prefill engine
    /// serves its model (nothing to say).
    Whole { plan: Plan, pd: Option<PdReason> },
    /// Its prefill leg first; when that answers, [`EntryState::route_decode`] places the rest.
    Split {
        prefill: Plan,
        /// Prompt tokens the best whole-request engine did not hold.
        uncached_tokens: u32,
    },
}

impl EntryState {
    /// Decides whether `request` (a whole request: `role` is [`Role::Mixed`]) is
    /// disaggregated, and plans its first leg; counts it in the recent traffic once.
    pub fn route_pd(
        &mut self,
        peers: &[PeerInput<'_>],
        request: &RouteRequest<'_>,
        config: &RouteConfig,
        pd: &PdConfig,
        now_ms: u64,
    ) -> Result<PdRoute, RouteError> {
        let placed = self.place_pd(peers, request, config, pd, now_ms)?;
        self.count(request);
        Ok(placed)
    }

    fn place_pd(
        &mut self,
        peers: &[PeerInput<'_>],
        request: &RouteRequest<'_>,
        config: &RouteConfig,
        pd: &PdConfig,
        now_ms: u64,
    ) -> Result<PdRoute, RouteError> {
        let prefill_request = RouteRequest {
            role: Role::Prefill,
            ..*request
        };
        let has_prefill = peers.iter().any(|peer| {
            peer.digest.healthy
                && peer.digest.role == Role::Prefill
                && peer.digest.serves(request.model)
        });
        if !has_prefill {
            let plan = self.plan(peers, request, config, now_ms)?;
            return Ok(PdRoute::Whole { plan, pd: None });
        }
        let whole = match self.route_whole(peers, request, config, now_ms)? {
            (plan, false) => plan,
            (plan, true) => {
                return Ok(PdRoute::Whole {
                    plan,
                    pd: Some(PdReason::Fallback),
                });
            }
        };
        let uncached = uncached_tokens(whole.matched_blocks(), request);
        if uncached < pd.min_uncached_tokens {
            return Ok(PdRoute::Whole {
                plan: whole,
                pd: Some(PdReason::SkipShort),
            });
        }
        let prefill = match self.plan(peers, &prefill_request, config, now_ms) {
            Ok(prefill) => prefill,
            Err(RouteError::NoCandidate(_)) => {
                return Ok(PdRoute::Whole {
                    plan: whole,
                    pd: Some(PdReason::Fallback),
                });
            }
        };
        let wait_ms = prefill_wait_ms(&prefill, peers, config);
        if wait_ms > pd.max_prefill_wait_ms as f64
            && wait_ms > self.stall_ms(&whole, uncached, peers, config, now_ms)
        {
            return Ok(PdRoute::Whole {
                plan: whole,
                pd: Some(PdReason::SkipBusy),
            });
        }
        Ok(PdRoute::Split {
            prefill,
            uncached_tokens: uncached,
        })
    }

    /// What running a prompt whole on `whole`'s first choice costs the requests already there:
    /// each waits for its `uncached` tokens' prefill (a decode stalls, a queued request starts
    /// later). Waiting for a prefill engine costs the request alone, so it runs whole only
    /// when its wait is longer than this: the more decodes an engine runs, and the longer the
    /// prompt, the longer the wait it is worth.
    fn stall_ms(
        &self,
        whole: &Plan,
        uncached: u32,
        peers: &[PeerInput<'_>],
        config: &RouteConfig,
        now_ms: u64,
    ) -> f64 {
        let Some(first) = whole.ranked_keys().next() else {
            return 0.0;
        };
        let Some(peer) = peers.iter().find(|peer| peer.key == first) else {
            return 0.0;
        };
        let estimated = self.estimate(peer, now_ms);
        let there = estimated.gauges.load().saturating_add(estimated.pending);
        f64::from(there) * prefill_ms(f64::from(uncached), first, peers, config)
    }

    /// Plans `request` (a whole request) on the engines that take whole requests, or, when
    /// none does, on the prefill engines, which are engines like any other; whether it fell
    /// back to them. Not counted in the recent traffic: a request [`Self::route_pd`] placed
    /// already is, and this re-plans it when its prefill leg failed.
    pub fn route_whole(
        &mut self,
        peers: &[PeerInput<'_>],
        request: &RouteRequest<'_>,
        config: &RouteConfig,
        now_ms: u64,
    ) -> Result<(Plan, bool), RouteError> {
        match self.plan(peers, request, config, now_ms) {
            Ok(plan) => Ok((plan, false)),
            Err(RouteError::NoCandidate(_)) => {
                let prefill = RouteRequest {
                    role: Role::Prefill,
                    ..*request
                };
                Ok((self.plan(peers, &prefill, config, now_ms)?, true))
            }
        }
    }

    /// Plans the decode leg of `request`, whose prefill ran on `prefill_key`'s engine, on the
    /// load known now.
    pub fn route_decode(
        &mut self,
        peers: &[PeerInput<'_>],
        request: &RouteRequest<'_>,
        prefill_key: u64,
        config: &RouteConfig,
        pd: &PdConfig,
        now_ms: u64,
    ) -> Result<Plan, RouteError> {
        let warm: Vec<u64> = self
            .pairs
            .keys()
            .filter(|(prefill, _)| *prefill == prefill_key)
            .map(|&(_, decode)| decode)
            .collect();
        let candidates = self.candidates(peers, request.chain, now_ms);
        let decision = decide_decode(&candidates, request, &warm, config, pd, now_ms)?;
        let decode_request = RouteRequest {
            role: Role::Decode,
            ..*request
        };
        Ok(Plan::new(&decision, &candidates, &decode_request, config).pulling())
    }

    /// A decode leg on `decode_key`'s engine of a prefill run on `prefill_key`'s started: the
    /// decode engine has connected to the prefill engine.
    pub fn record_pair(&mut self, prefill_key: u64, decode_key: u64, now_ms: u64) {
        self.pairs.insert((prefill_key, decode_key), now_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::LoadDigest;
    use crate::lifecycle::Outcome;
    use crate::route::node_key;
    use crate::route::tests::{digest, request};

    const NOW: u64 = 10_000;

    fn engine(role: Role, waiting: u32) -> LoadDigest {
        LoadDigest {
            role,
            ..digest(waiting)
        }
    }

    fn peer<'a>(name: &str, digest: &'a LoadDigest) -> PeerInput<'a> {
        PeerInput {
            key: node_key(name),
            digest,
            digest_received_ms: NOW - 50,
            summary: None,
            offload: None,
            live: None,
        }
    }

    fn route(
        entry: &mut EntryState,
        peers: &[PeerInput<'_>],
        blocks: u64,
        pd: &PdConfig,
    ) -> PdRoute {
        let chain: Vec<u64> = (0..blocks).collect();
        entry
            .route_pd(peers, &request(&chain), &RouteConfig::default(), pd, NOW)
            .unwrap()
    }

    fn first_key(route: &PdRoute) -> (Option<PdReason>, u64) {
        match route {
            PdRoute::Whole { plan, pd } => (*pd, plan.ranked_keys().next().unwrap()),
            PdRoute::Split { prefill, .. } => {
                (Some(PdReason::Pd), prefill.ranked_keys().next().unwrap())
            }
        }
    }

    #[test]
    fn long_uncached_prompts_split_short_ones_run_whole_on_a_decode_engine() {
        let (p, d) = (engine(Role::Prefill, 0), engine(Role::Decode, 0));
        let peers = [peer("p", &p), peer("d", &d)];
        let mut entry = EntryState::default();
        let pd = PdConfig::default();
        // 64 blocks of 16 tokens: 1,024 uncached tokens.
        assert_eq!(
            first_key(&route(&mut entry, &peers, 64, &pd)),
            (Some(PdReason::Pd), node_key("p"))
        );
        // 16 blocks: 256 tokens, under the default 512.
        assert_eq!(
            first_key(&route(&mut entry, &peers, 16, &pd)),
            (Some(PdReason::SkipShort), node_key("d"))
        );
    }

    #[test]
    fn a_prefill_pool_busy_for_longer_than_the_bound_runs_the_request_whole() {
        // 1,024 tokens at the default 5,000 tokens/s: about 205 ms per queued prefill, less
        // the 250 tokens the engine did in the digest's 50 ms.
        let (d, mut entry) = (engine(Role::Decode, 0), EntryState::default());
        let pd = PdConfig::default();
        let busy = engine(Role::Prefill, 11);
        let peers = [peer("p", &busy), peer("d", &d)];
        assert_eq!(
            first_key(&route(&mut entry, &peers, 64, &pd)),
            (Some(PdReason::SkipBusy), node_key("d"))
        );
        // The same queue reported in tokens, of short prompts: 1,100 tokens, 0.2 s.
        let short = LoadDigest {
            queued_tokens: Some(11 * 100),
            ..busy
        };
        let peers = [peer("p", &short), peer("d", &d)];
        assert_eq!(
            first_key(&route(&mut entry, &peers, 64, &pd)).0,
            Some(PdReason::Pd)
        );
        // Nine queued wait 1.8 s: under the 2 s bound.
        let queued = engine(Role::Prefill, 9);
        let peers = [peer("p", &queued), peer("d", &d)];
        assert_eq!(
            first_key(&route(&mut entry, &peers, 64, &pd)).0,
            Some(PdReason::Pd)
        );
        // A faster engine takes longer queues.
        let fast = LoadDigest {
            prefill_tokens_per_s: 20_000.0,
            ..engine(Role::Prefill, 30)
        };
        let peers = [peer("p", &fast), peer("d", &d)];
        assert_eq!(
            first_key(&route(&mut entry, &peers, 64, &pd)).0,
            Some(PdReason::Pd)
        );
    }

    #[test]
    fn a_decode_engine_running_many_decodes_waits_longer_before_it_prefills_whole() {
        // Running 1,024 tokens whole on `d` stalls its 20 decodes for ~205 ms each: 4.1 s.
        let mut entry = EntryState::default();
        let pd = PdConfig::default();
        let d = LoadDigest {
            running: 20,
            ..engine(Role::Decode, 0)
        };
        let queued = |waiting| engine(Role::Prefill, waiting);
        // Twelve queued wait 2.4 s: over the 2 s bound, under the stall.
        let p = queued(12);
        let peers = [peer("p", &p), peer("d", &d)];
        assert_eq!(
            first_key(&route(&mut entry, &peers, 64, &pd)).0,
            Some(PdReason::Pd)
        );
        // Twenty-five wait 5.1 s: longer than the stall.
        let p = queued(25);
        let peers = [peer("p", &p), peer("d", &d)];
        assert_eq!(
            first_key(&route(&mut entry, &peers, 64, &pd)),
            (Some(PdReason::SkipBusy), node_key("d"))
        );
    }

    #[test]
    fn without_prefill_engines_nothing_is_said_and_without_decode_engines_prefill_ones_serve() {
        let (m, p) = (engine(Role::Mixed, 0), engine(Role::Prefill, 0));
        let mut entry = EntryState::default();
        let pd = PdConfig::default();
        assert_eq!(
            first_key(&route(&mut entry, &[peer("m", &m)], 64, &pd)),
            (None, node_key("m"))
        );
        assert_eq!(
            first_key(&route(&mut entry, &[peer("p", &p)], 64, &pd)),
            (Some(PdReason::Fallback), node_key("p"))
        );
    }

    #[test]
    fn the_decode_leg_goes_where_the_load_is_least_when_the_prefill_answers() {
        let p = engine(Role::Prefill, 0);
        let (d1, d2) = (engine(Role::Decode, 0), engine(Role::Decode, 0));
        let peers = [peer("p", &p), peer("d1", &d1), peer("d2", &d2)];
        let chain: Vec<u64> = (0..64).collect();
        let request = request(&chain);
        let (config, pd) = (RouteConfig::default(), PdConfig::default());
        let mut entry = EntryState::default();
        // Decode legs sent meanwhile (a burst) alternate: each counts where it went.
        let mut chosen = Vec::new();
        for _ in 0..6 {
            let mut plan = entry
                .route_decode(&peers, &request, node_key("p"), &config, &pd, NOW)
                .unwrap();
            let attempt = plan.next_attempt(&mut entry, &chain, NOW).unwrap();
            assert_eq!(attempt.prefill_tokens, 0, "a decode leg computes no prompt");
            assert_eq!(attempt.decline_above_tokens, None);
            let progress = plan.on_outcome(&mut entry, &chain, Outcome::Started(None), NOW);
            assert_eq!(progress, crate::lifecycle::Progress::Served);
            chosen.push(peers[attempt.candidate].key);
        }
        let on_d1 = chosen.iter().filter(|&&k| k == node_key("d1")).count();
        assert_eq!(on_d1, 3, "{chosen:?}");
    }

    #[test]
    fn a_decode_engine_that_pulled_from_the_prefill_engine_is_preferred() {
        let p = engine(Role::Prefill, 0);
        let (d1, d2) = (engine(Role::Decode, 0), engine(Role::Decode, 0));
        let peers = [peer("p", &p), peer("d1", &d1), peer("d2", &d2)];
        let chain: Vec<u64> = (0..64).collect();
        let (config, pd) = (RouteConfig::default(), PdConfig::default());
        let mut entry = EntryState::default();
        let first = |entry: &mut EntryState| {
            entry
                .route_decode(&peers, &request(&chain), node_key("p"), &config, &pd, NOW)
                .unwrap()
                .ranked_keys()
                .next()
                .unwrap()
        };
        let cold = first(&mut entry);
        let other = [node_key("d1"), node_key("d2")]
            .into_iter()
            .find(|&k| k != cold)
            .unwrap();
        entry.record_pair(node_key("p"), other, NOW);
        assert_eq!(first(&mut entry), other);
        // The pairing is forgotten after its time to live.
        entry.prune(NOW + PAIR_TTL_MS + 1, |_| 0);
        assert_eq!(first(&mut entry), cold);
    }
}
