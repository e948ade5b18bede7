//! The serving side of a request's lifecycle: this node's engine's exact queue, and whether it
//! takes a request its entry allowed it to decline.
//!
//! The node proxies every request its engine gets, so it knows what no digest can: how many it
//! handed over that have not started. A streamed answer's first byte is its first token, so a
//! streamed request without one is waiting or prefilling; a whole (non-streamed) answer says
//! nothing until it is complete, so for those the engine's own `waiting` gauge, read at the
//! last poll, counts, plus what was handed over since.

use super::report::LoadReport;
use crate::route::Gauges;

/// What the serving side needs to know of a request to admit it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    /// The prompt's first block, if it has one.
    pub first_block: Option<u64>,
    /// No engine held the prompt's first block at the entry's decision.
    pub new_prefix: bool,
    /// Decline when more than this many requests are queued here (`None`: never; a request's
    /// last attempt carries none).
    pub decline_above: Option<u32>,
    /// Whether the answer streams (its first byte then marks the end of the prefill).
    pub streamed: bool,
}

/// Why a request was declined.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum DeclineReason {
    /// A new prefix, while the queue here was over the entry's bound.
    NewPrefix,
    /// Any other request, while the queue here was over the entry's bound (which includes
    /// what the prompt's cached part here is worth).
    Queue,
}

impl DeclineReason {
    pub const ALL: [DeclineReason; 2] = [DeclineReason::NewPrefix, DeclineReason::Queue];

    /// Stable name for metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            DeclineReason::NewPrefix => "new-prefix",
            DeclineReason::Queue => "queue",
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
}

/// The exact state of this node's engine, as far as this node's sidecar sees it.
#[derive(Clone, Debug, Default)]
pub struct ServingState {
    /// Streamed requests handed over with no first byte back: waiting or prefilling.
    streamed_unstarted: u32,
    /// `streamed_unstarted` when the engine's gauges were last read.
    streamed_unstarted_at_poll: u32,
    /// Whole-answer requests handed over since the last poll (the poll does not show them).
    whole_since_poll: u32,
    poll_epoch: u64,
    polled: Option<Gauges>,
    /// Requests handed over and not finished.
    inflight: u32,
    /// First blocks of the new prefixes handed over with no first byte back (a multiset).
    new_prefixes: Vec<u64>,
    digest_version: u64,
}

impl ServingState {
    pub fn new() -> Self {
        Self::default()
    }

    /// The engine's gauges were just read.
    pub fn polled(&mut self, gauges: Gauges) {
        self.polled = Some(gauges);
        self.streamed_unstarted_at_poll = self.streamed_unstarted;
        self.whole_since_poll = 0;
        self.poll_epoch += 1;
    }

    /// This node built a digest of this version (reports name the latest).
    pub fn set_digest_version(&mut self, version: u64) {
        self.digest_version = version;
    }

    /// Requests queued ahead of a new one: streamed ones not started, plus what the engine's
    /// `waiting` gauge showed beyond the streamed ones at the last poll (whole answers, other
    /// clients), plus whole answers handed over since.
    pub fn queued(&self) -> u32 {
        let waiting = self.polled.map_or(0, |g| g.waiting);
        self.streamed_unstarted
            .saturating_add(waiting.saturating_sub(self.streamed_unstarted_at_poll))
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

    /// The engine's gauges now: the poll's, with this node's exact queue.
    pub fn gauges(&self) -> Gauges {
        let polled = self.polled.unwrap_or(Gauges {
            running: 0,
            waiting: 0,
            kv_usage: 0.0,
        });
        let queued = self.queued();
        Gauges {
            running: polled.running.max(self.inflight.saturating_sub(queued)),
            waiting: queued,
            kv_usage: polled.kv_usage.clamp(0.0, 1.0),
        }
    }

    /// What an answer or a decline tells its entry.
    pub fn report(&self) -> LoadReport {
        let gauges = self.gauges();
        LoadReport {
            digest_version: self.digest_version,
            running: gauges.running,
            waiting: gauges.waiting,
            kv_usage: gauges.kv_usage,
            inflight: self.inflight,
        }
    }

    /// Hands a request to the engine, or declines it: only when its entry allowed that and
    /// this engine's queue is over the entry's bound. A request whose prefix this engine is
    /// computing as a new prefix is never declined: here it meets those blocks as they are
    /// computed, anywhere else it would compute them again, and every entry sending a new
    /// prefix at once must land on one engine.
    pub fn admit(&mut self, request: &Admission) -> Result<Ticket, DeclineReason> {
        if let Some(bound) = request.decline_above {
            let joins = request
                .first_block
                .is_some_and(|block| self.new_prefixes.contains(&block));
            if !joins && self.queued() > bound {
                return Err(match request.new_prefix {
                    true => DeclineReason::NewPrefix,
                    false => DeclineReason::Queue,
                });
            }
        }
        let new_prefix = request.first_block.filter(|_| request.new_prefix);
        self.inflight += 1;
        if request.streamed {
            self.streamed_unstarted += 1;
        } else {
            self.whole_since_poll += 1;
        }
        if let Some(block) = new_prefix {
            self.new_prefixes.push(block);
        }
        Ok(Ticket {
            streamed: request.streamed,
            started: false,
            epoch: self.poll_epoch,
            new_prefix,
        })
    }

    /// The answer's first byte came back (for a streamed answer, the first token).
    pub fn started(&mut self, ticket: &mut Ticket) {
        if std::mem::replace(&mut ticket.started, true) {
            return;
        }
        if ticket.streamed {
            self.streamed_unstarted = self.streamed_unstarted.saturating_sub(1);
        } else if ticket.epoch == self.poll_epoch {
            self.whole_since_poll = self.whole_since_poll.saturating_sub(1);
        }
        if let Some(block) = ticket.new_prefix
            && let Some(i) = self.new_prefixes.iter().position(|&b| b == block)
        {
            self.new_prefixes.swap_remove(i);
        }
    }

    /// The request ended (answered, failed, or abandoned by its client).
    pub fn finished(&mut self, mut ticket: Ticket) {
        self.started(&mut ticket);
        self.inflight = self.inflight.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(new_prefix: Option<u64>, decline_above: Option<u32>) -> Admission {
        Admission {
            first_block: new_prefix,
            new_prefix: new_prefix.is_some(),
            decline_above,
            streamed: true,
        }
    }

    fn gauges(running: u32, waiting: u32) -> Gauges {
        Gauges {
            running,
            waiting,
            kv_usage: 0.25,
        }
    }

    #[test]
    fn the_queue_counts_streamed_requests_until_their_first_byte() {
        let mut serving = ServingState::new();
        let mut a = serving.admit(&streamed(None, None)).unwrap();
        let b = serving.admit(&streamed(None, None)).unwrap();
        assert_eq!((serving.queued(), serving.inflight()), (2, 2));
        serving.started(&mut a);
        serving.started(&mut a);
        assert_eq!((serving.queued(), serving.inflight()), (1, 2));
        serving.finished(a);
        serving.finished(b);
        assert_eq!((serving.queued(), serving.inflight()), (0, 0));
    }

    #[test]
    fn whole_answers_count_through_the_polled_waiting_gauge() {
        let mut serving = ServingState::new();
        let whole = Admission {
            first_block: None,
            new_prefix: false,
            decline_above: None,
            streamed: false,
        };
        let first = serving.admit(&whole).unwrap();
        let second = serving.admit(&whole).unwrap();
        assert_eq!(serving.queued(), 2, "handed over since the last poll");
        // The engine runs one and queues the other; a streamed request waits too.
        let mut third = serving.admit(&streamed(None, None)).unwrap();
        serving.polled(gauges(1, 2));
        assert_eq!(
            serving.queued(),
            2,
            "1 streamed + (2 waiting - 1 streamed at the poll)"
        );
        serving.started(&mut third);
        assert_eq!(serving.queued(), 1, "the whole answer the poll saw waiting");
        serving.finished(first);
        serving.finished(second);
        serving.finished(third);
        assert_eq!(serving.inflight(), 0);
        assert_eq!(serving.queued(), 1, "until the next poll");
        serving.polled(gauges(0, 0));
        assert_eq!(serving.queued(), 0);
    }

    #[test]
    fn a_request_is_declined_only_over_its_bound_and_only_when_allowed() {
        let mut serving = ServingState::new();
        let held = serving.admit(&streamed(Some(1), Some(0))).unwrap();
        assert_eq!(
            serving.admit(&streamed(Some(2), Some(0))),
            Err(DeclineReason::NewPrefix)
        );
        assert_eq!(
            serving.admit(&streamed(None, Some(0))),
            Err(DeclineReason::Queue)
        );
        let under = serving.admit(&streamed(None, Some(1))).unwrap();
        let last = serving.admit(&streamed(Some(3), None)).unwrap();
        let joins = serving
            .admit(&streamed(Some(1), Some(0)))
            .expect("the same new prefix joins the engine computing it");
        let seen_as_held = Admission {
            new_prefix: false,
            ..streamed(Some(1), Some(0))
        };
        let follows = serving
            .admit(&seen_as_held)
            .expect("a request the entry saw as held joins it too");
        assert_eq!(serving.new_prefixes_in_flight(), 3);
        for ticket in [held, under, last, joins, follows] {
            serving.finished(ticket);
        }
        assert_eq!(serving.new_prefixes_in_flight(), 0);
        assert_eq!(serving.queued(), 0);
    }

    #[test]
    fn reports_carry_the_exact_queue_and_the_digest_version() {
        let mut serving = ServingState::new();
        serving.polled(gauges(4, 0));
        serving.set_digest_version(9);
        let ticket = serving.admit(&streamed(None, None)).unwrap();
        let report = serving.report();
        assert_eq!(
            (
                report.digest_version,
                report.running,
                report.waiting,
                report.inflight
            ),
            (9, 4, 1, 1)
        );
        serving.finished(ticket);
    }
}
