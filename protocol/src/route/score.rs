//! Stage 5, the score of an engine that may hold the prefix, in the configured form: the
//! classic `α·matched/len + β·(1 - kv_usage) - γ·queued/L (+ adapter readiness)`, highest
//! wins, or the cost form, minus the estimated time to first token (queue wait plus the
//! uncached prefill, plus loading an adapter).

use super::config::{RouteConfig, ScoreForm};
use super::considered::Considered;
use super::decide::{Candidate, RouteRequest};
use crate::digest::{LoadDigest, LoraReadiness};

/// One candidate's scores, before the spread band is known.
#[derive(Copy, Clone, Debug)]
pub(super) struct Scored {
    /// Within the load bound by taking the request (see [`super::load_cap`]).
    pub under_bound: bool,
    /// Score without the session bonus.
    pub base: f64,
    /// The session bonus (see [`super::session`]).
    pub bonus: f64,
}

/// `candidate`'s score for `request`. `matched`: the blocks the score credits the engine
/// with (its own, or a popular prefix's owed everywhere).
pub(super) fn base_score(
    candidate: &Candidate<'_>,
    matched: u32,
    entry: &Considered,
    request: &RouteRequest<'_>,
    config: &RouteConfig,
) -> f64 {
    let gauges = candidate.gauges();
    let queued = f64::from(gauges.waiting) + f64::from(candidate.pending);
    let adapter = adapter_readiness(candidate.digest, entry.ready, request.model);
    match config.form {
        ScoreForm::Score => {
            let matched = match request.chain.len() {
                0 => 0.0,
                len => f64::from(matched) / len as f64,
            };
            let queued = queued + config.score.running_weight.max(0.0) * f64::from(gauges.running);
            config.score.alpha * matched + config.score.beta * (1.0 - f64::from(gauges.kv_usage))
                - config.score.gamma * queued / config.score.waiting_threshold.max(1.0)
                + config.score.lora_weight * adapter.unwrap_or(0.0)
        }
        ScoreForm::Cost => {
            let loading = config.assumed.lora_load_ms.max(0.0) * (1.0 - adapter.unwrap_or(1.0));
            let ttft = estimated_ttft_ms(
                candidate.digest,
                gauges.waiting,
                matched,
                queued,
                request,
                config,
            );
            -(ttft + loading)
        }
    }
}

/// For a request naming a LoRA adapter the engine serves, how ready the engine is to run it,
/// 0..=1 (llm-d's scale: running 1, loadable into a free slot 0.8, queued 0.6, no slot 0);
/// `None` for a base model.
fn adapter_readiness(digest: &LoadDigest, ready: LoraReadiness, model: &str) -> Option<f64> {
    if !digest.loras.iter().any(|lora| lora == model) {
        return None;
    }
    Some(match ready {
        LoraReadiness::Running => 1.0,
        LoraReadiness::FreeSlot => 0.8,
        LoraReadiness::Waiting => 0.6,
        LoraReadiness::NoSlot => 0.0,
    })
}

/// The cost form: time to drain the queue ahead plus time to prefill what is not cached.
fn estimated_ttft_ms(
    digest: &LoadDigest,
    waiting: u32,
    matched: u32,
    queued: f64,
    request: &RouteRequest<'_>,
    config: &RouteConfig,
) -> f64 {
    let prefill_ms =
        request.uncached_tokens(matched) / prefill_tokens_per_s(digest, config) * 1000.0;
    queued * service_ms(digest, waiting, request, config) + prefill_ms
}

/// The prompt tokens `candidate`'s engine could have prefilled since its gauges were read:
/// their age (from when this node received them) at the engine's prefill speed. The gauges'
/// own age before they arrived is not known and not counted, so this errs low.
pub(super) fn worked_tokens(candidate: &Candidate<'_>, config: &RouteConfig, now_ms: u64) -> u32 {
    let age_s = now_ms.saturating_sub(candidate.digest_received_ms) as f64 / 1000.0;
    (age_s * prefill_tokens_per_s(candidate.digest, config)).min(f64::from(u32::MAX)) as u32
}

/// An engine's prefill speed: what its digest reports, else the configured assumption.
fn prefill_tokens_per_s(digest: &LoadDigest, config: &RouteConfig) -> f64 {
    match f64::from(digest.prefill_tokens_per_s) {
        tps if tps > 0.0 => tps,
        _ => config.assumed.default_prefill_tokens_per_s.max(1.0),
    }
}

/// The time one queued request holds up the next on this engine: from the observed TTFT
/// (TTFT ≈ (waiting + 1) × service), or the prompt's own prefill time when nothing was
/// observed yet.
fn service_ms(
    digest: &LoadDigest,
    waiting: u32,
    request: &RouteRequest<'_>,
    config: &RouteConfig,
) -> f64 {
    match f64::from(digest.ttft_ewma_ms) {
        ttft if ttft > 0.0 => ttft / (1.0 + f64::from(waiting)),
        _ => f64::from(request.prompt_tokens) / prefill_tokens_per_s(digest, config) * 1000.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::LoraUse;
    use crate::route::tests::{candidate, digest, request};

    const NOW: u64 = 10_000;

    fn score(c: &Candidate<'_>, matched: u32, chain: &[u64], config: &RouteConfig) -> f64 {
        let entry = Considered::blank(c.node_key);
        base_score(c, matched, &entry, &request(chain), config)
    }

    #[test]
    fn the_score_form_adds_the_match_and_free_cache_and_subtracts_the_queue() {
        let chain = [0; 8];
        // running 2, waiting 4, pending 1, kv_usage 0.3.
        let load = digest(4);
        let mut c = candidate("a", &load, None);
        c.pending = 1;
        let config = RouteConfig::default();
        let queued = 4.0 + 1.0 + 0.25 * 2.0;
        let expected = 1.0 * 6.0 / 8.0 + 0.1 * (1.0 - f64::from(0.3f32)) - queued / 16.0;
        assert!((score(&c, 6, &chain, &config) - expected).abs() < 1e-12);
        assert!(score(&c, 7, &chain, &config) > score(&c, 6, &chain, &config));
        assert_eq!(
            score(&c, 0, &[], &config),
            score(&c, 6, &[], &config),
            "no blocks"
        );
    }

    #[test]
    fn the_cost_form_is_minus_the_queue_wait_and_the_uncached_prefill() {
        // 8 blocks of 16 tokens, 4 cached: 64 tokens at 1,000 tokens/s = 64 ms; two queued
        // at a service of 300 ms / (2 + 1) = 100 ms each.
        let load = LoadDigest {
            ttft_ewma_ms: 300.0,
            prefill_tokens_per_s: 1_000.0,
            ..digest(2)
        };
        let c = candidate("a", &load, None);
        let config = RouteConfig {
            form: ScoreForm::Cost,
            ..RouteConfig::default()
        };
        let chain = [0; 8];
        assert!((score(&c, 4, &chain, &config) - -(2.0 * 100.0 + 64.0)).abs() < 1e-9);
        // Nothing observed yet: the configured speed, and the whole prompt's prefill per
        // queued request (128 tokens at 5,000 tokens/s = 25.6 ms).
        let blank = digest(2);
        let c = candidate("b", &blank, None);
        let expected = -(2.0 * 25.6 + 64.0 / 5.0);
        assert!((score(&c, 4, &chain, &config) - expected).abs() < 1e-9);
    }

    #[test]
    fn an_adapters_readiness_weighs_in_both_forms() {
        let mut load = digest(0);
        load.loras = vec!["m".into()];
        load.lora_use = LoraUse::default();
        let c = candidate("a", &load, None);
        let chain = [0; 4];
        let with = |ready, config: &RouteConfig| {
            let entry = Considered {
                ready,
                ..Considered::blank(c.node_key)
            };
            base_score(&c, 0, &entry, &request(&chain), config)
        };
        let config = RouteConfig::default();
        let gap = with(LoraReadiness::Running, &config) - with(LoraReadiness::NoSlot, &config);
        assert!((gap - config.score.lora_weight).abs() < 1e-12);
        assert!(with(LoraReadiness::FreeSlot, &config) > with(LoraReadiness::Waiting, &config));
        let cost = RouteConfig {
            form: ScoreForm::Cost,
            ..config
        };
        let gap = with(LoraReadiness::Running, &cost) - with(LoraReadiness::FreeSlot, &cost);
        assert!((gap - 0.2 * cost.assumed.lora_load_ms).abs() < 1e-9);
        assert_eq!(
            adapter_readiness(&digest(0), LoraReadiness::NoSlot, "m"),
            None
        );
    }

    #[test]
    fn worked_tokens_are_the_gauges_age_at_the_prefill_speed() {
        let load = LoadDigest {
            prefill_tokens_per_s: 2_000.0,
            ..digest(0)
        };
        let mut c = candidate("a", &load, None);
        c.digest_received_ms = NOW - 250;
        assert_eq!(worked_tokens(&c, &RouteConfig::default(), NOW), 500);
        c.digest_received_ms = NOW + 5;
        assert_eq!(worked_tokens(&c, &RouteConfig::default(), NOW), 0);
    }
}
