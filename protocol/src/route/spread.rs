//! Stage 7, spread among near-equal engines: candidates whose score is within
//! `spread_margin` of the best are a band, and a request that carries a spread key goes to one
//! of them by rendezvous on that key rather than always to the best, so that entry nodes with
//! the same view do not all send a hot prefix to the same holder until the load bound stops
//! them. Inside the band an engine with room for the prompt goes first, then one idle now.

use super::config::{RouteConfig, ScoreForm};
use super::considered::Considered;
use super::decide::RouteRequest;
use super::rendezvous::rendezvous_weight;

/// An engine's order inside the band: whether it takes the request without evicting,
/// whether it is idle now, then the request's rendezvous weight on it. Higher goes first.
pub(super) type Band = (bool, bool, u64);

/// The key `request` spreads by: none for a new prefix, which must land where every entry
/// node sends it.
pub(super) fn key(request: &RouteRequest<'_>, new_prefix: bool) -> Option<u64> {
    request.spread.filter(|_| !new_prefix)
}

/// The lowest score still near-equal to `best`: `spread_margin` score units below it, or (cost
/// form, where the score is minus the estimated TTFT) that fraction of the best TTFT.
pub(super) fn band_floor(best: f64, config: &RouteConfig) -> f64 {
    let margin = config.soft.spread_margin.max(0.0);
    match config.form {
        ScoreForm::Score => best - margin,
        ScoreForm::Cost => best - margin * best.abs(),
    }
}

/// `entry`'s place in the band of a request spread by `key`.
pub(super) fn band(entry: &Considered, key: u64) -> Band {
    (
        entry.evicts_nothing,
        entry.idle_now,
        rendezvous_weight(key, entry.node_key),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::SoftPreferences;
    use crate::route::tests::request;

    #[test]
    fn a_new_prefix_is_never_spread() {
        let chain = [1];
        let spread = RouteRequest {
            spread: Some(9),
            ..request(&chain)
        };
        assert_eq!(key(&spread, false), Some(9));
        assert_eq!(key(&spread, true), None);
        assert_eq!(key(&request(&chain), false), None);
    }

    #[test]
    fn the_band_is_a_margin_below_the_best_or_a_fraction_of_the_best_ttft() {
        let score = RouteConfig::default();
        assert!((band_floor(0.9, &score) - 0.85).abs() < 1e-12);
        let cost = RouteConfig {
            form: ScoreForm::Cost,
            soft: SoftPreferences {
                spread_margin: 0.1,
                ..score.soft
            },
            ..score
        };
        assert!((band_floor(-200.0, &cost) - -220.0).abs() < 1e-9);
        let negative = RouteConfig {
            soft: SoftPreferences {
                spread_margin: -1.0,
                ..score.soft
            },
            ..score
        };
        assert_eq!(band_floor(0.5, &negative), 0.5, "a negative margin is none");
    }

    #[test]
    fn room_then_idleness_then_the_rendezvous_order_the_band() {
        let roomy = Considered {
            evicts_nothing: true,
            ..Considered::blank(1)
        };
        let idle = Considered {
            idle_now: true,
            ..Considered::blank(2)
        };
        let (a, b) = (Considered::blank(3), Considered::blank(4));
        assert!(band(&roomy, 7) > band(&idle, 7));
        assert!(band(&idle, 7) > band(&a, 7).max(band(&b, 7)));
        let by_weight = rendezvous_weight(7, 3) > rendezvous_weight(7, 4);
        assert_eq!(band(&a, 7) > band(&b, 7), by_weight);
    }
}
