//! [`decide_decode`]: where a disaggregated request's decode leg goes, chosen when its prefill
//! answers (runtime redirection).
//!
//! The decode engine pulls the prompt's KV from the prefill engine, then runs the request's
//! whole decode: what matters is the batch it joins and whether the prompt fits in its free
//! KV at once (vLLM allocates every block of the prompt a decode engine does not hold when it
//! admits the leg). Load is counted in flight (running, waiting and this node's sends since
//! its gauges), since a decode batch slows every step for each request in it; the bounded-load
//! cap of [`super::decide`] keeps a burst from piling onto the engine that looked emptiest.
//! An engine that already pulled from this prefill engine is preferred within
//! [`PdConfig::warm_margin`] requests, since a first pull pays a handshake.

use super::config::{PdConfig, RouteConfig};
use super::considered::gpu_match;
use super::decide::{Candidate, Decision, Estimate, RouteError, RouteRequest};
use super::eligible;
use super::reason::RouteReason;
use super::rendezvous::rendezvous_weight;
use crate::digest::{LoraReadiness, Role};
use std::cmp::Reverse;

/// One decode-capable engine, as the ranking sees it.
#[derive(Copy, Clone, Debug)]
struct Row {
    index: usize,
    node_key: u64,
    matched: u32,
    load: u32,
    queued: u32,
    pending: u32,
    fits: bool,
    warm: bool,
}

/// Ranks the decode engines for `request`'s decode leg. `warm`: node keys of the decode
/// engines already connected to the prefill engine that ran its prefill.
pub fn decide_decode(
    candidates: &[Candidate<'_>],
    request: &RouteRequest<'_>,
    warm: &[u64],
    config: &RouteConfig,
    pd: &PdConfig,
    now_ms: u64,
) -> Result<Decision, RouteError> {
    let mut ranked = rows(candidates, request, warm, config, now_ms);
    if ranked.is_empty() {
        return Err(RouteError::NoCandidate(request.model.to_owned()));
    }
    let total: u64 = ranked.iter().map(|row| u64::from(row.load)).sum();
    let cap = config.load.cap((total + 1) as f64 / ranked.len() as f64);
    let spread = request.spread.unwrap_or(0);
    let key = |row: &Row| {
        let under_bound = f64::from(row.load) + 1.0 <= cap;
        let credit = if row.warm { pd.warm_margin } else { 0 };
        (
            Reverse(row.fits),
            Reverse(under_bound),
            row.load.saturating_sub(credit),
            Reverse(row.matched),
            Reverse(rendezvous_weight(spread, row.node_key)),
            row.node_key,
        )
    };
    ranked.sort_by_key(key);
    let lightest = ranked.iter().map(|row| row.load).min().unwrap_or(0);
    ranked.truncate(config.ranked_len.max(1));
    Ok(decision(&ranked, lightest))
}

/// The decode-capable engines that may take `request`, fresh ones only if any is fresh.
fn rows(
    candidates: &[Candidate<'_>],
    request: &RouteRequest<'_>,
    warm: &[u64],
    config: &RouteConfig,
    now_ms: u64,
) -> Vec<Row> {
    let mut rows: Vec<(bool, Row)> = Vec::with_capacity(candidates.len());
    for (index, candidate) in candidates.iter().enumerate() {
        if !eligible::takes(candidate.digest, Role::Decode, request.model) {
            continue;
        }
        let gauges = candidate.gauges();
        let matched = gpu_match(candidate, request.chain);
        rows.push((
            eligible::is_fresh(candidate, config, now_ms),
            Row {
                index,
                node_key: candidate.node_key,
                matched,
                load: gauges.load().saturating_add(candidate.pending),
                queued: gauges.waiting.saturating_add(candidate.pending),
                pending: candidate.pending,
                fits: fits(candidate, matched, request),
                warm: warm.contains(&candidate.node_key),
            },
        ));
    }
    eligible::keep_fresh(&mut rows, |(fresh, _)| *fresh);
    rows.into_iter().map(|(_, row)| row).collect()
}

/// The decision over `ranked`, best first; `lightest`: the least load of any decode engine.
fn decision(ranked: &[Row], lightest: u32) -> Decision {
    let chosen = ranked[0];
    let reason = if ranked.len() == 1 {
        RouteReason::OnlyCandidate
    } else if chosen.load > lightest {
        // Warmth or free KV outweighed the lightest engine's lead.
        RouteReason::LoadSpill
    } else {
        RouteReason::LeastLoaded
    };
    let best_matched_blocks = ranked.iter().map(|row| row.matched).max().unwrap_or(0);
    Decision {
        ranked: ranked.iter().map(|row| row.index).collect(),
        reason,
        matched_blocks: chosen.matched,
        best_matched_blocks,
        new_prefix: false,
        popular_blocks: 0,
        estimates: ranked
            .iter()
            .map(|row| Estimate {
                matched: row.matched,
                queued: row.queued,
                pending: row.pending,
                queued_tokens: None,
                worked_tokens: 0,
                ready: LoraReadiness::Running,
            })
            .collect(),
    }
}

/// Whether the prompt's blocks that `candidate` does not hold fit in its free KV now (an
/// engine that reports no capacity is taken to have room).
fn fits(candidate: &Candidate<'_>, matched: u32, request: &RouteRequest<'_>) -> bool {
    let digest = candidate.digest;
    if digest.kv_capacity_blocks == 0 || digest.block_size == 0 {
        return true;
    }
    let needed = (request.uncached_tokens(matched) / f64::from(digest.block_size)).ceil();
    let free = f64::from(1.0 - candidate.gauges().kv_usage.clamp(0.0, 1.0))
        * f64::from(digest.kv_capacity_blocks);
    needed <= free.floor()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::LoadDigest;
    use crate::route::tests::{digest, request};
    use crate::route::{Gauges, node_key};

    /// The `now` of `route::tests`' candidates.
    const NOW: u64 = 10_000;

    fn decoder(running: u32, kv_usage: f32) -> LoadDigest {
        LoadDigest {
            running,
            waiting: 0,
            kv_usage,
            role: Role::Decode,
            ..digest(0)
        }
    }

    fn candidate<'a>(name: &str, digest: &'a LoadDigest) -> Candidate<'a> {
        crate::route::tests::candidate(name, digest, None)
    }

    fn rank(candidates: &[Candidate<'_>], warm: &[u64]) -> Vec<usize> {
        let chain: Vec<u64> = (0..64).collect();
        let request = request(&chain);
        decide_decode(
            candidates,
            &request,
            warm,
            &RouteConfig::default(),
            &PdConfig::default(),
            NOW,
        )
        .unwrap()
        .ranked
    }

    #[test]
    fn the_least_loaded_decode_engine_wins_and_other_roles_never_take_a_decode_leg() {
        let (busy, idle) = (decoder(9, 0.2), decoder(1, 0.2));
        let mixed = LoadDigest {
            role: Role::Mixed,
            ..decoder(0, 0.0)
        };
        let prefill = LoadDigest {
            role: Role::Prefill,
            ..decoder(0, 0.0)
        };
        let candidates = [
            candidate("busy", &busy),
            candidate("mixed", &mixed),
            candidate("prefill", &prefill),
            candidate("idle", &idle),
        ];
        assert_eq!(rank(&candidates, &[]), vec![3, 0]);
    }

    #[test]
    fn sends_since_the_gauges_count_so_a_burst_spreads() {
        let (a, b) = (decoder(2, 0.2), decoder(3, 0.2));
        let mut first = candidate("a", &a);
        first.pending = 4;
        assert_eq!(rank(&[first, candidate("b", &b)], &[]), vec![1, 0]);
        // A return-path report newer than the digest stands in for it.
        first.pending = 0;
        first.fresh = Some(Gauges {
            running: 6,
            waiting: 0,
            kv_usage: 0.2,
            queued_tokens: None,
        });
        assert_eq!(rank(&[first, candidate("b", &b)], &[]), vec![1, 0]);
    }

    #[test]
    fn a_prompt_that_does_not_fit_goes_where_it_does_even_if_busier() {
        // 64 blocks of 16 tokens = 1,024 tokens = 64 engine blocks; 10,000 × 0.5 % free = 50.
        let (full, roomy) = (decoder(0, 0.995), decoder(5, 0.5));
        assert_eq!(
            rank(&[candidate("full", &full), candidate("roomy", &roomy)], &[]),
            vec![1, 0]
        );
    }

    #[test]
    fn an_engine_connected_to_the_prefill_engine_wins_within_the_warm_margin_only() {
        let (cold, warm) = (decoder(1, 0.2), decoder(3, 0.2));
        let candidates = [candidate("cold", &cold), candidate("warm", &warm)];
        assert_eq!(rank(&candidates, &[node_key("warm")]), vec![1, 0]);
        let hot = decoder(4, 0.2);
        let candidates = [candidate("cold", &cold), candidate("warm", &hot)];
        assert_eq!(rank(&candidates, &[node_key("warm")]), vec![0, 1]);
    }

    #[test]
    fn the_load_bound_outranks_warmth() {
        // Mean load with the request is (0 + 9 + 1) / 2 = 5; the cap ceil(1.25 × 5 + 2) = 9.
        let (idle, loaded) = (decoder(0, 0.2), decoder(9, 0.2));
        let pd = PdConfig {
            warm_margin: 100,
            ..PdConfig::default()
        };
        let chain: Vec<u64> = (0..64).collect();
        let decision = decide_decode(
            &[candidate("idle", &idle), candidate("loaded", &loaded)],
            &request(&chain),
            &[node_key("loaded")],
            &RouteConfig::default(),
            &pd,
            NOW,
        )
        .unwrap();
        assert_eq!(decision.ranked, vec![0, 1]);
    }

    #[test]
    fn no_decode_engine_is_no_candidate() {
        let mixed = digest(0);
        let chain: Vec<u64> = (0..4).collect();
        let none = decide_decode(
            &[candidate("mixed", &mixed)],
            &request(&chain),
            &[],
            &RouteConfig::default(),
            &PdConfig::default(),
            NOW,
        );
        assert_eq!(none, Err(RouteError::NoCandidate("m".into())));
    }
}
