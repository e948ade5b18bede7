//! A leg's attempts: the plan's engines in rank order until one answers with a response head.

use super::entry::{self, AttemptError, Upstream};
use crate::serve::routing::Routed;
use crate::serve::state::{SharedState, lock};
use bytes::Bytes;
use kvmesh_protocol::RouteReason;
use kvmesh_protocol::lifecycle::{Failure, Outcome, Plan, Progress};
use kvmesh_protocol::wire::RequestHead;

/// What a leg is, which decides what counts as an answer.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Leg {
    /// A whole request: any response head is the client's answer.
    Whole,
    /// A disaggregated request's prefill: an engine error (5xx) is a failure, worth trying
    /// on the next prefill engine.
    Prefill,
    /// A disaggregated request's decode: an engine error (5xx) most likely means the pull
    /// failed, and the prefill's blocks may be gone: the caller decides what runs again.
    Decode,
    /// A Responses API request continuing a stored response, looked for: an engine's 404
    /// (it does not store it) passes it to the next, the last engine's answer is the client's.
    Continuation,
}

/// The head that came back.
pub struct Answered {
    pub upstream: Upstream,
    /// The plan, which the relay tells when the answer ended.
    pub plan: Plan,
    /// Why the answering engine was tried.
    pub reason: RouteReason,
    /// The answering engine's node.
    pub node_key: u64,
    pub attempts: u32,
}

/// Why no head came back.
#[derive(Debug, Default)]
pub struct Unanswered {
    /// Each failed attempt, `node: why`.
    pub failures: Vec<String>,
    /// The last failure was the deadline.
    pub timed_out: bool,
    /// The last attempt's engine answered with an error status.
    pub engine_error: bool,
    pub attempts: u32,
}

/// Makes `routed`'s attempts in order until one answers with a head that counts for `leg`.
pub async fn run(
    state: &SharedState,
    routed: Routed,
    head: &mut RequestHead,
    body: &Bytes,
    chain: &[u64],
    leg: Leg,
) -> Result<Answered, Unanswered> {
    let Routed { mut plan, targets } = routed;
    head.prefix_samples = plan.prefix_samples().to_vec();
    let mut unanswered = Unanswered::default();
    loop {
        let attempt = plan.next_attempt(&mut lock(&state.entry), chain, state.now_ms());
        let Some(attempt) = attempt else { break };
        unanswered.attempts += 1;
        let target = &targets[attempt.candidate];
        let name = target.name(&state.node_name);
        let span = tracing::Span::current();
        span.record("reason", attempt.reason.as_str());
        span.record("peer", name);
        head.carry(&attempt);
        let sent = tokio::time::timeout(
            state.config.request_timeout,
            entry::attempt(state, target, head.clone(), body.clone(), chain),
        );
        let mut result = match sent.await {
            Ok(result) => result,
            Err(_) => Err(AttemptError::failed(Failure::TimedOut, "deadline exceeded")),
        };
        unanswered.engine_error = false;
        if let Ok(upstream) = &result
            && matches!(leg, Leg::Prefill | Leg::Decode)
            && upstream.status >= 500
        {
            unanswered.engine_error = true;
            let message = format!("engine answered {} to the {leg:?} leg", upstream.status);
            // A failed prefill leg is retried elsewhere; a decode leg reached its engine.
            let failure = match leg {
                Leg::Prefill => Failure::Retryable,
                _ => Failure::Final,
            };
            result = Err(AttemptError::failed(failure, message));
        }
        if let Ok(upstream) = &result
            && leg == Leg::Continuation
            && upstream.status == 404
            && plan.has_next()
        {
            let message = "engine does not store the previous response".to_owned();
            result = Err(AttemptError::retryable(message));
        }
        let outcome = match &result {
            Ok(upstream) => Outcome::Started(upstream.report),
            Err(error) => error.outcome(),
        };
        if matches!(
            outcome,
            Outcome::Started(Some(_)) | Outcome::Declined(Some(_))
        ) {
            state.metrics.load_reports.inc();
        }
        let mut progress = plan.on_outcome(&mut lock(&state.entry), chain, outcome, state.now_ms());
        let error = match result {
            Ok(mut upstream) => {
                if let Err(lost) = entry::first_byte(state, target, &mut upstream).await {
                    let failure = match lost.outcome() {
                        Outcome::Failed(failure) => failure,
                        _ => Failure::Retryable,
                    };
                    let entry = &mut lock(&state.entry);
                    progress = plan.lost_before_first_byte(entry, chain, failure);
                    report_failure(state, name, leg, &lost, progress, &mut unanswered);
                    if progress != Progress::TryNext {
                        break;
                    }
                    continue;
                }
                tracing::debug!(
                    served_by = upstream.served_by,
                    reason = attempt.reason.as_str(),
                    matched = plan.matched_blocks(),
                    ?leg,
                    "forwarded"
                );
                return Ok(Answered {
                    upstream,
                    plan,
                    reason: attempt.reason,
                    node_key: attempt.node_key,
                    attempts: unanswered.attempts,
                });
            }
            Err(error) => error,
        };
        report_failure(state, name, leg, &error, progress, &mut unanswered);
        if progress != Progress::TryNext {
            break;
        }
    }
    Err(unanswered)
}

/// Logs and counts an attempt that got no answer, and keeps why.
fn report_failure(
    state: &SharedState,
    name: &str,
    leg: Leg,
    error: &AttemptError,
    progress: Progress,
    unanswered: &mut Unanswered,
) {
    match error {
        AttemptError::Declined { message, .. } => {
            state.metrics.attempts_declined.inc();
            tracing::debug!(target = name, error = message, "declined");
        }
        AttemptError::Failed { failure, message } => {
            unanswered.timed_out |= *failure == Failure::TimedOut;
            tracing::warn!(target = name, error = message, ?leg, "attempt failed");
            unanswered.failures.push(format!("{name}: {message}"));
            if progress == Progress::TryNext {
                state.metrics.retries.inc();
            }
        }
    }
}
