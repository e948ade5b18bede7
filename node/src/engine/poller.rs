//! Polls the local engine and keeps the latest [`EngineState`]: `/metrics` every tick (the
//! digest interval, ~100 ms), `/health` every 5th tick, `/v1/models` every 20th. An engine
//! that refuses connections, or whose `/health` answers with an error, is unhealthy at once
//! (the latter until `/health` answers 200 again); one that answers late or with a garbled body
//! is unhealthy from its third failed poll in a row (see [`still_healthy`]). An unhealthy
//! engine's sidecar stays an entry point but stops being a target until the engine answers
//! again.

use super::client::{EngineClient, EngineError};
use super::models::{self, ModelCard};
use kvmesh_protocol::engine_metrics::{self, EngineMetrics, PrefillMeter, ewma};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const HEALTH_EVERY: u64 = 5;
const HEALTH_PATH: &str = "/health";
/// Polls between two reads of the engine's `/v1/models`.
pub const MODELS_EVERY: u64 = 20;
/// Failed polls in a row a reachable engine may have and stay a target: a vLLM busy with a
/// large batch can be slow to answer `/metrics` once in a while, and dropping out of every
/// node's candidates for that would move its traffic for nothing.
const TOLERATED_FAILED_POLLS: u32 = 2;
/// A poll that fails indecisively (slow, garbled) does not count against an engine that sent
/// its requests something within this window: it is busy, not hung (see
/// [`super::progress`]). A frozen engine sends nothing and is dropped as before, this much
/// later at the most.
const PROGRESS_WINDOW: Duration = Duration::from_secs(2);

/// Why a poll failed.
struct PollFailure {
    why: String,
    /// The engine is down, not slow: nothing listens (connection refused or reset), or its own
    /// `/health` answered with an error status.
    decisive: bool,
}

impl PollFailure {
    fn new(path: &str, error: &EngineError) -> Self {
        let says_down = path == HEALTH_PATH && matches!(error, EngineError::Status { .. });
        Self {
            why: format!("{path}: {error}"),
            decisive: says_down || matches!(error, EngineError::Unreachable(_)),
        }
    }

    fn invalid(path: &str, why: String) -> Self {
        Self {
            why: format!("{path}: {why}"),
            decisive: false,
        }
    }
}

/// Whether the engine stays a target after a poll. It must have named its models and not
/// have said it is down at its last `/health` check (`reported_down`); then either this poll
/// answered, or it failed indecisively and only a few polls in a row (`failed_in_a_row`, this
/// one included) have.
fn still_healthy(
    failure: Option<&PollFailure>,
    failed_in_a_row: u32,
    has_models: bool,
    reported_down: bool,
) -> bool {
    has_models
        && !reported_down
        && match failure {
            None => true,
            Some(failure) => !failure.decisive && failed_in_a_row <= TOLERATED_FAILED_POLLS,
        }
}

/// Failed polls in a row after this one: a failure counts when it is decisive or when the
/// engine sent its requests nothing lately (`progressing`: within [`PROGRESS_WINDOW`]); an
/// engine that answers, or streams while its poller waits, starts over at 0.
fn failed_polls(before: u32, failure: Option<&PollFailure>, progressing: bool) -> u32 {
    match failure {
        Some(failure) if failure.decisive || !progressing => before + 1,
        _ => 0,
    }
}

/// What the node knows of its engine.
#[derive(Clone, Debug, Default)]
pub struct EngineState {
    pub healthy: bool,
    /// Served model names (`/v1/models` entries without a parent).
    pub models: Vec<String>,
    /// LoRA adapters (`/v1/models` entries whose `parent` is another model).
    pub loras: Vec<String>,
    /// Every `/v1/models` entry, as the engine describes it.
    pub cards: Vec<ModelCard>,
    pub metrics: EngineMetrics,
    /// When `metrics` were asked for: the engine read them between then and the poll's end.
    pub metrics_asked_at: Option<Instant>,
    pub ttft_ewma_ms: f64,
    pub prefill_tokens_per_s: f64,
    /// The last error, for `/debug/cluster` and logs.
    pub last_error: Option<String>,
    /// Number of completed polls; 0 until the first answer.
    pub polls: u64,
}

/// Handle on the poller's latest state.
#[derive(Clone, Debug)]
pub struct LocalEngine {
    pub client: EngineClient,
    state: watch::Receiver<Arc<EngineState>>,
}

impl LocalEngine {
    /// Starts polling every `interval`; the task stops when the returned handle is aborted.
    pub fn spawn(client: EngineClient, interval: Duration) -> (LocalEngine, JoinHandle<()>) {
        let (tx, rx) = watch::channel(Arc::new(EngineState::default()));
        let task = tokio::spawn(poll_loop(client.clone(), interval, tx));
        (LocalEngine { client, state: rx }, task)
    }

    pub fn state(&self) -> Arc<EngineState> {
        self.state.borrow().clone()
    }

    /// Notified after every poll.
    pub fn watch(&self) -> watch::Receiver<Arc<EngineState>> {
        self.state.clone()
    }

    /// Resolves once a poll has found the engine unhealthy (at once if the last one did);
    /// never if the poller stops. A request waiting for this engine's first byte races it
    /// (through `AppState::engine_stalled`, which also asks whether the engine still begins
    /// answers): a frozen engine would otherwise hold the request until the request timeout.
    /// (An engine never polled yet is not judged: the request finds out by itself.)
    pub async fn unhealthy(&self) {
        let mut state = self.state.clone();
        let judged_unhealthy = |engine: &Arc<EngineState>| engine.polls > 0 && !engine.healthy;
        if state.wait_for(judged_unhealthy).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

async fn poll_loop(client: EngineClient, interval: Duration, tx: watch::Sender<Arc<EngineState>>) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let timeout = interval.max(Duration::from_millis(500)) * 2;
    let mut state = EngineState::default();
    let mut previous: Option<(EngineMetrics, Instant)> = None;
    let mut prefill = PrefillMeter::default();
    let mut tick: u64 = 0;
    let mut failed_in_a_row: u32 = 0;
    // Whether the engine's last `/health` answer was an error: it holds until the next check.
    let mut reported_down = false;
    loop {
        ticker.tick().await;
        let mut failure = None;
        if tick.is_multiple_of(HEALTH_EVERY) {
            match client.get_text(HEALTH_PATH, timeout).await {
                Ok(_) => reported_down = false,
                Err(e) => {
                    reported_down = matches!(e, EngineError::Status { .. });
                    failure = Some(PollFailure::new(HEALTH_PATH, &e));
                }
            }
        }
        if failure.is_none() && (tick.is_multiple_of(MODELS_EVERY) || state.models.is_empty()) {
            match client
                .get_text("/v1/models", timeout)
                .await
                .map(|t| models::parse_models(&t))
            {
                // vLLM stamps every listing with its time: the cards read first stand until
                // the models themselves change (else they would be gossiped anew after every
                // read, and each node would list another `created`).
                Ok(Ok(cards)) if !models::same_cards(&state.cards, &cards) => {
                    state.models = models::ids(&cards, false);
                    state.loras = models::ids(&cards, true);
                    state.cards = cards;
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => failure = Some(PollFailure::invalid("/v1/models", e.to_string())),
                Err(e) => failure = Some(PollFailure::new("/v1/models", &e)),
            }
        }
        if failure.is_none() {
            let asked_at = Instant::now();
            match client.get_text("/metrics", timeout).await {
                Ok(text) => {
                    let now = Instant::now();
                    let current = engine_metrics::parse(&text);
                    if let Some((before, _)) = &previous {
                        update_ewmas(&mut state, &mut prefill, before, &current);
                    }
                    state.metrics = current.clone();
                    state.metrics_asked_at = Some(asked_at);
                    previous = Some((current, now));
                }
                Err(e) => failure = Some(PollFailure::new("/metrics", &e)),
            }
        }
        let progressing = client.progress().within(PROGRESS_WINDOW);
        failed_in_a_row = failed_polls(failed_in_a_row, failure.as_ref(), progressing);
        let was_healthy = state.healthy;
        state.healthy = still_healthy(
            failure.as_ref(),
            failed_in_a_row,
            !state.models.is_empty(),
            reported_down,
        );
        if was_healthy != state.healthy {
            match &failure {
                Some(failure) => {
                    tracing::warn!(
                        engine = client.base_url(),
                        why = failure.why,
                        "engine unhealthy"
                    )
                }
                None => tracing::info!(engine = client.base_url(), "engine healthy"),
            }
        } else if let Some(failure) = failure.as_ref().filter(|_| state.healthy) {
            tracing::debug!(
                engine = client.base_url(),
                why = failure.why,
                failed_in_a_row,
                "engine poll failed; still a target"
            );
        }
        state.last_error = failure.map(|f| f.why);
        state.polls += 1;
        tick += 1;
        if tx.send(Arc::new(state.clone())).is_err() {
            return;
        }
    }
}

/// TTFT from the histogram's growth since the last scrape; prefill speed from the prompt
/// tokens the engine actually computed (prompt minus prefix-cache hits) over the prefill time
/// (or, where vLLM does not expose it, the TTFT, which also counts queueing: a lower bound),
/// over windows of [`PrefillMeter`]'s.
fn update_ewmas(
    state: &mut EngineState,
    prefill: &mut PrefillMeter,
    before: &EngineMetrics,
    now: &EngineMetrics,
) {
    if let Some(speed) = prefill.observe(now.prefill_counters()) {
        state.prefill_tokens_per_s = ewma(state.prefill_tokens_per_s, speed);
    }
    let count = now.ttft_count - before.ttft_count;
    if count <= 0.0 {
        return;
    }
    let ttft_ms = (now.ttft_sum - before.ttft_sum) / count * 1000.0;
    if ttft_ms.is_finite() && ttft_ms >= 0.0 {
        state.ttft_ewma_ms = ewma(state.ttft_ewma_ms, ttft_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_engine_stays_a_target_for_a_few_polls_a_dead_one_does_not() {
        let slow = PollFailure::new("/metrics", &EngineError::Timeout(Duration::from_secs(1)));
        let refused = PollFailure::new("/metrics", &EngineError::Unreachable("refused".into()));
        let healthy = |failure, in_a_row| still_healthy(failure, in_a_row, true, false);
        assert!(healthy(None, 0));
        assert!(!still_healthy(None, 0, false, false), "no models named yet");
        assert!(healthy(Some(&slow), 1));
        assert!(healthy(Some(&slow), TOLERATED_FAILED_POLLS));
        assert!(!healthy(Some(&slow), TOLERATED_FAILED_POLLS + 1));
        assert!(!healthy(Some(&refused), 1));
        let garbled = PollFailure::invalid("/v1/models", "not JSON".into());
        assert!(healthy(Some(&garbled), 1));
        // The engine's own /health saying it is down counts at once, and until it says
        // otherwise: the polls between /health checks do not make it a target again.
        let down = EngineError::Status {
            status: 503,
            body: String::new(),
        };
        let says_down = PollFailure::new(HEALTH_PATH, &down);
        assert!(!healthy(Some(&says_down), 1));
        assert!(!still_healthy(None, 0, true, true));
        let metrics_error = PollFailure::new("/metrics", &down);
        assert!(
            healthy(Some(&metrics_error), 1),
            "a /metrics error alone is indecisive"
        );
    }

    #[test]
    fn a_slow_poll_does_not_count_against_an_engine_that_streams() {
        let slow = PollFailure::new("/metrics", &EngineError::Timeout(Duration::from_secs(1)));
        let refused = PollFailure::new("/metrics", &EngineError::Unreachable("refused".into()));
        // Busy: its poller times out while its streams move. It stays a target however long.
        let mut in_a_row = 0;
        for _ in 0..10 {
            in_a_row = failed_polls(in_a_row, Some(&slow), true);
            assert!(still_healthy(Some(&slow), in_a_row, true, false));
        }
        // Hung: nothing moves, and the slow polls count as before.
        for _ in 0..=TOLERATED_FAILED_POLLS {
            in_a_row = failed_polls(in_a_row, Some(&slow), false);
        }
        assert!(!still_healthy(Some(&slow), in_a_row, true, false));
        // Down: a refused connection counts whatever was streaming a moment ago.
        assert_eq!(failed_polls(0, Some(&refused), true), 1);
        assert!(!still_healthy(Some(&refused), 1, true, false));
        assert_eq!(failed_polls(5, None, false), 0, "an answer starts over");
    }

    #[test]
    fn ewmas_follow_histogram_deltas() {
        let mut state = EngineState::default();
        let before = EngineMetrics {
            ttft_sum: 1.0,
            ttft_count: 10.0,
            prompt_tokens: 1000.0,
            ..Default::default()
        };
        let now = EngineMetrics {
            ttft_sum: 1.5,
            ttft_count: 12.0,
            prompt_tokens: 3000.0,
            prefix_hits: 1000.0,
            ..Default::default()
        };
        let mut prefill = PrefillMeter::default();
        prefill.observe(before.prefill_counters());
        update_ewmas(&mut state, &mut prefill, &before, &now);
        assert!((state.ttft_ewma_ms - 250.0).abs() < 1e-6);
        assert!((state.prefill_tokens_per_s - 2000.0).abs() < 1e-6);
        update_ewmas(&mut state, &mut prefill, &now, &now);
        assert!(
            (state.ttft_ewma_ms - 250.0).abs() < 1e-6,
            "no new requests: unchanged"
        );
    }
}
