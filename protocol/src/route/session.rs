//! Stage 6, session affinity, a soft preference: a request that carries a session key (a
//! session header or the `user` field) prefers the engine with the highest rendezvous weight
//! on it by a bonus, which a better match or a shorter queue still outweighs. A new prefix
//! gets no bonus: it goes where every entry node sends it.

use super::config::{RouteConfig, ScoreForm};
use super::considered::Considered;
use super::decide::RouteRequest;
use super::rendezvous::rendezvous_weight;

/// The session's preferred engine and the bonus it gets.
#[derive(Copy, Clone, Debug, PartialEq)]
pub(super) struct Session {
    /// The preferred engine's node key; `None` without a session key.
    pub node: Option<u64>,
    /// Its bonus, in the score's units.
    bonus: f64,
}

impl Session {
    /// `request`'s session among `entries`; `new_prefix`: no bonus.
    pub(super) fn new(
        entries: &[Considered],
        request: &RouteRequest<'_>,
        config: &RouteConfig,
        new_prefix: bool,
    ) -> Self {
        Session {
            node: request.session.map(|session| preferred(entries, session)),
            bonus: if new_prefix {
                0.0
            } else {
                bonus(request, config)
            },
        }
    }

    /// The bonus `entry` gets.
    pub(super) fn bonus_for(&self, entry: &Considered) -> f64 {
        match self.node {
            Some(node) if node == entry.node_key => self.bonus,
            _ => 0.0,
        }
    }
}

/// The node key of the entry with the highest rendezvous weight on `session` (ties: the
/// higher key), 0 with no entries.
fn preferred(entries: &[Considered], session: u64) -> u64 {
    entries
        .iter()
        .max_by_key(|e| (rendezvous_weight(session, e.node_key), e.node_key))
        .map_or(0, |e| e.node_key)
}

/// The session bonus, in the form's units: score units, or (cost form) that fraction of the
/// whole prompt's prefill time.
fn bonus(request: &RouteRequest<'_>, config: &RouteConfig) -> f64 {
    match config.form {
        ScoreForm::Score => config.soft.session_weight,
        ScoreForm::Cost => {
            config.soft.session_weight * f64::from(request.prompt_tokens)
                / config.assumed.default_prefill_tokens_per_s.max(1.0)
                * 1000.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::tests::request;

    fn entries(keys: &[u64]) -> Vec<Considered> {
        keys.iter().map(|&key| Considered::blank(key)).collect()
    }

    #[test]
    fn the_preferred_engine_is_the_sessions_rendezvous_winner_and_only_it_gains() {
        let entries = entries(&[11, 22, 33, 44]);
        let chain = [1, 2];
        let config = RouteConfig::default();
        for key in [5, 6, 7] {
            let with_session = RouteRequest {
                session: Some(key),
                ..request(&chain)
            };
            let session = Session::new(&entries, &with_session, &config, false);
            let best = *[11, 22, 33, 44]
                .iter()
                .max_by_key(|&&node| rendezvous_weight(key, node))
                .unwrap();
            assert_eq!(session.node, Some(best));
            for entry in &entries {
                let expected = if entry.node_key == best { 0.3 } else { 0.0 };
                assert_eq!(session.bonus_for(entry), expected);
            }
            let cold = Session::new(&entries, &with_session, &config, true);
            assert_eq!(cold.node, Some(best), "still named, for the reason");
            assert!(entries.iter().all(|e| cold.bonus_for(e) == 0.0));
        }
        let none = Session::new(&entries, &request(&chain), &config, false);
        assert_eq!(none.node, None);
        assert!(entries.iter().all(|e| none.bonus_for(e) == 0.0));
    }

    #[test]
    fn in_the_cost_form_the_bonus_is_a_share_of_the_prompts_prefill() {
        // 64 tokens at 5,000 tokens/s: 12.8 ms, of which 0.3.
        let chain = [1, 2, 3, 4];
        let config = RouteConfig {
            form: ScoreForm::Cost,
            ..RouteConfig::default()
        };
        assert!((bonus(&request(&chain), &config) - 0.3 * 12.8).abs() < 1e-9);
        assert_eq!(bonus(&request(&chain), &RouteConfig::default()), 0.3);
    }
}
