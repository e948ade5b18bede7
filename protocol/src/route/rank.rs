//! Stage 8, the ranking and its reason: under the load bound first, then inside the spread
//! band, then by score, then by node key, so that the order is total and identical on every
//! node. The reason is named by what changed the winner: the rankings that ignore the load
//! bound or the session bonus say whether either did.

use super::config::RouteConfig;
use super::considered::Considered;
use super::reason::RouteReason;
use super::score::Scored;
use super::spread::{self, Band};
use std::cmp::Ordering;

/// A ranking key: under the load bound first, then inside the spread band (near-equal to the
/// best, ordered by the request's rendezvous weight), then the score, then the node key.
#[derive(Copy, Clone, Debug)]
pub(super) struct Ranked {
    under_bound: bool,
    /// If its score is within the spread margin of the best, its place in the band.
    band: Option<Band>,
    score: f64,
    pub node_key: u64,
    /// Its position in the considered entries.
    pub entry: usize,
}

impl Ranked {
    fn cmp_rank(&self, other: &Self) -> Ordering {
        (self.under_bound.cmp(&other.under_bound))
            .then(self.band.is_some().cmp(&other.band.is_some()))
            .then(self.band.cmp(&other.band))
            .then(self.score.total_cmp(&other.score))
            .then(self.node_key.cmp(&other.node_key))
    }
}

/// Which ranking is built: the real one, or the counterfactuals that name the reason.
#[derive(Copy, Clone, Debug, PartialEq)]
enum View {
    Real,
    IgnoringBound,
    IgnoringSession,
}

impl View {
    fn key(self, scored: &Scored) -> (bool, f64) {
        match self {
            View::Real => (scored.under_bound, scored.base + scored.bonus),
            View::IgnoringBound => (true, scored.base + scored.bonus),
            View::IgnoringSession => (scored.under_bound, scored.base),
        }
    }
}

/// The scored entries of one decision, ready to rank.
pub(super) struct Ranking<'a> {
    pub entries: &'a [Considered],
    /// Per entry, its scores.
    pub scored: &'a [Scored],
    /// The key near-equal candidates share requests by (see [`spread::key`]).
    pub spread: Option<u64>,
    pub config: &'a RouteConfig,
}

impl Ranking<'_> {
    /// The best `ranked_len` (at least one) entries, best first.
    pub(super) fn top(&self) -> Vec<Ranked> {
        let keep = self.config.ranked_len.max(1);
        let mut top: Vec<Ranked> = Vec::with_capacity(keep + 1);
        self.each(View::Real, |ranked| insert_top(&mut top, ranked, keep));
        top
    }

    /// Why `chosen`, the real ranking's first, won. `new_prefix`: it was placed as one;
    /// `session_node`: the session's preferred engine; `short`: the prompt has no block.
    pub(super) fn reason(
        &self,
        chosen: &Ranked,
        new_prefix: bool,
        session_node: Option<u64>,
        short: bool,
    ) -> RouteReason {
        let other_than_chosen = |view| {
            self.best(view)
                .is_some_and(|b| b.node_key != chosen.node_key)
        };
        if self.entries.len() == 1 {
            RouteReason::OnlyCandidate
        } else if other_than_chosen(View::IgnoringBound) {
            RouteReason::LoadSpill
        } else if new_prefix {
            RouteReason::ColdHash
        } else if session_node == Some(chosen.node_key) && other_than_chosen(View::IgnoringSession)
        {
            RouteReason::Session
        } else if !short && self.entries[chosen.entry].matched >= self.config.hit.min_blocks {
            RouteReason::PrefixHit
        } else {
            RouteReason::LeastLoaded
        }
    }

    /// The winner under `view`.
    fn best(&self, view: View) -> Option<Ranked> {
        let mut best: Option<Ranked> = None;
        self.each(view, |ranked| {
            if best.is_none_or(|b| ranked.cmp_rank(&b).is_gt()) {
                best = Some(ranked);
            }
        });
        best
    }

    /// Calls `each` with every entry's ranking key under `view`: candidates within the spread
    /// margin of the best (among those with the best's bound status) are in the band.
    fn each(&self, view: View, mut each: impl FnMut(Ranked)) {
        let best = self
            .scored
            .iter()
            .map(|s| view.key(s))
            .max_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        let floor = best.map(|(bound, score)| (bound, spread::band_floor(score, self.config)));
        for (position, (entry, s)) in self.entries.iter().zip(self.scored).enumerate() {
            let (under_bound, score) = view.key(s);
            let band = match (self.spread, floor) {
                (Some(key), Some((best_bound, floor)))
                    if under_bound == best_bound && score >= floor =>
                {
                    Some(spread::band(entry, key))
                }
                _ => None,
            };
            each(Ranked {
                under_bound,
                band,
                score,
                node_key: entry.node_key,
                entry: position,
            });
        }
    }
}

/// Keeps `top` sorted best first and at most `keep` long.
fn insert_top(top: &mut Vec<Ranked>, item: Ranked, keep: usize) {
    let position = top
        .iter()
        .position(|t| item.cmp_rank(t).is_gt())
        .unwrap_or(top.len());
    if position < keep {
        top.insert(position, item);
        top.truncate(keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scored(under_bound: bool, base: f64, bonus: f64) -> Scored {
        Scored {
            under_bound,
            base,
            bonus,
        }
    }

    /// Entries with node keys 1, 2, …, `matched` blocks each.
    fn entries(matched: &[u32]) -> Vec<Considered> {
        let entry = |(i, &matched)| Considered {
            matched,
            ..Considered::blank(i as u64 + 1)
        };
        matched.iter().enumerate().map(entry).collect()
    }

    fn keys(top: &[Ranked]) -> Vec<u64> {
        top.iter().map(|r| r.node_key).collect()
    }

    #[test]
    fn the_bound_comes_before_the_score_and_the_node_key_breaks_ties() {
        let entries = entries(&[0, 0, 0, 0]);
        let scored = [
            scored(false, 0.9, 0.0),
            scored(true, 0.5, 0.0),
            scored(true, 0.7, 0.0),
            scored(true, 0.5, 0.0),
        ];
        let config = RouteConfig {
            ranked_len: 3,
            ..RouteConfig::default()
        };
        let ranking = Ranking {
            entries: &entries,
            scored: &scored,
            spread: None,
            config: &config,
        };
        let top = ranking.top();
        assert_eq!(
            keys(&top),
            [3, 4, 2],
            "under the bound by score, then the higher key"
        );
        assert_eq!(
            ranking.reason(&top[0], false, None, false),
            RouteReason::LoadSpill
        );
        let one = RouteConfig {
            ranked_len: 0,
            ..config
        };
        assert_eq!(
            Ranking {
                config: &one,
                ..ranking
            }
            .top()
            .len(),
            1
        );
    }

    #[test]
    fn a_spread_key_reorders_only_the_band_under_the_bound() {
        let entries = entries(&[0; 4]);
        let scored = [
            scored(true, 0.90, 0.0),
            scored(true, 0.88, 0.0),
            scored(true, 0.50, 0.0),
            scored(false, 0.95, 0.0),
        ];
        let config = RouteConfig::default();
        let ranking = |spread| Ranking {
            entries: &entries,
            scored: &scored,
            spread,
            config: &config,
        };
        assert_eq!(keys(&ranking(None).top()), [1, 2, 3, 4]);
        for key in 0..16 {
            let top = ranking(Some(key)).top();
            let first = if rendezvous(key, 1) > rendezvous(key, 2) {
                1
            } else {
                2
            };
            assert_eq!(top[0].node_key, first, "spread key {key}");
            assert_eq!(keys(&top)[2..], [3, 4]);
        }
    }

    fn rendezvous(key: u64, node: u64) -> u64 {
        crate::route::rendezvous_weight(key, node)
    }

    #[test]
    fn the_reason_names_what_decided() {
        let config = RouteConfig::default();
        let entries = entries(&[4, 0]);
        fn rank<'a>(
            entries: &'a [Considered],
            scored: &'a [Scored],
            config: &'a RouteConfig,
        ) -> (Ranked, Ranking<'a>) {
            let ranking = Ranking {
                entries,
                scored,
                spread: None,
                config,
            };
            (ranking.top()[0], ranking)
        }
        let plain = [scored(true, 0.9, 0.0), scored(true, 0.5, 0.0)];
        let (chosen, ranking) = rank(&entries, &plain, &config);
        assert_eq!(
            ranking.reason(&chosen, false, None, false),
            RouteReason::PrefixHit
        );
        assert_eq!(
            ranking.reason(&chosen, true, None, false),
            RouteReason::ColdHash
        );
        assert_eq!(
            ranking.reason(&chosen, false, None, true),
            RouteReason::LeastLoaded
        );
        let session = [scored(true, 0.5, 0.0), scored(true, 0.4, 0.3)];
        let (chosen, ranking) = rank(&entries, &session, &config);
        assert_eq!(chosen.node_key, 2);
        assert_eq!(
            ranking.reason(&chosen, false, Some(2), false),
            RouteReason::Session
        );
        let spill = [scored(false, 0.9, 0.0), scored(true, 0.5, 0.0)];
        let (chosen, ranking) = rank(&entries, &spill, &config);
        assert_eq!(chosen.node_key, 2);
        assert_eq!(
            ranking.reason(&chosen, true, None, false),
            RouteReason::LoadSpill
        );
        let alone = Ranking {
            entries: &entries[..1],
            scored: &plain[..1],
            spread: None,
            config: &config,
        };
        let chosen = alone.top()[0];
        assert_eq!(
            alone.reason(&chosen, false, None, false),
            RouteReason::OnlyCandidate
        );
    }
}
