//! The serving side of a request's lifecycle: this node's engine's exact queue, and whether it
//! takes a request its entry allowed it to decline.
//!
//! The node proxies every request its engine gets, so it knows what no digest can: how many it
//! handed over that have not started. A streamed answer's first byte is its first token, so a
//! streamed request without one is waiting or prefilling; a whole (non-streamed) answer says
//! nothing until it is complete, so for those the engine's own `waiting` gauge, read at the
//! last poll, counts, plus what was handed over since.
//!
//! Admission judges that queue in prefill work, not in requests: each request carries the
//! prompt tokens its entry expects this engine to compute, so a queue of three cached
//! questions and a queue of three uncached documents are told apart, and the bound it is
//! judged against is the entry's estimate of the tokens to prefill before the request's first
//! token at the next candidate. Tokens, not time: the two sides would otherwise divide by two
//! speeds measured at different moments (one engine's fresh, the other's gossiped or not yet
//! known), and an idle engine measured slower than the speed assumed of the next would
//! decline.

use super::entry::RECENT_TTL_MS;
use super::report::LoadReport;
use super::shared::{PrefixSample, shared_tokens};
use crate::route::Gauges;
use std::collections::VecDeque;

/// How long the copies of a new prefix this node declined are declined after it, so that they
/// follow it to where it went: until gossip shows every entry that engine holding it (an
/// entry's own record of a send lasts as long).
pub const FOLLOW_TTL_MS: u64 = RECENT_TTL_MS;

/// At most this many declined new prefixes are remembered (the oldest go first).
pub const FOLLOW_MAX_ENTRIES: usize = 4_096;

/// Answers begun are remembered this long, to tell which of them a poll's gauges may still
/// show ([`ServingState::polled`]): longer than a poll may take (the node's poller gives up on
/// one after at most a few seconds).
pub const STARTS_KEPT_MS: u64 = 5_000;

/// At most this many answers begun are remembered (the oldest go first).
pub const STARTS_KEPT_MAX: usize = 4_096;

/// What the serving side needs to know of a request to admit it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Admission<'a> {
    /// The key copies of the prompt's new prefix share ([`super::prefix_key`]), if the
    /// prompt has a block.
    pub prefix_key: Option<u64>,
    /// No engine held the prompt's first block at the entry's decision.
    pub new_prefix: bool,
    /// Prompt tokens the entry expects this engine to compute: the prompt less what it
    /// believed cached here.
    pub prefill_tokens: u32,
    /// Decline when more prompt tokens than this would be prefilled here up to the request's
    /// first token, its own included (`None`: never; a request's last attempt carries none).
    pub decline_above_tokens: Option<u32>,
    /// Whether the answer's first byte marks the end of the prefill (a streamed answer, or a
    /// disaggregated request's one-token prefill leg).
    pub streamed: bool,
    /// A new prefix's samples ([`super::prefix_samples`]), by which a copy's part shared with
    /// the earliest copy here is told; empty for other requests (and from an entry that sent
    /// none: a copy then counts as sharing the earliest copy's whole prompt).
    pub prefix_samples: &'a [PrefixSample],
}

/// Why a request was declined.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum DeclineReason {
    /// A new prefix, while the queue here would hold it past the entry's bound.
    NewPrefix,
    /// Any other request, while the queue here would hold it past the entry's bound (its
    /// cached part here is worth the prefill time it saves).
    Queue,
    /// A new prefix this node declined moments ago: this copy follows the first to where its
    /// entry sent it, so that one engine computes it, not two.
    Follows,
}

impl DeclineReason {
    pub const ALL: [DeclineReason; 3] = [
        DeclineReason::NewPrefix,
        DeclineReason::Queue,
        DeclineReason::Follows,
    ];

    /// Stable name for metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            DeclineReason::NewPrefix => "new-prefix",
            DeclineReason::Queue => "queue",
            DeclineReason::Follows => "follows",
        }
    }
}

/// A request handed to the engine. Give it back through [`ServingState::started`] at the
/// answer's first byte and [`ServingState::finished`] when the request ends, however it ends.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a ticket must be given back when its request ends"]
pub struct Ticket {
    streamed: bool,
    started: bool,
    /// The poll epoch it was handed over in.
    epoch: u64,
    new_prefix: Option<u64>,
    prefill_tokens: u32,
    /// Its place in the order of hand-overs.
    seq: u64,
}

/// A copy of a new prefix handed over with no first byte back.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Computing {
    prefix_key: u64,
    /// Its place in the order of hand-overs.
    seq: u64,
    covers: Covering,
}

/// A new prefix whose first byte came back here.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Computed {
    prefix_key: u64,
    covers: Covering,
    /// Until when it is remembered.
    until_ms: u64,
}

/// What a copy of a new prefix leaves in the engine's cache once its prefill is done.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Covering {
    /// The prompt tokens its entry counted it to compute, all of them cached here then (for
    /// a copy: the earlier copy's part, met, and its own, computed).
    tokens: u32,
    /// Its prompt's samples, to tell how much of it a later copy shares.
    samples: Vec<PrefixSample>,
}

impl Covering {
    /// The prompt tokens of a later copy with `samples` that this one leaves cached: the
    /// part the two share, when both came with samples; else (an entry that sent none) all
    /// it covers.
    fn of(&self, samples: &[PrefixSample]) -> u32 {
        match (self.samples.is_empty(), samples.is_empty()) {
            (false, false) => self.tokens.min(shared_tokens(&self.samples, samples)),
            _ => self.tokens,
        }
    }
}

/// The exact state of this node's engine, as far as this node's sidecar sees it.
#[derive(Clone, Debug, Default)]
pub struct ServingState {
    /// Streamed requests handed over with no first byte back: waiting or prefilling.
    streamed_unstarted: u32,
    /// The prompt tokens those still have to compute, as their entries estimated them.
    streamed_unstarted_tokens: u64,
    /// The engine's prefill speed, tokens per second (0: not known yet), to tell how far it
    /// got with the oldest queued request.
    prefill_tokens_per_s: f64,
    /// Since when the engine has been working on the oldest of those: when the last one
    /// started, or when one was handed over to an idle queue, or the last read of the
    /// engine's gauges that showed every one of them waiting.
    head_since_ms: u64,
    /// `streamed_unstarted` when the engine's gauges were last read.
    streamed_unstarted_at_poll: u32,
    /// Whole-answer requests handed over since the last poll (the poll does not show them).
    whole_since_poll: u32,
    /// Whole-answer requests handed over with no answer back.
    whole_unstarted: u32,
    /// `whole_unstarted` when the engine's gauges were last read: the poll showed each of
    /// them running or waiting.
    whole_unstarted_at_poll: u32,
    /// Of those, the ones answered since: a waiting one the poll counted waits no more.
    whole_done_since_poll: u32,
    poll_epoch: u64,
    polled: Option<Gauges>,
    /// Requests handed over and not finished.
    inflight: u32,
    /// The new prefixes handed over with no first byte back.
    new_prefixes: Vec<Computing>,
    /// Requests handed over so far (their order).
    handed_over: u64,
    /// Keys of the new prefixes declined here, with when their copies stop following
    /// them (oldest first).
    declined_new_prefixes: VecDeque<(u64, u64)>,
    /// New prefixes whose first byte came back here (oldest first): a later copy meets them
    /// in the engine's cache, while its entry, whose view does not show them yet, counted it
    /// whole.
    computed_new_prefixes: VecDeque<Computed>,
    /// When recent answers began, and whether each streams (oldest first).
    recent_starts: VecDeque<(u64, bool)>,
    digest_version: u64,
}

impl ServingState {
    pub fn new() -> Self {
        Self::default()
    }

    /// The engine's gauges, asked for at `asked_ms`, were just read. The engine read them at
    /// some moment between the two, so an answer begun after `asked_ms` may be counted in
    /// them as waiting or not. It is taken as still unstarted at the read: the requests the
    /// gauges show beyond this node's are then never overcounted, only at worst undercounted
    /// until the next poll. (Overcounted, a request answered long ago would hold the queue
    /// over its bound and decline the next copy of a new prefix.)
    pub fn polled(&mut self, gauges: Gauges, asked_ms: u64) {
        let (mut streamed_begun, mut whole_begun) = (0, 0);
        let recent = self.recent_starts.iter().rev();
        for &(_, streamed) in recent.take_while(|&&(at_ms, _)| at_ms > asked_ms) {
            match streamed {
                true => streamed_begun += 1,
                false => whole_begun += 1,
            }
        }
        self.polled = Some(gauges);
        self.streamed_unstarted_at_poll = self.streamed_unstarted + streamed_begun;
        self.whole_since_poll = 0;
        self.whole_unstarted_at_poll = self.whole_unstarted + whole_begun;
        self.whole_done_since_poll = whole_begun;
        self.poll_epoch += 1;
        // The engine showed every request this node handed it unstarted as waiting: it had
        // begun none of them, not even the oldest (an engine out of KV blocks holds them all
        // back until a running request ends). Nothing of the oldest was computed before the
        // read, whatever the time since it became the oldest.
        let ours_unstarted = self.streamed_unstarted_at_poll + self.whole_unstarted_at_poll;
        if self.streamed_unstarted_at_poll > 0 && gauges.waiting >= ours_unstarted {
            self.head_since_ms = self.head_since_ms.max(asked_ms);
        }
    }

    /// The engine's prefill speed, as measured (ignored unless positive and finite).
    pub fn set_prefill_speed(&mut self, tokens_per_s: f64) {
        if tokens_per_s.is_finite() && tokens_per_s > 0.0 {
            self.prefill_tokens_per_s = tokens_per_s;
        }
    }

    /// The prompt tokens the engine would prefill up to the first token of a request that
    /// must compute `prefill_tokens`, if handed over at `now_ms`: everything queued ahead, less
    /// what the engine has done of the oldest since it began it (at its measured speed, while
    /// known), then the request's own. The queued requests whose size this node does not know
    /// (whole answers, the engine's other clients) count as the mean of those it knows, or as
    /// this one.
    pub fn tokens_ahead(&self, prefill_tokens: u32, now_ms: u64) -> f64 {
        let known = f64::from(self.streamed_unstarted);
        let unknown = f64::from(self.queued().saturating_sub(self.streamed_unstarted));
        let known_tokens = self.streamed_unstarted_tokens as f64;
        let mean = match self.streamed_unstarted {
            0 => f64::from(prefill_tokens),
            _ => known_tokens / known,
        };
        // Done of the oldest: the engine's speed since it began it, at most its (mean) size.
        let elapsed_s = now_ms.saturating_sub(self.head_since_ms) as f64 / 1000.0;
        let done = match self.streamed_unstarted {
            0 => 0.0,
            _ => (elapsed_s * self.prefill_tokens_per_s).min(mean),
        };
        (known_tokens + unknown * mean - done).max(0.0) + f64::from(prefill_tokens)
    }

    /// This node built a digest of this version (reports name the latest).
    pub fn set_digest_version(&mut self, version: u64) {
        self.digest_version = version;
    }

    /// Requests queued ahead of a new one: streamed ones not started, plus what the engine's
    /// `waiting` gauge showed beyond the streamed ones at the last poll (whole answers, other
    /// clients) less the whole answers it showed waiting that were answered since, plus whole
    /// answers handed over since. Which whole answers the poll showed waiting is not known:
    /// the engine runs them in order, so the earliest are taken for the running ones, and
    /// only answers beyond those count as ones that waited.
    pub fn queued(&self) -> u32 {
        let waiting = self.polled.map_or(0, |g| g.waiting);
        let beyond_streamed = waiting.saturating_sub(self.streamed_unstarted_at_poll);
        let whole_waiting = self.whole_unstarted_at_poll.min(beyond_streamed);
        let whole_running = self.whole_unstarted_at_poll - whole_waiting;
        let waited_done = self.whole_done_since_poll.saturating_sub(whole_running);
        self.streamed_unstarted
            .saturating_add(beyond_streamed.saturating_sub(waited_done))
            .saturating_add(self.whole_since_poll)
    }

    /// Requests handed over and not finished.
    pub fn inflight(&self) -> u32 {
        self.inflight
    }

    /// New prefixes being computed (handed over, no first byte back).
    pub fn new_prefixes_in_flight(&self) -> usize {
        self.new_prefixes.len()
    }

    /// `prefix_key`, if a new prefix of that key is being computed here.
    fn computing(&self, prefix_key: Option<u64>) -> Option<u64> {
        prefix_key.filter(|&key| self.new_prefixes.iter().any(|c| c.prefix_key == key))
    }

    /// The prompt tokens of a copy with `samples` that the earliest copy of the new prefix
    /// `key` still prefilling here will have cached.
    fn covered_by_earliest(&self, key: u64, samples: &[PrefixSample]) -> u32 {
        self.new_prefixes
            .iter()
            .filter(|c| c.prefix_key == key)
            .min_by_key(|c| c.seq)
            .map_or(0, |c| c.covers.of(samples))
    }

    /// The prompt tokens the engine would prefill before a new request's own at `now_ms`, as
    /// [`Self::tokens_ahead`] counts them, so that entries judge this queue by the sizes in
    /// it rather than each request as their own; `None` while the only requests queued are
    /// ones whose size this node does not know (nothing to count them as).
    pub fn queued_tokens(&self, now_ms: u64) -> Option<u32> {
        if self.streamed_unstarted == 0 && self.queued() > 0 {
            return None;
        }
        let tokens = self.tokens_ahead(0, now_ms).round();
        Some(tokens.clamp(0.0, f64::from(u32::MAX)) as u32)
    }

    /// The engine's gauges at `now_ms`: the poll's, with this node's exact queue.
    pub fn gauges(&self, now_ms: u64) -> Gauges {
        let polled = self.polled.unwrap_or(Gauges {
            running: 0,
            waiting: 0,
            kv_usage: 0.0,
            queued_tokens: None,
        });
        let queued = self.queued();
        Gauges {
            running: polled.running.max(self.inflight.saturating_sub(queued)),
            waiting: queued,
            kv_usage: polled.kv_usage.clamp(0.0, 1.0),
            queued_tokens: self.queued_tokens(now_ms),
        }
    }

    /// What an answer or a decline at `now_ms` tells its entry.
    pub fn report(&self, now_ms: u64) -> LoadReport {
        let gauges = self.gauges(now_ms);
        LoadReport {
            digest_version: self.digest_version,
            running: gauges.running,
            waiting: gauges.waiting,
            kv_usage: gauges.kv_usage,
            queued_tokens: gauges.queued_tokens,
            inflight: self.inflight,
        }
    }

    /// Hands a request to the engine, or declines it: only when its entry allowed that and
    /// the queue here would hold it past the entry's bound. A request whose prefix this
    /// engine is computing as a new prefix (a copy) meets those blocks here once the earlier
    /// copy computed them, and anywhere else would compute them again: its own work here is
    /// only what its prompt has beyond the earlier copy's (its entry, which saw the prefix
    /// nowhere, counted it whole), so every entry sending a new prefix at once lands on one
    /// engine unless the queue ahead of the earlier copy is itself longer than the whole
    /// prompt elsewhere. A new prefix declined here is declined again for [`FOLLOW_TTL_MS`],
    /// whatever the queue, so that its copies follow the first to the engine its entry tries
    /// next: the least busy of the rest in that entry's view, which entries that exchange with
    /// the same engines mostly share.
    ///
    /// An engine with nothing in flight and nothing waiting keeps any request it is offered
    /// (but a follower of a declined new prefix): it starts the request at once, while what
    /// the next engine would save is the entry's view of it, up to 600 ms old, and a decline
    /// for a few blocks more cached there leaves the one engine that holds nothing without
    /// work for as long as every prompt meets something elsewhere
    /// (`docs/studies/late-binding.md`).
    pub fn admit(&mut self, request: &Admission, now_ms: u64) -> Result<Ticket, DeclineReason> {
        forget_until(&mut self.declined_new_prefixes, now_ms, |&(_, until)| until);
        forget_until(&mut self.computed_new_prefixes, now_ms, |c| c.until_ms);
        let new_prefix = request.prefix_key.filter(|_| request.new_prefix);
        let joins = self.computing(request.prefix_key);
        let samples = request.prefix_samples;
        let computed = new_prefix.and_then(|key| {
            let mut here = self.computed_new_prefixes.iter().rev();
            here.find(|c| c.prefix_key == key)
                .map(|c| c.covers.of(samples))
        });
        let covers_tokens = request.prefill_tokens;
        let prefill_tokens = match (joins, computed) {
            (Some(key), _) => covers_tokens.saturating_sub(self.covered_by_earliest(key, samples)),
            (None, Some(covered)) => covers_tokens.saturating_sub(covered),
            (None, None) => covers_tokens,
        };
        let met_here = joins.is_some() || computed.is_some();
        let request = &Admission {
            prefill_tokens,
            ..*request
        };
        if let Some(bound) = request.decline_above_tokens {
            let declined_before = new_prefix
                .is_some_and(|key| self.declined_new_prefixes.iter().any(|&(b, _)| b == key));
            if declined_before && !met_here {
                return Err(DeclineReason::Follows);
            }
            let idle = self.inflight == 0 && self.queued() == 0;
            let over = self.tokens_ahead(request.prefill_tokens, now_ms) > f64::from(bound);
            if over && !idle {
                // A copy is not recorded: its later copies still meet the prefix here.
                let Some(key) = new_prefix.filter(|_| !met_here) else {
                    return Err(match new_prefix {
                        Some(_) => DeclineReason::NewPrefix,
                        None => DeclineReason::Queue,
                    });
                };
                remember(
                    &mut self.declined_new_prefixes,
                    (key, now_ms.saturating_add(FOLLOW_TTL_MS)),
                    FOLLOW_MAX_ENTRIES,
                );
                return Err(DeclineReason::NewPrefix);
            }
        }
        self.inflight += 1;
        if request.streamed {
            if self.streamed_unstarted == 0 {
                self.head_since_ms = now_ms;
            }
            self.streamed_unstarted += 1;
            self.streamed_unstarted_tokens += u64::from(request.prefill_tokens);
        } else {
            self.whole_since_poll += 1;
            self.whole_unstarted += 1;
        }
        self.handed_over += 1;
        let seq = self.handed_over;
        if let Some(key) = new_prefix {
            self.new_prefixes.push(Computing {
                prefix_key: key,
                seq,
                covers: Covering {
                    tokens: covers_tokens,
                    samples: samples.to_vec(),
                },
            });
        }
        Ok(Ticket {
            streamed: request.streamed,
            started: false,
            epoch: self.poll_epoch,
            new_prefix,
            prefill_tokens: request.prefill_tokens,
            seq,
        })
    }

    /// The answer's first byte came back at `now_ms` (for a streamed answer, the first token).
    pub fn started(&mut self, ticket: &mut Ticket, now_ms: u64) {
        if std::mem::replace(&mut ticket.started, true) {
            return;
        }
        forget_until(&mut self.recent_starts, now_ms, |&(at_ms, _)| {
            at_ms.saturating_add(STARTS_KEPT_MS)
        });
        remember(
            &mut self.recent_starts,
            (now_ms, ticket.streamed),
            STARTS_KEPT_MAX,
        );
        if ticket.streamed {
            self.streamed_unstarted = self.streamed_unstarted.saturating_sub(1);
            self.head_since_ms = now_ms;
            self.streamed_unstarted_tokens = self
                .streamed_unstarted_tokens
                .saturating_sub(u64::from(ticket.prefill_tokens));
        } else {
            self.whole_unstarted = self.whole_unstarted.saturating_sub(1);
            if ticket.epoch == self.poll_epoch {
                self.whole_since_poll = self.whole_since_poll.saturating_sub(1);
            } else {
                self.whole_done_since_poll += 1;
            }
        }
        if ticket.new_prefix.is_some()
            && let Some(i) = self.new_prefixes.iter().position(|c| c.seq == ticket.seq)
        {
            let computed = self.new_prefixes.swap_remove(i);
            remember(
                &mut self.computed_new_prefixes,
                Computed {
                    prefix_key: computed.prefix_key,
                    covers: computed.covers,
                    until_ms: now_ms.saturating_add(FOLLOW_TTL_MS),
                },
                FOLLOW_MAX_ENTRIES,
            );
        }
    }

    /// The request ended at `now_ms` (answered, failed, or abandoned by its client).
    pub fn finished(&mut self, mut ticket: Ticket, now_ms: u64) {
        self.started(&mut ticket, now_ms);
        self.inflight = self.inflight.saturating_sub(1);
    }
}

/// Drops the entries of `memory` (oldest first) whose `until` has passed at `now_ms`.
fn forget_until<T>(memory: &mut VecDeque<T>, now_ms: u64, until: impl Fn(&T) -> u64) {
    while memory.front().is_some_and(|entry| until(entry) <= now_ms) {
        memory.pop_front();
    }
}

/// Appends `entry` to `memory`, forgetting the oldest beyond `max` entries.
fn remember<T>(memory: &mut VecDeque<T>, entry: T, max: usize) {
    if memory.len() >= max {
        memory.pop_front();
    }
    memory.push_back(entry);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::{ChainSeed, chain_from_tokens};
    use crate::lifecycle::prefix_samples;

    /// A streamed request of 1,000 uncached tokens.
    fn streamed(new_prefix: Option<u64>, decline_above_tokens: Option<u32>) -> Admission<'static> {
        Admission {
            prefix_key: new_prefix,
            new_prefix: new_prefix.is_some(),
            prefill_tokens: 1_000,
            decline_above_tokens,
            streamed: true,
            prefix_samples: &[],
        }
    }

    /// The same request, answered whole (not streamed).
    fn whole(new_prefix: Option<u64>) -> Admission<'static> {
        Admission {
            streamed: false,
            ..streamed(new_prefix, None)
        }
    }

    /// A serving side whose engine prefills 1,000 tokens a second (1 ms a token).
    fn serving() -> ServingState {
        let mut serving = ServingState::new();
        serving.set_prefill_speed(1_000.0);
        serving
    }

    fn gauges(running: u32, waiting: u32) -> Gauges {
        Gauges {
            running,
            waiting,
            kv_usage: 0.25,
            queued_tokens: None,
        }
    }

    #[test]
    fn the_queue_counts_streamed_requests_until_their_first_byte() {
        let mut serving = ServingState::new();
        let mut a = serving.admit(&streamed(None, None), 0).unwrap();
        let b = serving.admit(&streamed(None, None), 0).unwrap();
        assert_eq!((serving.queued(), serving.inflight()), (2, 2));
        serving.started(&mut a, 0);
        serving.started(&mut a, 0);
        assert_eq!((serving.queued(), serving.inflight()), (1, 2));
        serving.finished(a, 0);
        serving.finished(b, 0);
        assert_eq!((serving.queued(), serving.inflight()), (0, 0));
    }

    #[test]
    fn whole_answers_count_through_the_polled_waiting_gauge() {
        let mut serving = ServingState::new();
        let whole = Admission {
            prefill_tokens: 100,
            ..whole(None)
        };
        let first = serving.admit(&whole, 0).unwrap();
        let second = serving.admit(&whole, 0).unwrap();
        assert_eq!(serving.queued(), 2, "handed over since the last poll");
        // The engine runs one and queues the other; a streamed request waits too.
        let mut third = serving.admit(&streamed(None, None), 0).unwrap();
        serving.polled(gauges(1, 2), 0);
        assert_eq!(
            serving.queued(),
            2,
            "1 streamed + (2 waiting - 1 streamed at the poll)"
        );
        serving.started(&mut third, 0);
        assert_eq!(serving.queued(), 1, "the whole answer the poll saw waiting");
        serving.finished(first, 0);
        assert_eq!(
            serving.queued(),
            1,
            "the first answer taken for the one that ran"
        );
        serving.finished(second, 0);
        assert_eq!(serving.queued(), 0, "the second waited, and waits no more");
        serving.finished(third, 0);
        assert_eq!(serving.inflight(), 0);
        // Another client's request the poll saw waiting counts until the next poll.
        let mut fourth = serving.admit(&whole, 10).unwrap();
        serving.polled(gauges(1, 1), 10);
        serving.started(&mut fourth, 20);
        assert_eq!(
            serving.queued(),
            0,
            "taken for the one the poll saw waiting"
        );
        serving.finished(fourth, 20);
        serving.polled(gauges(0, 1), 30);
        assert_eq!(serving.queued(), 1, "someone else's, waiting");
        serving.polled(gauges(0, 0), 40);
        assert_eq!(serving.queued(), 0);
    }

    #[test]
    fn an_answer_begun_while_the_gauges_were_read_is_not_counted_waiting_after() {
        let mut serving = ServingState::new();
        let mut tickets = [
            serving.admit(&whole(None), 0).unwrap(),
            serving.admit(&streamed(None, None), 0).unwrap(),
        ];
        // Asked at 10; both answers begin at 12; the engine read its gauges at 11, with both
        // still waiting; the gauges arrive at 15.
        for ticket in &mut tickets {
            serving.started(ticket, 12);
        }
        serving.polled(gauges(0, 2), 10);
        assert_eq!(serving.queued(), 0, "both begun since the poll was asked");
        // An answer begun before the poll was asked is not one the gauges may show waiting:
        // what they show waiting is someone else's.
        serving.polled(gauges(0, 1), 20);
        assert_eq!(serving.queued(), 1, "another client's request");
        for ticket in tickets {
            serving.finished(ticket, 30);
        }
    }

    #[test]
    fn a_request_is_declined_only_over_its_bound_and_only_when_allowed() {
        let mut serving = serving();
        let held = serving.admit(&streamed(Some(1), Some(1_000)), 0).unwrap();
        assert_eq!(
            serving.admit(&streamed(Some(2), Some(1_000)), 0),
            Err(DeclineReason::NewPrefix),
            "2,000 tokens up to its first token"
        );
        assert_eq!(
            serving.admit(&streamed(None, Some(1_000)), 0),
            Err(DeclineReason::Queue)
        );
        let under = serving.admit(&streamed(None, Some(2_000)), 0).unwrap();
        let last = serving.admit(&streamed(Some(3), None), 0).unwrap();
        assert_eq!(
            serving.admit(&streamed(Some(1), Some(1_000)), 0),
            Err(DeclineReason::NewPrefix),
            "a copy of a prefix computed here, behind 3,000 tokens: the whole prompt elsewhere \
             is less"
        );
        let joins = serving
            .admit(&streamed(Some(1), Some(3_000)), 0)
            .expect("the same new prefix joins the engine computing it");
        let seen_as_held = Admission {
            new_prefix: false,
            ..streamed(Some(1), Some(3_000))
        };
        let follows = serving
            .admit(&seen_as_held, 0)
            .expect("a request the entry saw as held joins it too");
        assert_eq!(serving.new_prefixes_in_flight(), 3);
        for ticket in [held, under, last, joins, follows] {
            serving.finished(ticket, 0);
        }
        assert_eq!(serving.new_prefixes_in_flight(), 0);
        assert_eq!(serving.queued(), 0);
    }

    #[test]
    fn an_idle_engine_keeps_the_request_it_is_offered() {
        let mut serving = serving();
        // 1,000 tokens to compute here, 968 at the next engine, which holds two blocks more.
        let kept = serving
            .admit(&streamed(None, Some(968)), 0)
            .expect("nothing in flight here: the request starts at once");
        assert_eq!(
            serving.admit(&streamed(None, Some(968)), 1),
            Err(DeclineReason::Queue),
            "behind the first"
        );
        serving.finished(kept, 2);
        serving.polled(gauges(0, 1), 3);
        assert_eq!(
            serving.admit(&streamed(None, Some(968)), 3),
            Err(DeclineReason::Queue),
            "another client's request waiting at the engine"
        );
        serving.polled(gauges(0, 0), 4);
        let again = serving
            .admit(&streamed(None, Some(968)), 4)
            .expect("idle again");
        serving.finished(again, 5);
        assert_eq!(serving.inflight(), 0);
    }

    #[test]
    fn a_copy_arriving_after_the_first_was_answered_meets_it_in_the_cache() {
        let mut serving = serving();
        let mut first = serving.admit(&streamed(Some(1), None), 0).unwrap();
        serving.started(&mut first, 10);
        // Something else queued here: a whole prompt behind it is over a bound of just under
        // one prompt, but the copy's own work is what its prompt has beyond the first's.
        let other = serving.admit(&streamed(None, None), 10).unwrap();
        assert_eq!(
            serving.admit(&streamed(Some(2), Some(999)), 20),
            Err(DeclineReason::NewPrefix),
            "another new prefix is over the bound"
        );
        let copy = serving
            .admit(&streamed(Some(1), Some(999)), 20)
            .expect("the copy meets the first's blocks here");
        serving.finished(copy, 20);
        // Remembered as long as its entries' views take to show it held.
        let later = 20 + FOLLOW_TTL_MS;
        assert_eq!(
            serving.admit(&streamed(Some(1), Some(999)), later),
            Err(DeclineReason::NewPrefix)
        );
        serving.finished(first, later);
        serving.finished(other, later);
    }

    #[test]
    fn a_copy_of_a_new_prefix_adds_only_what_its_prompt_has_beyond_the_earlier_copy() {
        let mut serving = serving();
        let first = serving.admit(&streamed(Some(1), None), 0).unwrap();
        let longer = |decline_above_tokens| Admission {
            prefill_tokens: 1_200,
            ..streamed(Some(1), decline_above_tokens)
        };
        let copy = serving
            .admit(&longer(Some(1_200)), 0)
            .expect("1,000 tokens of the earlier copy, then 200 of its own");
        assert_eq!(serving.tokens_ahead(0, 0), 1_200.0);
        assert_eq!(
            serving.admit(&longer(Some(1_300)), 0),
            Err(DeclineReason::NewPrefix),
            "behind both: 1,400 tokens"
        );
        assert!(
            !serving.declined_new_prefixes.iter().any(|&(b, _)| b == 1),
            "a copy declined is not followed: its prefix is computed here"
        );
        for ticket in [first, copy] {
            serving.finished(ticket, 0);
        }
    }

    #[test]
    fn copies_count_what_they_do_not_share_with_the_earliest() {
        // A 768-token system prompt, then a 256-token question of each copy's own: 1,024
        // tokens each, 1,000 of them counted uncached by each entry's decision.
        let system: Vec<u32> = (0..768).collect();
        let samples_of = |question: u32| {
            let tokens: Vec<u32> = system
                .iter()
                .copied()
                .chain(question..question + 256)
                .collect();
            let chain = chain_from_tokens(ChainSeed::new("m", None), &tokens, 16);
            prefix_samples(&chain, 16.0)
        };
        let copy = |samples, decline_above_tokens| Admission {
            prefix_samples: samples,
            ..streamed(Some(1), decline_above_tokens)
        };
        let mut serving = serving();
        let first_samples = samples_of(10_000);
        let mut first = serving.admit(&copy(&first_samples, None), 0).unwrap();
        let second_samples = samples_of(20_000);
        let second = serving
            .admit(&copy(&second_samples, Some(2_000)), 0)
            .expect("1,000 tokens ahead, then its own 232");
        assert_eq!(
            serving.tokens_ahead(0, 0),
            1_232.0,
            "the shared 768 are the first's"
        );
        // The same prompt again shares it whole.
        let again = serving
            .admit(&copy(&first_samples, Some(2_000)), 0)
            .unwrap();
        assert_eq!(serving.tokens_ahead(0, 0), 1_232.0);
        // Copies queue by their own parts until the bound: each one's 232 counts.
        let third_samples = samples_of(30_000);
        assert_eq!(
            serving.admit(&copy(&third_samples, Some(1_400)), 0),
            Err(DeclineReason::NewPrefix),
            "1,232 ahead and 232 of its own"
        );
        // Once the first has its first token, a later copy meets the system prompt cached.
        serving.started(&mut first, 10);
        serving.finished(first, 20);
        serving.finished(second, 20);
        serving.finished(again, 20);
        let late = serving
            .admit(&copy(&third_samples, Some(2_000)), 30)
            .unwrap();
        assert_eq!(serving.tokens_ahead(0, 30), 232.0);
        // Without samples (an entry that sent none) a copy counts the earlier one's whole.
        let unsampled = serving.admit(&copy(&[], Some(2_000)), 30).unwrap();
        assert_eq!(serving.tokens_ahead(0, 30), 232.0);
        for ticket in [late, unsampled] {
            serving.finished(ticket, 40);
        }
    }

    #[test]
    fn the_queue_is_judged_in_prefill_tokens_not_in_requests() {
        let mut serving = serving();
        let question = |decline_above_tokens| Admission {
            prefill_tokens: 100,
            ..streamed(None, decline_above_tokens)
        };
        let cached: Vec<_> = (0..3)
            .map(|_| serving.admit(&question(None), 0).unwrap())
            .collect();
        assert_eq!(serving.tokens_ahead(100, 0), 400.0);
        let fourth = serving
            .admit(&question(Some(500)), 0)
            .expect("three cached questions ahead: 400 tokens");
        let document = serving.admit(&streamed(Some(7), None), 0).unwrap();
        assert_eq!(
            serving.admit(&question(Some(500)), 0),
            Err(DeclineReason::Queue),
            "an uncached document ahead: 1,500 tokens"
        );
        for ticket in cached.into_iter().chain([fourth, document]) {
            serving.finished(ticket, 0);
        }
        assert_eq!(serving.tokens_ahead(100, 0), 100.0);
    }

    #[test]
    fn the_oldest_queued_request_is_credited_with_what_the_engine_did_of_it() {
        let mut serving = serving();
        let mut first = serving.admit(&streamed(Some(1), None), 1_000).unwrap();
        let second = serving.admit(&streamed(Some(2), None), 1_100).unwrap();
        assert_eq!(serving.tokens_ahead(0, 1_000), 2_000.0);
        assert_eq!(
            serving.tokens_ahead(0, 1_400),
            1_600.0,
            "400 ms at 1,000 tokens/s"
        );
        assert_eq!(
            serving.tokens_ahead(0, 9_000),
            1_000.0,
            "at most the oldest's size"
        );
        serving.started(&mut first, 1_500);
        assert_eq!(
            serving.tokens_ahead(0, 1_500),
            1_000.0,
            "the next starts now"
        );
        assert_eq!(serving.tokens_ahead(0, 1_750), 750.0);
        serving.finished(first, 2_000);
        serving.finished(second, 2_000);
    }

    #[test]
    fn an_oldest_request_the_engine_shows_waiting_is_credited_only_from_the_read() {
        let mut blocked = serving();
        let first = blocked.admit(&streamed(Some(1), None), 1_000).unwrap();
        let second = blocked.admit(&streamed(Some(2), None), 1_000).unwrap();
        // Two running requests hold the engine's KV blocks: both of this node's wait.
        blocked.polled(gauges(2, 2), 1_400);
        assert_eq!(
            blocked.tokens_ahead(0, 1_400),
            2_000.0,
            "nothing of the oldest computed by the read"
        );
        assert_eq!(blocked.tokens_ahead(0, 1_600), 1_800.0, "200 ms since it");
        // A read that shows one of them begun leaves the time since it became the oldest.
        let mut prefilling = serving();
        let third = prefilling.admit(&streamed(Some(1), None), 1_000).unwrap();
        let fourth = prefilling.admit(&streamed(Some(2), None), 1_000).unwrap();
        prefilling.polled(gauges(1, 1), 1_400);
        assert_eq!(prefilling.tokens_ahead(0, 1_400), 1_600.0);
        blocked.finished(first, 2_000);
        blocked.finished(second, 2_000);
        prefilling.finished(third, 2_000);
        prefilling.finished(fourth, 2_000);
    }

    #[test]
    fn the_copies_of_a_declined_new_prefix_follow_it_until_gossip_can_show_where_it_went() {
        let mut serving = serving();
        let busy = serving.admit(&streamed(Some(1), None), 0).unwrap();
        assert_eq!(
            serving.admit(&streamed(Some(2), Some(1_000)), 10),
            Err(DeclineReason::NewPrefix)
        );
        serving.finished(busy, 0);
        assert_eq!(serving.queued(), 0);
        assert_eq!(
            serving.admit(&streamed(Some(2), Some(5_000)), 20),
            Err(DeclineReason::Follows),
            "the queue is short now, but the first copy went elsewhere"
        );
        let other = serving
            .admit(&streamed(Some(3), Some(1_000)), 20)
            .expect("another new prefix is judged on the queue");
        let last = serving
            .admit(&streamed(Some(2), None), 30)
            .expect("a last attempt is never declined");
        for ticket in [other, last] {
            serving.finished(ticket, 0);
        }
        let later = serving
            .admit(&streamed(Some(2), Some(1_000)), 10 + FOLLOW_TTL_MS)
            .expect("once gossip can show where it went, copies are judged on the queue again");
        serving.finished(later, 0);
    }

    #[test]
    fn the_queue_is_reported_in_the_prompt_tokens_of_the_requests_in_it() {
        let mut serving = serving();
        assert_eq!(serving.queued_tokens(0), Some(0), "nothing queued");
        let unknown = serving.admit(&whole(None), 0).unwrap();
        serving.polled(gauges(0, 1), 0);
        assert_eq!(
            serving.queued_tokens(0),
            None,
            "a whole answer's size is not known once the engine has it"
        );
        let short = Admission {
            prefill_tokens: 200,
            ..streamed(None, None)
        };
        let known = serving.admit(&short, 0).unwrap();
        assert_eq!(
            serving.queued_tokens(0),
            Some(400),
            "the known one, and the unknown one counted as it"
        );
        // 100 ms at 1,000 tokens/s: 100 tokens of the oldest done.
        assert_eq!(serving.queued_tokens(100), Some(300));
        assert_eq!(serving.report(100).queued_tokens, Some(300));
        assert_eq!(serving.gauges(100).queued_tokens, Some(300));
        for ticket in [unknown, known] {
            serving.finished(ticket, 100);
        }
    }

    #[test]
    fn reports_carry_the_exact_queue_and_the_digest_version() {
        let mut serving = ServingState::new();
        serving.polled(gauges(4, 0), 0);
        serving.set_digest_version(9);
        let ticket = serving.admit(&streamed(None, None), 0).unwrap();
        let report = serving.report(0);
        assert_eq!(
            (
                report.digest_version,
                report.running,
                report.waiting,
                report.inflight
            ),
            (9, 4, 1, 1)
        );
        serving.finished(ticket, 0);
    }
}
