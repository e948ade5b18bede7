//! [`Plan`]: one request's attempts, from the entry's ranking to an answer or a failure.
//!
//! The entry tries the ranked engines in order; for a new prefix, the decision's choice
//! first, then the others by the prefill work it estimates ahead of the request there, least
//! first. An attempt may be declined by its serving node (late binding) when the entry
//! allowed it: never on a request's last attempt, at most `max_declines` times
//! (`max_new_prefix_declines` for a new prefix), and never after a failure (a retry goes
//! where it can). A failed attempt is retried on the next in that order while retries remain
//! and the failure left nothing committed to the client. Every outcome updates the entry's
//! view of that engine.

use super::entry::EntryState;
use super::report::LoadReport;
use super::serving::Admission;
use super::shared::{PrefixSample, prefix_samples};
use crate::route::{Candidate, Decision, Estimate, RouteConfig, RouteReason, RouteRequest};

/// One engine of the ranking, with what an attempt there carries.
#[derive(Copy, Clone, Debug, PartialEq)]
struct Planned {
    /// Index into the candidates (the caller's peers) the plan was made from.
    candidate: usize,
    key: u64,
    /// Prompt tokens it is believed to have to compute.
    prefill_tokens: u32,
    /// The prefill work, in prompt tokens, above which it should pass the request on to
    /// the next in rank.
    decline_above_tokens: u32,
    /// The prompt tokens the decision believed queued there, ahead of this request.
    tokens_ahead: u32,
}

/// One attempt to make now.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// Index into the peers the plan was made from.
    pub candidate: usize,
    pub node_key: u64,
    /// Why the request goes there (the decision's reason, or why an earlier attempt passed).
    pub reason: RouteReason,
    /// Prompt tokens the engine is believed to have to compute (what the serving node counts
    /// in its queue).
    pub prefill_tokens: u32,
    /// The serving node may decline when its engine would prefill more prompt tokens than
    /// this up to the request's first token: the entry's estimate of that work at the next in
    /// rank (see [`tokens_bound`]).
    pub decline_above_tokens: Option<u32>,
    /// The key copies of the prompt's new prefix share ([`super::prefix_key`]), if the
    /// prompt has a block.
    pub prefix_key: Option<u64>,
    /// No engine held the prompt's first block: the serving node counts the new prefix.
    pub new_prefix: bool,
}

impl Attempt {
    /// What the serving side admits it by (`streamed`: whether the client asked for a
    /// streamed answer; `prefix_samples`: its plan's [`Plan::prefix_samples`]).
    pub fn admission<'a>(
        &self,
        streamed: bool,
        prefix_samples: &'a [PrefixSample],
    ) -> Admission<'a> {
        Admission {
            prefix_key: self.prefix_key,
            new_prefix: self.new_prefix,
            prefill_tokens: self.prefill_tokens,
            decline_above_tokens: self.decline_above_tokens,
            streamed,
            prefix_samples,
        }
    }
}

/// How an attempt ended.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The response head arrived (what the serving node reported with it, if anything).
    Started(Option<LoadReport>),
    /// The serving node declined it, with its load.
    Declined(Option<LoadReport>),
    /// It failed before the response head.
    Failed(Failure),
}

/// How an attempt failed before its response head.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Nothing reached the engine that makes another attempt unsafe or pointless.
    Retryable,
    /// Another attempt is unsafe or pointless (the engine refused the request itself).
    Final,
    /// The attempt's deadline passed; retryable, and the request's answer says so if no
    /// other attempt succeeds.
    TimedOut,
}

/// What the request does next.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Relay the answer; call [`Plan::ended`] when the request ends.
    Served,
    /// Make the next attempt ([`Plan::next_attempt`] returns it).
    TryNext,
    /// No attempt is left; `timed_out`: the last failure was the deadline.
    GaveUp { timed_out: bool },
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Sent {
    rank: usize,
    key: u64,
    at_ms: u64,
    may_decline: bool,
    /// The next in rank, where a decline would send it (counted there meanwhile).
    returns_to: Option<u64>,
    /// The serving node's report with the response head counted it (it is pending no more).
    reported: bool,
}

/// Where a request whose popular prefix was owed more holders went (see [`Plan::popular`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PopularPlacement {
    /// To an engine that held the prefix.
    Holder,
    /// To one that did not, and will hold it after.
    NewHolder,
}

impl PopularPlacement {
    pub const ALL: [PopularPlacement; 2] = [PopularPlacement::Holder, PopularPlacement::NewHolder];

    /// The name in metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            PopularPlacement::Holder => "holder",
            PopularPlacement::NewHolder => "new_holder",
        }
    }
}

/// One request's attempts.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    targets: Vec<Planned>,
    reason: RouteReason,
    matched_blocks: u32,
    popular_blocks: u32,
    prefix_key: Option<u64>,
    new_prefix: bool,
    /// A new prefix's samples, for the serving node to tell what its copies share.
    prefix_samples: Vec<PrefixSample>,
    next: usize,
    retries_left: u32,
    declines_left: u32,
    failed_before: bool,
    declined_before: bool,
    /// Ranks that declined, in order: when every engine after them failed, they are tried
    /// again (and may not decline then), since a decline says an engine is busy, not gone.
    declined_ranks: Vec<usize>,
    sent: Option<Sent>,
    served: Option<Sent>,
    /// The served answer's first byte was relayed.
    first_byte: bool,
    declines: u32,
    failures: u32,
}

/// The order in which `decision`'s ranks are attempted: the decision's, but for a new prefix.
fn attempt_order(
    decision: &Decision,
    request: &RouteRequest<'_>,
    config: &RouteConfig,
) -> Vec<usize> {
    // A new prefix's engines after its first choice, in the order a decline or a
    // failure should try them: the least prefill work ahead of it first (see
    // [`work_at`]), among the engines readiest for its adapter. The decision ranks them
    // by rendezvous weight alone, so the one after the first may be busier than a later
    // one: a serving node would then keep the request while another engine is idle,
    // judging it against the wrong alternative (issue 21). The price: the order is this
    // entry's view, so when the first choice declines copies of a new prefix sent through
    // several entries at once, entries whose views differ send them on to different
    // engines (before, all went to the second by weight). A request with a cached
    // prefix keeps the decision's order, which weighs its cache against load already
    // (trying the least busy first lost more of the cache in the simulator than it won:
    // `docs/studies/new-prefix-placement.md`).
    let mut order: Vec<usize> = (0..decision.ranked.len()).collect();
    if let Some(rest) = order.get_mut(1..).filter(|_| decision.new_prefix) {
        let work = |rank: usize| work_at(decision.estimates[rank], request, config);
        rest.sort_by(|&a, &b| {
            let ready = |rank: usize| decision.estimates[rank].ready;
            ready(b).cmp(&ready(a)).then(work(a).total_cmp(&work(b)))
        });
    }
    order
}

impl Plan {
    /// The plan for `decision` over `candidates`, with at most `config.late.max_declines`
    /// declines (`config.late.max_new_prefix_declines` for a new prefix);
    /// retries are unlimited until [`Plan::with_retries`] bounds them.
    pub fn new(
        decision: &Decision,
        candidates: &[Candidate<'_>],
        request: &RouteRequest<'_>,
        config: &RouteConfig,
    ) -> Self {
        let order = attempt_order(decision, request, config);
        let targets = order
            .iter()
            .enumerate()
            .map(|(position, &rank)| {
                let estimate = decision.estimates[rank];
                let next = order.get(position + 1).map(|&n| decision.estimates[n]);
                // A request never passes to an engine less ready for its adapter: its queue
                // in prefill work does not say how long the adapter would take to load.
                // A popular prefix owed holders is an engine's to copy: its prefill there is
                // not counted against it, or the copy would be declined for lacking it.
                let copying = uncached_tokens(estimate.matched, request).saturating_sub(
                    uncached_tokens(estimate.matched.max(decision.popular_blocks), request),
                );
                let decline_above_tokens = match next {
                    Some(next) if next.ready < estimate.ready => u32::MAX,
                    Some(next) => tokens_bound(next, estimate.matched, request, config)
                        .saturating_add(copying),
                    None => u32::MAX,
                };
                let candidate = decision.ranked[rank];
                Planned {
                    candidate,
                    key: candidates[candidate].node_key,
                    prefill_tokens: uncached_tokens(estimate.matched, request),
                    decline_above_tokens,
                    tokens_ahead: rounded(queued_work(estimate, request)),
                }
            })
            .collect();
        Self {
            targets,
            reason: decision.reason,
            matched_blocks: decision.matched_blocks,
            popular_blocks: decision.popular_blocks,
            prefix_key: super::prefix_key(request.chain),
            new_prefix: decision.new_prefix,
            prefix_samples: match decision.new_prefix {
                true => prefix_samples(request.chain, request.tokens_per_block),
                false => Vec::new(),
            },
            next: 0,
            retries_left: u32::MAX,
            declines_left: match decision.new_prefix {
                true => config.late.max_new_prefix_declines,
                false => config.late.max_declines,
            },
            failed_before: false,
            declined_before: false,
            declined_ranks: Vec::new(),
            sent: None,
            served: None,
            first_byte: false,
            declines: 0,
            failures: 0,
        }
    }

    /// The plan of a disaggregated request's decode leg: the engine pulls the prompt's KV
    /// rather than computing it, so no attempt counts prefill work in its queue, and none may
    /// be declined (its serving node's token bound judges prefills, and the entry chose it on
    /// load that is fresh at the prefill's end).
    pub fn pulling(mut self) -> Self {
        for target in &mut self.targets {
            target.prefill_tokens = 0;
        }
        self.new_prefix = false;
        self.declines_left = 0;
        self
    }

    /// At most `retries` attempts after failed ones.
    pub fn with_retries(mut self, retries: u32) -> Self {
        self.retries_left = retries;
        self
    }

    /// The decision's reason.
    pub fn reason(&self) -> RouteReason {
        self.reason
    }

    /// Blocks of the prompt the first choice was believed to hold.
    pub fn matched_blocks(&self) -> u32 {
        self.matched_blocks
    }

    /// Whether the decision counted a popular prefix as held by every engine (it was owed
    /// more holders), and if so, whether its first choice holds it already.
    pub fn popular(&self) -> Option<PopularPlacement> {
        (self.popular_blocks > 0).then_some(match self.matched_blocks >= self.popular_blocks {
            true => PopularPlacement::Holder,
            false => PopularPlacement::NewHolder,
        })
    }

    /// The prompt tokens the decision believed queued at its first choice, ahead of this
    /// request (its gauges' queue and this node's sends since, see [`tokens_bound`]).
    pub fn tokens_ahead_at_first(&self) -> u32 {
        self.targets.first().map_or(0, |target| target.tokens_ahead)
    }

    /// Whether no engine held the prompt's first block.
    pub fn new_prefix(&self) -> bool {
        self.new_prefix
    }

    /// Attempts declined so far.
    pub fn declines(&self) -> u32 {
        self.declines
    }

    /// Attempts failed so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The ranked engines' node keys, best first.
    pub fn ranked_keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.targets.iter().map(|t| t.key)
    }

    /// The next attempt, recorded as a send in `entry`; `None` when one is in progress, the
    /// request was served, or no engine is left.
    pub fn next_attempt(
        &mut self,
        entry: &mut EntryState,
        chain: &[u64],
        now_ms: u64,
    ) -> Option<Attempt> {
        if self.sent.is_some() || self.served.is_some() {
            return None;
        }
        let (rank, revisit) = match self.next < self.targets.len() {
            true => (self.next, false),
            false if self.failed_before && !self.declined_ranks.is_empty() => {
                (self.declined_ranks.remove(0), true)
            }
            false => return None,
        };
        let target = self.targets[rank];
        if !revisit {
            self.next += 1;
        }
        let may_decline = !revisit
            && self.declines_left > 0
            && !self.failed_before
            && rank + 1 < self.targets.len();
        let reason = if self.failed_before {
            RouteReason::Retry
        } else if self.declined_before {
            RouteReason::Declined
        } else {
            self.reason
        };
        entry.record_send(target.key, chain, now_ms);
        let returns_to = match may_decline {
            true => self.targets.get(rank + 1).map(|next| next.key),
            false => None,
        };
        if let Some(next) = returns_to {
            entry.record_returnable(next, now_ms);
        }
        self.sent = Some(Sent {
            rank,
            key: target.key,
            at_ms: now_ms,
            may_decline,
            returns_to,
            reported: false,
        });
        Some(Attempt {
            candidate: target.candidate,
            node_key: target.key,
            reason,
            prefill_tokens: target.prefill_tokens,
            decline_above_tokens: may_decline.then_some(target.decline_above_tokens),
            prefix_key: self.prefix_key,
            new_prefix: self.new_prefix,
        })
    }

    /// Applies how the current attempt ended, to the plan and to `entry`'s view.
    pub fn on_outcome(
        &mut self,
        entry: &mut EntryState,
        chain: &[u64],
        outcome: Outcome,
        now_ms: u64,
    ) -> Progress {
        let Some(sent) = self.sent.take() else {
            return self.progress_after(false);
        };
        if let Some(next) = sent.returns_to {
            entry.settle_returnable(next, sent.at_ms);
        }
        let outcome = match outcome {
            // A decline the entry did not allow is a fault of the peer: a failure.
            Outcome::Declined(_) if !sent.may_decline => Outcome::Failed(Failure::Retryable),
            other => other,
        };
        match outcome {
            Outcome::Started(report) => {
                let mut sent = sent;
                if let Some(report) = report {
                    // The report counts this request: it is pending no longer.
                    entry.settle_send(sent.key, sent.at_ms);
                    entry.apply_report(sent.key, report, sent.at_ms, now_ms);
                    sent.reported = true;
                }
                self.served = Some(sent);
                Progress::Served
            }
            Outcome::Declined(report) => {
                entry.withdraw_send(sent.key, chain, sent.at_ms);
                if let Some(report) = report {
                    entry.apply_report(sent.key, report, sent.at_ms, now_ms);
                }
                self.declines += 1;
                self.declines_left = self.declines_left.saturating_sub(1);
                self.declined_before = true;
                self.declined_ranks.push(sent.rank);
                self.progress_after(false)
            }
            Outcome::Failed(failure) => {
                entry.withdraw_send(sent.key, chain, sent.at_ms);
                self.failed(failure)
            }
        }
    }

    fn failed(&mut self, failure: Failure) -> Progress {
        self.failures += 1;
        self.failed_before = true;
        let timed_out = failure == Failure::TimedOut;
        if failure == Failure::Final || self.retries_left == 0 {
            self.next = self.targets.len();
            return Progress::GaveUp { timed_out };
        }
        self.retries_left -= 1;
        self.progress_after(timed_out)
    }

    fn progress_after(&self, timed_out: bool) -> Progress {
        let revisit = self.failed_before && !self.declined_ranks.is_empty();
        if self.next < self.targets.len() || revisit {
            Progress::TryNext
        } else {
            Progress::GaveUp { timed_out }
        }
    }

    /// The served answer broke before its first byte (its engine stopped answering, its
    /// peer was declared dead): nothing reached the client, so the request goes on as if
    /// that attempt had failed with `failure`, and the report that came with its head no
    /// longer counts it.
    pub fn lost_before_first_byte(
        &mut self,
        entry: &mut EntryState,
        chain: &[u64],
        failure: Failure,
    ) -> Progress {
        if self.first_byte {
            return self.progress_after(false);
        }
        let Some(sent) = self.served.take() else {
            return self.progress_after(false);
        };
        if sent.reported {
            // The report settled the send and counted the request as queued there.
            entry.served_started(sent.key, sent.at_ms);
            entry.served_ended(sent.key, sent.at_ms);
            entry.forget_sent_chain(sent.key, chain, sent.at_ms);
        } else {
            entry.withdraw_send(sent.key, chain, sent.at_ms);
        }
        self.failed(failure)
    }

    /// The served answer's first byte was relayed: the request no longer waits there.
    pub fn first_byte(&mut self, entry: &mut EntryState) {
        if let Some(sent) = self.served
            && !std::mem::replace(&mut self.first_byte, true)
        {
            entry.served_started(sent.key, sent.at_ms);
        }
    }

    /// The served request ended (however): its send stops counting as pending there, and
    /// the load its engine reported with the answer no longer counts it.
    pub fn ended(&mut self, entry: &mut EntryState) {
        self.first_byte(entry);
        if let Some(sent) = self.served.take() {
            // A report settled it already (settling twice would take another send of the
            // same millisecond off the ledger).
            if !sent.reported {
                entry.settle_send(sent.key, sent.at_ms);
            }
            entry.served_ended(sent.key, sent.at_ms);
        }
    }

    /// The samples every attempt of a new prefix carries (see [`super::prefix_samples`]);
    /// empty for any other request.
    pub fn prefix_samples(&self) -> &[PrefixSample] {
        &self.prefix_samples
    }

    /// Whether an attempt after the current one could still be made (an engine is left in
    /// rank, and a failure would be retried).
    pub fn has_next(&self) -> bool {
        self.next < self.targets.len() && self.retries_left > 0
    }

    /// The rank of the attempt in progress or served, for tests.
    pub fn current_rank(&self) -> Option<usize> {
        self.sent.or(self.served).map(|sent| sent.rank)
    }
}

/// The prompt tokens an engine holding `matched` of its blocks has to compute.
pub(super) fn uncached_tokens(matched: u32, request: &RouteRequest<'_>) -> u32 {
    request.uncached_tokens(matched) as u32
}

/// How many prompt tokens an engine holding `matched_here` blocks of the request may have to
/// prefill up to its first token (its own included) before it passes it on to the next in
/// rank: the entry's estimate of that work at the next, plus, when the request would leave
/// cached blocks behind, those blocks once more. Work in tokens, as both sides count it:
/// engines of one fleet prefill at about one speed, and two speeds measured at different
/// moments would not compare.
///
/// The estimate at the next, from what the entry believed of it (`estimate`): the requests
/// queued there (plus the configured slack), then what it does not hold of this prompt. The
/// queue its gauges showed is in prompt tokens when its serving node said so (it knows the
/// size of every request it handed over that has not started); where it did not, each
/// request counts as this one would be there (at least a block), which is exact for a
/// uniform load, and otherwise errs towards keeping a request where its entry sent it. That
/// queue has shrunk since the gauges were read by the work the engine could do in their age
/// (a digest is 100–300 ms old, about one long prefill), of its oldest request at most: the
/// serving side credits its own queue no more (see [`super::ServingState::tokens_ahead`]),
/// and the two must judge alike, or a burst through one entry piles onto whichever side
/// credits more. This node's sends after the gauges are not credited, and count as this one.
///
/// The cached blocks count twice because leaving them costs twice: this request computes them
/// again, and every request queued behind it at the next waits for that. A prefix is taken
/// from its cache only when the queue costs more than both; a new prefix, cached nowhere, goes
/// where it starts first.
pub fn tokens_bound(
    estimate: Estimate,
    matched_here: u32,
    request: &RouteRequest<'_>,
    config: &RouteConfig,
) -> u32 {
    let uncached = f64::from(uncached_tokens(estimate.matched, request));
    let recomputed = uncached - f64::from(uncached_tokens(matched_here, request));
    rounded(work_at(estimate, request, config) + recomputed.max(0.0))
}

fn rounded(tokens: f64) -> u32 {
    tokens.round().clamp(0.0, f64::from(u32::MAX)) as u32
}

/// The entry's estimate of the prompt tokens an engine would prefill up to this request's
/// first token, its own included: [`tokens_bound`] without the cached blocks left behind.
fn work_at(estimate: Estimate, request: &RouteRequest<'_>, config: &RouteConfig) -> f64 {
    let uncached = f64::from(uncached_tokens(estimate.matched, request));
    let slack = config.late.decline_slack.max(0.0) * each_queued(estimate, request);
    queued_work(estimate, request) + slack + uncached
}

/// The entry's estimate of the prompt tokens queued ahead of this request at an engine (see
/// [`tokens_bound`]).
fn queued_work(estimate: Estimate, request: &RouteRequest<'_>) -> f64 {
    let each = each_queued(estimate, request);
    let shown_requests = f64::from(estimate.queued.saturating_sub(estimate.pending));
    let (shown, oldest) = match estimate.queued_tokens {
        Some(tokens) => (
            f64::from(tokens),
            f64::from(tokens) / shown_requests.max(1.0),
        ),
        None => (shown_requests * each, each),
    };
    let left_of_shown = (shown - f64::from(estimate.worked_tokens).min(oldest)).max(0.0);
    left_of_shown + f64::from(estimate.pending) * each
}

/// What a queued request of unknown size counts as: this one there, at least a block.
fn each_queued(estimate: Estimate, request: &RouteRequest<'_>) -> f64 {
    let uncached = f64::from(uncached_tokens(estimate.matched, request));
    uncached.max(f64::from(request.tokens_per_block))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::tests::request;

    fn estimate(queued: u32, pending: u32, worked_tokens: u32) -> Estimate {
        Estimate {
            matched: 0,
            queued,
            pending,
            queued_tokens: None,
            worked_tokens,
            ready: crate::digest::LoraReadiness::Running,
        }
    }

    #[test]
    fn a_new_prefix_is_bounded_by_the_queue_at_the_next_then_its_own_prefill() {
        let chain: Vec<u64> = (0..8).collect();
        let config = RouteConfig::default();
        // 128 prompt tokens, none cached anywhere: two queued there, then its own.
        assert_eq!(
            tokens_bound(estimate(2, 0, 0), 0, &request(&chain), &config),
            3 * 128
        );
    }

    #[test]
    fn the_oldest_request_the_gauges_showed_shrinks_with_their_age_later_sends_do_not() {
        let chain: Vec<u64> = (0..8).collect();
        let config = RouteConfig::default();
        let request = request(&chain);
        // Two shown by the gauges, one sent since; the engine did 100 tokens' work since the
        // gauges were read.
        assert_eq!(
            tokens_bound(estimate(3, 1, 100), 0, &request, &config),
            2 * 128 - 100 + 128 + 128
        );
        // However old the gauges, the oldest request shown is all that is credited, and the
        // sends after them still count.
        assert_eq!(
            tokens_bound(estimate(3, 1, 1_000_000), 0, &request, &config),
            128 + 128 + 128
        );
    }

    #[test]
    fn a_queue_reported_in_tokens_counts_as_reported_not_as_this_request() {
        let chain: Vec<u64> = (0..8).collect();
        let config = RouteConfig::default();
        let request = request(&chain);
        // Three short questions queued there (300 tokens), one sent since: this request
        // (128 tokens) would count each of them as itself.
        let reported = Estimate {
            queued_tokens: Some(300),
            ..estimate(4, 1, 0)
        };
        assert_eq!(
            tokens_bound(reported, 0, &request, &config),
            300 + 128 + 128
        );
        // The engine's work since the gauges is credited up to the mean queued request.
        let aged = Estimate {
            worked_tokens: 1_000,
            ..reported
        };
        assert_eq!(tokens_bound(aged, 0, &request, &config), 200 + 128 + 128);
    }

    #[test]
    fn a_copy_of_a_popular_prefix_is_not_declined_for_lacking_it() {
        use crate::route::tests::{candidate, digest};
        let chain: Vec<u64> = (0..8).collect();
        let config = RouteConfig::default();
        let request = request(&chain);
        let idle = digest(0);
        let candidates = [
            candidate("copy", &idle, None),
            candidate("holder", &idle, None),
        ];
        // The decision chose an engine without the popular 6-block prefix over an idle holder.
        let decision = |popular_blocks| Decision {
            ranked: vec![0, 1],
            reason: RouteReason::LeastLoaded,
            matched_blocks: 0,
            best_matched_blocks: 6,
            new_prefix: false,
            popular_blocks,
            estimates: vec![
                estimate(0, 0, 0),
                Estimate {
                    matched: 6,
                    ..estimate(0, 0, 0)
                },
            ],
        };
        let bound = |popular_blocks| {
            Plan::new(&decision(popular_blocks), &candidates, &request, &config).targets[0]
                .decline_above_tokens
        };
        // Judged as any request, it would pass to the holder at once: 128 tokens here
        // against 32 there.
        assert_eq!(bound(0), 32);
        // As a copy, its prefix is its engine's to compute: only a queue ahead declines it.
        assert_eq!(bound(6), 128);
    }

    #[test]
    fn by_default_a_cached_request_may_be_passed_on_until_its_last_engine() {
        use crate::route::tests::{candidate, digest};
        let chain: Vec<u64> = (0..8).collect();
        let config = RouteConfig::default();
        let request = request(&chain);
        let idle = digest(0);
        let candidates = ["a", "b", "c", "d"].map(|name| candidate(name, &idle, None));
        // Every engine holds the prompt's first 6 blocks: not a new prefix.
        let held = Estimate {
            matched: 6,
            ..estimate(0, 0, 0)
        };
        let decision = Decision {
            ranked: vec![0, 1, 2, 3],
            reason: RouteReason::PrefixHit,
            matched_blocks: 6,
            best_matched_blocks: 6,
            new_prefix: false,
            popular_blocks: 0,
            estimates: vec![held; 4],
        };
        let mut plan = Plan::new(&decision, &candidates, &request, &config);
        let mut entry = crate::lifecycle::EntryState::default();
        // The next in rank was chosen on the same view as the one that declined, and may be
        // as busy: the second and third attempts may decline too, the last may not.
        for rank in 0..3 {
            let attempt = plan.next_attempt(&mut entry, &chain, 10).unwrap();
            assert_eq!(attempt.candidate, rank);
            assert_eq!(attempt.decline_above_tokens, Some(32), "attempt {rank}");
            assert_eq!(
                plan.on_outcome(&mut entry, &chain, Outcome::Declined(None), 10),
                Progress::TryNext
            );
        }
        let last = plan.next_attempt(&mut entry, &chain, 10).unwrap();
        assert_eq!((last.candidate, last.decline_above_tokens), (3, None));
        assert_eq!(plan.declines(), 3);
    }

    #[test]
    fn cached_blocks_left_behind_count_twice() {
        let chain: Vec<u64> = (0..8).collect();
        let config = RouteConfig::default();
        // Here 6 of 8 blocks are cached; the next holds none and has nothing queued.
        assert_eq!(
            tokens_bound(estimate(0, 0, 0), 6, &request(&chain), &config),
            128 + 96
        );
    }

    fn idle_mixed_digests(n: usize) -> Vec<crate::digest::LoadDigest> {
        use crate::digest::{LoadDigest, Role};
        (0..n)
            .map(|_| LoadDigest {
                role: Role::Mixed,
                ..crate::route::tests::digest(0)
            })
            .collect()
    }

    fn peer_inputs(digests: &[crate::digest::LoadDigest]) -> Vec<crate::lifecycle::PeerInput<'_>> {
        digests
            .iter()
            .enumerate()
            .map(|(i, digest)| crate::lifecycle::PeerInput {
                key: crate::route::node_key(&format!("n{i}")),
                digest,
                digest_received_ms: 0,
                summary: None,
                offload: None,
                live: None,
            })
            .collect()
    }

    /// What an engine reports with one request queued there, the one it answers.
    fn one_queued() -> LoadReport {
        LoadReport {
            digest_version: 1,
            running: 0,
            waiting: 1,
            kv_usage: 0.0,
            queued_tokens: None,
            inflight: 1,
        }
    }

    /// The plan for `chain` over `peers`, decided at 10 ms, with two retries.
    fn plan_with_two_retries(
        entry: &mut crate::lifecycle::EntryState,
        peers: &[crate::lifecycle::PeerInput<'_>],
        chain: &[u64],
    ) -> Plan {
        entry
            .route(peers, &request(chain), &RouteConfig::default(), 10)
            .unwrap()
            .with_retries(2)
    }

    #[test]
    fn after_the_first_choice_the_least_busy_engine_comes_next_whatever_its_rank() {
        use crate::lifecycle::EntryState;
        let chain: Vec<u64> = (100..108).collect();
        let mut digests = idle_mixed_digests(4);
        let peers = peer_inputs(&digests);
        let by_rank: Vec<u64> = plan_with_two_retries(&mut EntryState::default(), &peers, &chain)
            .ranked_keys()
            .collect();
        // The engine the decision ranks second (a new prefix: by rendezvous weight alone)
        // has three requests waiting; the other two are idle.
        let busy = by_rank[1];
        let busy_index = peers.iter().position(|p| p.key == busy).unwrap();
        digests[busy_index].waiting = 3;
        let peers = peer_inputs(&digests);
        let mut entry = EntryState::default();
        let mut plan = plan_with_two_retries(&mut entry, &peers, &chain);
        let order: Vec<u64> = plan.ranked_keys().collect();
        assert_eq!(order[0], by_rank[0], "the first choice stays");
        assert_eq!(
            order[1..],
            [by_rank[2], by_rank[3], busy],
            "the idle ones first, by rank"
        );
        // The first attempt is judged against an idle engine: its own prefill alone.
        let first = plan.next_attempt(&mut entry, &chain, 10).unwrap();
        assert_eq!(first.decline_above_tokens, Some(128));
        let declined = Outcome::Declined(None);
        assert_eq!(
            plan.on_outcome(&mut entry, &chain, declined, 10),
            Progress::TryNext
        );
        let second = plan.next_attempt(&mut entry, &chain, 10).unwrap();
        assert_eq!(second.node_key, by_rank[2]);
    }

    #[test]
    fn an_answer_lost_before_its_first_byte_goes_to_the_next_and_its_report_forgets_it() {
        use crate::lifecycle::EntryState;
        let digests = idle_mixed_digests(2);
        let peers = peer_inputs(&digests);
        let chain: Vec<u64> = (0..8).collect();
        let mut entry = EntryState::default();
        let mut plan = plan_with_two_retries(&mut entry, &peers, &chain);
        let first = plan.next_attempt(&mut entry, &chain, 10).unwrap();
        let served_at = peers.iter().find(|p| p.key == first.node_key).unwrap();
        let started = Outcome::Started(Some(one_queued()));
        assert_eq!(
            plan.on_outcome(&mut entry, &chain, started, 11),
            Progress::Served
        );
        assert_eq!(entry.estimate(served_at, 11).gauges.waiting, 1);
        assert_eq!(
            plan.lost_before_first_byte(&mut entry, &chain, Failure::Retryable),
            Progress::TryNext
        );
        let gauges = entry.estimate(served_at, 12).gauges;
        assert_eq!((gauges.waiting, gauges.running), (0, 0), "{gauges:?}");
        let second = plan.next_attempt(&mut entry, &chain, 12).unwrap();
        assert_ne!(second.node_key, first.node_key);
        assert_eq!(plan.failures(), 1);
        // The second is lost too, and no engine is left: the plan gives up.
        assert_eq!(
            plan.on_outcome(&mut entry, &chain, Outcome::Started(None), 13),
            Progress::Served
        );
        assert_eq!(
            plan.lost_before_first_byte(&mut entry, &chain, Failure::Retryable),
            Progress::GaveUp { timed_out: false }
        );
        assert_eq!(plan.next_attempt(&mut entry, &chain, 14), None);
    }

    #[test]
    fn an_estimate_says_how_old_its_load_is_and_where_it_came_from() {
        use crate::lifecycle::{EntryState, Source};
        let digests = idle_mixed_digests(2);
        let mut peers = peer_inputs(&digests);
        peers[0].digest_received_ms = 5;
        let chain: Vec<u64> = (0..8).collect();
        let mut entry = EntryState::default();
        let gossiped = entry.estimate(&peers[0], 40);
        assert_eq!((gossiped.source, gossiped.received_ms), (Source::Digest, 5));
        let mut plan = plan_with_two_retries(&mut entry, &peers, &chain);
        let first = plan.next_attempt(&mut entry, &chain, 10).unwrap();
        let served_at = peers.iter().find(|p| p.key == first.node_key).unwrap();
        let started = Outcome::Started(Some(one_queued()));
        plan.on_outcome(&mut entry, &chain, started, 30);
        let reported = entry.estimate(served_at, 40);
        assert_eq!(
            (reported.source, reported.received_ms),
            (Source::Report, 30)
        );
        let own = crate::lifecycle::PeerInput {
            live: Some(reported.gauges),
            ..peers[1]
        };
        let live = entry.estimate(&own, 40);
        assert_eq!((live.source, live.received_ms), (Source::Live, 40));
    }

    #[test]
    fn an_answer_ending_leaves_another_send_of_the_same_millisecond_counted() {
        use crate::lifecycle::EntryState;
        let digests = idle_mixed_digests(2);
        let peers = peer_inputs(&digests);
        let chain: Vec<u64> = (0..8).collect();
        let mut entry = EntryState::default();
        let mut first = plan_with_two_retries(&mut entry, &peers, &chain);
        let sent = first.next_attempt(&mut entry, &chain, 10).unwrap();
        let mut second = plan_with_two_retries(&mut entry, &peers, &chain);
        let copy = second.next_attempt(&mut entry, &chain, 10).unwrap();
        assert_eq!(copy.node_key, sent.node_key, "the copy follows the first");
        let there = peers.iter().find(|p| p.key == sent.node_key).unwrap();
        let started = Outcome::Started(Some(one_queued()));
        assert_eq!(
            first.on_outcome(&mut entry, &chain, started, 11),
            Progress::Served
        );
        assert_eq!(entry.estimate(there, 11).pending, 1, "the copy, on its way");
        first.ended(&mut entry);
        assert_eq!(
            entry.estimate(there, 12).pending,
            1,
            "the report settled the first send; its end takes nothing else"
        );
    }

    #[test]
    fn an_engine_that_declined_gets_the_request_back_when_every_later_one_failed() {
        use crate::lifecycle::EntryState;
        let digests = idle_mixed_digests(2);
        let peers = peer_inputs(&digests);
        let chain: Vec<u64> = (0..8).collect();
        let mut entry = EntryState::default();
        let mut plan = plan_with_two_retries(&mut entry, &peers, &chain);
        let first = plan.next_attempt(&mut entry, &chain, 10).unwrap();
        assert!(first.decline_above_tokens.is_some());
        let declined = Outcome::Declined(None);
        assert_eq!(
            plan.on_outcome(&mut entry, &chain, declined, 10),
            Progress::TryNext
        );
        let second = plan.next_attempt(&mut entry, &chain, 10).unwrap();
        assert_ne!(second.node_key, first.node_key);
        let failed = Outcome::Failed(Failure::Retryable);
        assert_eq!(
            plan.on_outcome(&mut entry, &chain, failed, 10),
            Progress::TryNext
        );
        // Busy beats gone: back to the first, which may not decline again.
        let again = plan.next_attempt(&mut entry, &chain, 10).unwrap();
        assert_eq!(again.node_key, first.node_key);
        assert_eq!(again.decline_above_tokens, None);
        assert_eq!(again.reason, RouteReason::Retry);
        assert_eq!(
            plan.on_outcome(&mut entry, &chain, failed, 10),
            Progress::GaveUp { timed_out: false }
        );
        assert_eq!(plan.next_attempt(&mut entry, &chain, 10), None);
    }
}
