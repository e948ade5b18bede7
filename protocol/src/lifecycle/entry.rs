//! The entry side of a request's lifecycle: what this node knows of the engines it sends to
//! beyond what gossip brought (its own recent sends, and the loads their sidecars reported on
//! the return path), and the ranking of a request over that view.

use super::plan::Plan;
use super::report::LoadReport;
use crate::block_map::BlockMap;
use crate::digest::LoadDigest;
use crate::route::{
    Candidate, DecideScratch, Gauges, PendingLedger, PrefixShare, PrefixTraffic, RecentSends,
    RouteConfig, RouteError, RouteRequest, decide_with,
};
use crate::summary::PeerSummary;
use std::collections::HashMap;

/// Sends stop counting as pending after this even when no newer digest or report arrived: a
/// peer that stopped publishing must not look loaded forever on this node's account.
pub const PENDING_TTL_MS: u64 = 2_000;
/// Optimistic prefix matches last this long: a peer's own summary has shown them by then.
pub const RECENT_TTL_MS: u64 = 3_000;
/// Bound on the block hashes remembered for optimistic matches (~40 MB at most).
pub const RECENT_MAX_ENTRIES: usize = 1_000_000;
/// A return-path report stands in for gossip this long at most: a restarted peer numbers its
/// digests from zero again, and gossip refreshes every engine at least once a second.
pub const REPORT_TTL_MS: u64 = 2_000;

/// One engine a request could go to, as gossip (or, for this node's own, the node itself)
/// shows it.
#[derive(Copy, Clone, Debug)]
pub struct PeerInput<'a> {
    /// `route::node_key` of the node's id.
    pub key: u64,
    pub digest: &'a LoadDigest,
    /// When `digest` arrived, this node's monotonic milliseconds.
    pub digest_received_ms: u64,
    pub summary: Option<&'a PeerSummary>,
    pub offload: Option<&'a PeerSummary>,
    /// This node's own engine: its exact gauges now ([`super::ServingState::gauges`]), which
    /// already count every send this node made there.
    pub live: Option<Gauges>,
}

/// Where the gauges of a peer's [`Estimated`] load come from.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The latest gossiped digest.
    Digest,
    /// The load its sidecar reported on its last answer or decline, newer than the digest.
    Report,
    /// This node's own engine, counted exactly.
    Live,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Digest => "digest",
            Source::Report => "report",
            Source::Live => "live",
        }
    }
}

/// A peer's load as a decision now would see it.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Estimated {
    pub gauges: Gauges,
    /// This node's sends there that `gauges` do not count yet.
    pub pending: u32,
    pub source: Source,
    /// When `gauges` were read (this node's own engine: now) or arrived (a report or a
    /// digest), in this node's milliseconds: how old the load a decision reads is.
    pub received_ms: u64,
    /// The last report it sent back and when that arrived (this node's milliseconds).
    pub last_report: Option<(LoadReport, u64)>,
}

#[derive(Copy, Clone, Debug, PartialEq)]
struct Reported {
    report: LoadReport,
    /// The send the report answered: this node's later sends are not in it.
    as_of_ms: u64,
    received_ms: u64,
}

/// Everything the entry side keeps between requests.
#[derive(Debug)]
pub struct EntryState {
    ledger: PendingLedger,
    /// Attempts in flight that may be declined, by the node a decline would send them to:
    /// counted there as if sent, since that engine's load at the check is what the decliner
    /// compares against, and in a burst through this node many come back at once.
    returnable: PendingLedger,
    recent: RecentSends,
    reports: BlockMap<u64, Reported>,
    /// Prefill and decode engines whose decode leg started, and when last: the decode engine
    /// has pulled from that prefill engine, so a next pull skips the handshake.
    pub(super) pairs: HashMap<(u64, u64), u64>,
    /// The prefixes of the requests this node routed lately: which are owed more holders.
    traffic: PrefixTraffic,
    pub(super) scratch: DecideScratch,
    shares: Vec<PrefixShare>,
}

impl Default for EntryState {
    fn default() -> Self {
        Self::new(RECENT_TTL_MS, RECENT_MAX_ENTRIES)
    }
}

impl EntryState {
    /// `recent_ttl_ms` and `recent_max_entries` bound the optimistic prefix matches (the
    /// defaults are [`RECENT_TTL_MS`] and [`RECENT_MAX_ENTRIES`]).
    pub fn new(recent_ttl_ms: u64, recent_max_entries: usize) -> Self {
        Self {
            ledger: PendingLedger::new(PENDING_TTL_MS),
            returnable: PendingLedger::new(PENDING_TTL_MS),
            recent: RecentSends::new(recent_ttl_ms, recent_max_entries),
            reports: BlockMap::default(),
            pairs: HashMap::new(),
            traffic: PrefixTraffic::default(),
            scratch: DecideScratch::default(),
            shares: Vec::new(),
        }
    }

    /// Ranks `request` over `peers` and plans its attempts; counts it in the traffic whose
    /// shares the next decisions weigh prefixes by.
    pub fn route(
        &mut self,
        peers: &[PeerInput<'_>],
        request: &RouteRequest<'_>,
        config: &RouteConfig,
        now_ms: u64,
    ) -> Result<Plan, RouteError> {
        let plan = self.plan(peers, request, config, now_ms)?;
        self.count(request);
        Ok(plan)
    }

    /// [`Self::route`] without counting the request: for each of the plans one request may
    /// need.
    pub(super) fn plan(
        &mut self,
        peers: &[PeerInput<'_>],
        request: &RouteRequest<'_>,
        config: &RouteConfig,
        now_ms: u64,
    ) -> Result<Plan, RouteError> {
        let candidates = self.candidates(peers, request.chain, now_ms);
        let mut shares = std::mem::take(&mut self.shares);
        let weighed = self.traffic.weigh(request, &mut shares);
        let decision = decide_with(&mut self.scratch, &candidates, &weighed, config, now_ms);
        self.shares = shares;
        Ok(Plan::new(&decision?, &candidates, request, config))
    }

    /// Whether the requests this node routed lately share prefixes (see
    /// [`PrefixTraffic::prefixes_recur`]).
    pub fn prefixes_recur(&self) -> bool {
        self.traffic.prefixes_recur()
    }

    /// Counts a routed request in the recent traffic.
    pub(super) fn count(&mut self, request: &RouteRequest<'_>) {
        self.traffic.record(request.chain);
    }

    /// Every peer as a decision on `chain` sees it.
    pub(super) fn candidates<'a>(
        &self,
        peers: &[PeerInput<'a>],
        chain: &[u64],
        now_ms: u64,
    ) -> Vec<Candidate<'a>> {
        // Only nodes recently sent this chain's first block can have an optimistic match.
        let recently_sent: Vec<u64> = self.recent.nodes_with_first(chain, now_ms).collect();
        peers
            .iter()
            .map(|peer| self.candidate(peer, &recently_sent, chain, now_ms))
            .collect()
    }

    /// `peer` as the decision sees it: the fresher of its digest and its last report, and this
    /// node's sends since whichever that is.
    fn candidate<'a>(
        &self,
        peer: &PeerInput<'a>,
        recently_sent: &[u64],
        chain: &[u64],
        now_ms: u64,
    ) -> Candidate<'a> {
        let (fresh, since, received) = match (peer.live, self.fresh_report(peer, now_ms)) {
            (Some(live), _) => (Some(live), now_ms + 1, now_ms),
            (None, Some(reported)) => (
                Some(reported.report.gauges()),
                reported.as_of_ms,
                reported.received_ms.max(peer.digest_received_ms),
            ),
            (None, None) => (None, peer.digest_received_ms, peer.digest_received_ms),
        };
        let sent = self.ledger.pending(peer.key, since, now_ms);
        Candidate {
            node_key: peer.key,
            digest: peer.digest,
            summary: peer.summary,
            held_blocks: None,
            offload: peer.offload,
            digest_received_ms: received,
            pending: sent + self.returnable.pending(peer.key, 0, now_ms),
            // Without fresher gauges, `since` is the digest's arrival: the same count.
            digest_pending: match fresh {
                Some(_) => self
                    .ledger
                    .pending(peer.key, peer.digest_received_ms, now_ms),
                None => sent,
            },
            recent_match: if recently_sent.contains(&peer.key) {
                self.recent.matched(peer.key, chain, now_ms)
            } else {
                0
            },
            fresh,
        }
    }

    /// The peer's last report, if gossip has brought nothing newer and it is not too old.
    fn fresh_report(&self, peer: &PeerInput<'_>, now_ms: u64) -> Option<Reported> {
        self.reports.get(&peer.key).copied().filter(|reported| {
            reported.report.digest_version >= peer.digest.version
                && now_ms.saturating_sub(reported.received_ms) <= REPORT_TTL_MS
        })
    }

    /// How a decision now would see `peer`'s load, for operators (`/debug/cluster`) and tests.
    pub fn estimate(&self, peer: &PeerInput<'_>, now_ms: u64) -> Estimated {
        let candidate = self.candidate(peer, &[], &[], now_ms);
        let source = match (peer.live, candidate.fresh) {
            (Some(_), _) => Source::Live,
            (None, Some(_)) => Source::Report,
            (None, None) => Source::Digest,
        };
        Estimated {
            gauges: candidate.gauges(),
            pending: candidate.pending,
            source,
            received_ms: candidate.digest_received_ms,
            last_report: self
                .reports
                .get(&peer.key)
                .map(|reported| (reported.report, reported.received_ms)),
        }
    }

    /// Sends still counted against `key` (not reflected by a digest or report received at or
    /// after `since_ms`), for tests and operators.
    pub fn pending(&self, key: u64, since_ms: u64, now_ms: u64) -> u32 {
        self.ledger.pending(key, since_ms, now_ms)
    }

    /// Remembered block hashes of recent sends (for metrics).
    pub fn recent_len(&self) -> usize {
        self.recent.len()
    }

    /// Forgets sends that `digest_received_ms(key)` or the time to live have made moot, and
    /// reports that outlived theirs.
    pub fn prune(&mut self, now_ms: u64, digest_received_ms: impl Fn(u64) -> u64) {
        self.ledger.prune(now_ms, digest_received_ms);
        self.returnable.prune(now_ms, |_| 0);
        self.reports
            .retain(|_, reported| now_ms.saturating_sub(reported.received_ms) <= REPORT_TTL_MS);
        self.pairs
            .retain(|_, used_ms| now_ms.saturating_sub(*used_ms) <= super::pd::PAIR_TTL_MS);
    }

    pub(super) fn record_send(&mut self, key: u64, chain: &[u64], now_ms: u64) {
        self.ledger.record(key, now_ms);
        self.recent.record(key, chain, now_ms);
    }

    /// An attempt made at `at_ms` would come to `key` if declined.
    pub(super) fn record_returnable(&mut self, key: u64, at_ms: u64) {
        self.returnable.record(key, at_ms);
    }

    /// The attempt made at `at_ms` that would have come to `key` ended one way or another.
    pub(super) fn settle_returnable(&mut self, key: u64, at_ms: u64) {
        self.returnable.withdraw(key, at_ms);
    }

    /// The send at `at_ms` left nothing in that engine's queue or cache.
    pub(super) fn withdraw_send(&mut self, key: u64, chain: &[u64], at_ms: u64) {
        self.ledger.withdraw(key, at_ms);
        self.recent.withdraw(key, chain, at_ms);
    }

    /// The send at `at_ms` (settled already) left nothing in that engine's cache.
    pub(super) fn forget_sent_chain(&mut self, key: u64, chain: &[u64], at_ms: u64) {
        self.recent.withdraw(key, chain, at_ms);
    }

    /// The send at `at_ms` is no longer pending: a report counted it, or it ended.
    pub(super) fn settle_send(&mut self, key: u64, at_ms: u64) {
        self.ledger.withdraw(key, at_ms);
    }

    /// The answer to the send at `as_of_ms` to `key` relayed its first byte: if `key`'s last
    /// report answered that send, it counted the request as queued, and it now runs.
    pub(super) fn served_started(&mut self, key: u64, as_of_ms: u64) {
        if let Some(reported) = self.reports.get_mut(&key)
            && reported.as_of_ms == as_of_ms
            && reported.report.waiting > 0
        {
            reported.report.waiting -= 1;
            reported.report.running += 1;
        }
    }

    /// The request sent at `as_of_ms` to `key` ended (after [`Self::served_started`]): if
    /// `key`'s last report answered that send, the request is no longer there. Without this
    /// a report would count a finished request until gossip brings a newer digest.
    pub(super) fn served_ended(&mut self, key: u64, as_of_ms: u64) {
        if let Some(reported) = self.reports.get_mut(&key)
            && reported.as_of_ms == as_of_ms
        {
            let report = &mut reported.report;
            report.running = report.running.saturating_sub(1);
            report.inflight = report.inflight.saturating_sub(1);
        }
    }

    /// `key` reported its load in answer to the send at `as_of_ms`.
    pub(super) fn apply_report(&mut self, key: u64, report: LoadReport, as_of_ms: u64, now: u64) {
        let newer = self
            .reports
            .get(&key)
            .is_none_or(|old| old.as_of_ms <= as_of_ms);
        if newer && report.validate().is_ok() {
            self.reports.insert(
                key,
                Reported {
                    report,
                    as_of_ms,
                    received_ms: now,
                },
            );
        }
    }
}
