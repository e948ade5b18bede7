//! Stage 1, who may take the request: healthy engines that serve its model in a role that
//! takes its work, judged on fresh gauges wherever any candidate has them.

use super::config::RouteConfig;
use super::considered::Considered;
use super::decide::{Candidate, RouteRequest};
use crate::digest::{LoadDigest, Role};

/// Whether the engine behind `digest` may serve `model` for work of `role` at all.
pub(super) fn takes(digest: &LoadDigest, role: Role, model: &str) -> bool {
    digest.healthy && digest.role.takes(role) && digest.serves(model)
}

/// Whether this node received `candidate`'s gauges within `max_digest_age_ms` of `now_ms`.
pub(super) fn is_fresh(candidate: &Candidate<'_>, config: &RouteConfig, now_ms: u64) -> bool {
    now_ms.saturating_sub(candidate.digest_received_ms) <= config.max_digest_age_ms
}

/// Keeps only the fresh rows of `rows` if any is fresh: a stale view still serves alone.
pub(super) fn keep_fresh<T>(rows: &mut Vec<T>, fresh: impl Fn(&T) -> bool) {
    if rows.iter().any(&fresh) {
        rows.retain(fresh);
    }
}

/// Fills `entries` with what the decision reads of every candidate that may take `request`.
pub(super) fn consider(
    entries: &mut Vec<Considered>,
    candidates: &[Candidate<'_>],
    request: &RouteRequest<'_>,
    config: &RouteConfig,
    now_ms: u64,
) {
    entries.clear();
    entries.reserve(candidates.len());
    let eligible = candidates
        .iter()
        .enumerate()
        .filter(|(_, candidate)| takes(candidate.digest, request.role, request.model));
    for (index, candidate) in eligible {
        entries.push(Considered::read(index, candidate, request, config, now_ms));
    }
    keep_fresh(entries, |entry| entry.fresh);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::tests::{candidate, digest, request};

    const NOW: u64 = 10_000;

    #[test]
    fn only_healthy_engines_serving_the_model_in_a_taking_role_are_considered() {
        let ok = digest(0);
        let sick = LoadDigest {
            healthy: false,
            ..digest(0)
        };
        let other_model = LoadDigest {
            models: vec!["other".into()],
            ..digest(0)
        };
        let prefill = LoadDigest {
            role: Role::Prefill,
            ..digest(0)
        };
        let decode = LoadDigest {
            role: Role::Decode,
            ..digest(0)
        };
        let candidates = [
            candidate("sick", &sick, None),
            candidate("ok", &ok, None),
            candidate("other", &other_model, None),
            candidate("prefill", &prefill, None),
            candidate("decode", &decode, None),
        ];
        let chain = [1, 2];
        let mut entries = Vec::new();
        let config = RouteConfig::default();
        consider(&mut entries, &candidates, &request(&chain), &config, NOW);
        let indexes: Vec<usize> = entries.iter().map(|e| e.index).collect();
        assert_eq!(indexes, [1, 4], "a decode engine runs whole requests too");

        let decode_leg = RouteRequest {
            role: Role::Decode,
            ..request(&chain)
        };
        consider(&mut entries, &candidates, &decode_leg, &config, NOW);
        let indexes: Vec<usize> = entries.iter().map(|e| e.index).collect();
        assert_eq!(indexes, [4], "a mixed engine takes no leg");
    }

    #[test]
    fn stale_gauges_are_dropped_only_while_fresh_ones_exist() {
        let config = RouteConfig::default();
        let load = digest(0);
        let mut stale = candidate("stale", &load, None);
        stale.digest_received_ms = NOW - config.max_digest_age_ms - 1;
        let mut edge = candidate("edge", &load, None);
        edge.digest_received_ms = NOW - config.max_digest_age_ms;
        assert!(!is_fresh(&stale, &config, NOW));
        assert!(is_fresh(&edge, &config, NOW), "the age bound is inclusive");

        let chain = [1];
        let mut entries = Vec::new();
        consider(&mut entries, &[stale, edge], &request(&chain), &config, NOW);
        assert_eq!(entries.iter().map(|e| e.index).collect::<Vec<_>>(), [1]);
        consider(
            &mut entries,
            &[stale, stale],
            &request(&chain),
            &config,
            NOW,
        );
        assert_eq!(
            entries.len(),
            2,
            "stale engines still serve when nothing is fresh"
        );
    }

    #[test]
    fn keep_fresh_keeps_everything_when_nothing_is_fresh() {
        let mut rows = vec![1, 3, 5];
        keep_fresh(&mut rows, |n| n % 2 == 0);
        assert_eq!(rows, [1, 3, 5]);
        let mut rows = vec![1, 2, 3, 4];
        keep_fresh(&mut rows, |n| n % 2 == 0);
        assert_eq!(rows, [2, 4]);
    }
}
