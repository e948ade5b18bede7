//! This node's engine's exact queue ([`ServingState`]), shared by the requests that enter here
//! and the ones peers forward: every request handed to the engine goes through
//! [`EngineQueue::admit`], which may decline it (late binding), and holds a [`HandedOver`]
//! guard until it ends.

use super::publish::PublishSoon;
use super::state::lock;
use crate::metrics::{NodeMetrics, ReasonLabels};
use kvmesh_protocol::lifecycle::{Admission, DeclineReason, LoadReport, ServingState, Ticket};
use kvmesh_protocol::route::Gauges;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct EngineQueue {
    state: Arc<Mutex<ServingState>>,
    metrics: NodeMetrics,
    /// The queue's clock: every event it is told of is timed on it.
    epoch: Instant,
    /// When the engine last began an answer (its first byte), on `epoch`; `u64::MAX`: never.
    last_answer_ms: Arc<AtomicU64>,
    /// Told of every request handed over, begun or ended: the digest gossips the queue.
    changed: PublishSoon,
}

impl EngineQueue {
    /// A queue that credits its oldest request at `prefill_tokens_per_s` until the engine's
    /// own speed is measured (the speed entries assume of an engine whose digest reports none).
    pub fn new(metrics: NodeMetrics, prefill_tokens_per_s: f64) -> Self {
        let mut state = ServingState::new();
        state.set_prefill_speed(prefill_tokens_per_s);
        Self {
            state: Arc::new(Mutex::new(state)),
            metrics,
            epoch: Instant::now(),
            last_answer_ms: Arc::new(AtomicU64::new(u64::MAX)),
            changed: PublishSoon::default(),
        }
    }

    /// How long since the engine last began an answer; `None` if it never did. A busy engine
    /// keeps beginning them however slowly it answers its poller; a frozen one does not.
    pub fn since_last_answer(&self) -> Option<Duration> {
        match self.last_answer_ms.load(Ordering::Relaxed) {
            u64::MAX => None,
            at_ms => Some(Duration::from_millis(self.now_ms().saturating_sub(at_ms))),
        }
    }

    /// Hands a request over, or declines it with this engine's load.
    pub fn admit(&self, admission: &Admission) -> Result<HandedOver, (DeclineReason, LoadReport)> {
        let now_ms = self.now_ms();
        let mut state = lock(&self.state);
        match state.admit(admission, now_ms) {
            Ok(ticket) => {
                self.observe(&state);
                self.changed.nudge();
                Ok(HandedOver {
                    queue: self.clone(),
                    ticket: Some(ticket),
                    started: false,
                })
            }
            Err(reason) => {
                let labels = ReasonLabels {
                    reason: reason.as_str().to_owned(),
                };
                self.metrics.declined.get_or_create(&labels).inc();
                Err((reason, state.report(now_ms)))
            }
        }
    }

    /// What an answer tells its entry now.
    pub fn report(&self) -> LoadReport {
        let now_ms = self.now_ms();
        lock(&self.state).report(now_ms)
    }

    /// Told of every request handed over, begun or ended: what wakes the publish loop.
    pub fn changes(&self) -> &PublishSoon {
        &self.changed
    }

    /// The engine's gauges now, with this node's exact queue.
    pub fn gauges(&self) -> Gauges {
        let now_ms = self.now_ms();
        lock(&self.state).gauges(now_ms)
    }

    /// The engine's gauges, asked for at `asked_at`, were just read, and its prefill speed
    /// measured (0: not yet).
    pub fn polled(&self, gauges: Gauges, prefill_tokens_per_s: f64, asked_at: Instant) {
        let asked_ms = asked_at.saturating_duration_since(self.epoch).as_millis() as u64;
        let mut state = lock(&self.state);
        state.polled(gauges, asked_ms);
        state.set_prefill_speed(prefill_tokens_per_s);
        self.observe(&state);
    }

    pub fn set_digest_version(&self, version: u64) {
        lock(&self.state).set_digest_version(version);
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn observe(&self, state: &ServingState) {
        let metrics = &self.metrics;
        metrics.engine_queued.set(i64::from(state.queued()));
        metrics
            .new_prefixes_in_flight
            .set(state.new_prefixes_in_flight() as i64);
    }
}

/// A request handed to the engine: counted as queued until [`HandedOver::started`] (its
/// answer's first byte), and in flight until dropped.
#[derive(Debug)]
pub struct HandedOver {
    queue: EngineQueue,
    ticket: Option<Ticket>,
    /// Called for every chunk of an answer: only the first takes the lock.
    started: bool,
}

impl HandedOver {
    pub fn started(&mut self) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        let now_ms = self.queue.now_ms();
        self.queue.last_answer_ms.store(now_ms, Ordering::Relaxed);
        if let Some(ticket) = &mut self.ticket {
            let mut state = lock(&self.queue.state);
            state.started(ticket, now_ms);
            self.queue.observe(&state);
            self.queue.changed.nudge();
        }
    }
}

impl Drop for HandedOver {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            let now_ms = self.queue.now_ms();
            let mut state = lock(&self.queue.state);
            state.finished(ticket, now_ms);
            self.queue.observe(&state);
            self.queue.changed.nudge();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guard_counts_until_its_first_byte_and_ends_when_dropped() {
        // A token a second: the engine does nothing of a queued request while this test runs.
        let queue = EngineQueue::new(NodeMetrics::default(), 1.0);
        let streamed = |decline_above_tokens| Admission {
            prefix_key: Some(7),
            new_prefix: true,
            prefill_tokens: 1_000,
            decline_above_tokens,
            streamed: true,
            prefix_samples: &[],
        };
        let mut first = queue
            .admit(&streamed(None))
            .expect("an idle engine takes it");
        assert_eq!(queue.metrics.engine_queued.get(), 1);
        assert_eq!(queue.metrics.new_prefixes_in_flight.get(), 1);
        let other = Admission {
            prefix_key: Some(8),
            ..streamed(Some(1_500))
        };
        let (reason, report) = queue.admit(&other).expect_err("over the bound");
        assert_eq!((reason, report.waiting), (DeclineReason::NewPrefix, 1));
        first.started();
        assert_eq!(queue.metrics.engine_queued.get(), 0);
        assert_eq!(queue.report().inflight, 1);
        drop(first);
        assert_eq!(queue.report().inflight, 0);
        let labels = ReasonLabels {
            reason: "new-prefix".into(),
        };
        assert_eq!(queue.metrics.declined.get_or_create(&labels).get(), 1);
    }
}
