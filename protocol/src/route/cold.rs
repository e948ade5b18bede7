//! Stage 3, a new prefix's placement: when no candidate holds the prompt's first blocks, every
//! entry node must send it to the same engine without talking to the others. Its choices are
//! the engines with the highest rendezvous weights on its first block (`cold_choices`, more
//! where prompts do not share prefixes, and then every engine gossip shows idle too), among
//! those readiest for its adapter; the least loaded choice by gossip's shared count wins.

use super::config::{ColdPrefixes, HitRules};
use super::considered::Considered;
use super::decide::RouteRequest;
use super::rendezvous::rendezvous_weight;
use crate::digest::LoraReadiness;

/// Whether `request` is a new prefix: it has blocks, and no candidate holds `min_hit_blocks`
/// of them (`best_matched` is the most any holds).
pub(super) fn is_new_prefix(request: &RouteRequest<'_>, best_matched: u32, hit: &HitRules) -> bool {
    !request.chain.is_empty() && best_matched < hit.min_blocks
}

/// Where a new prefix may go, and how its choices rank.
#[derive(Copy, Clone, Debug)]
pub(super) struct ColdChoices {
    /// The prefix's first block: the rendezvous key.
    first_block: u64,
    /// The lowest rendezvous weight of a choice.
    floor: u64,
    /// The readiness for the request's adapter of the readiest candidate.
    best_ready: LoraReadiness,
    /// Engines gossip shows idle are choices too.
    idle_choices: bool,
    /// The load up to which a choice counts as least loaded.
    margin: u32,
}

impl ColdChoices {
    /// The choices of `request`'s first block among `entries`; `weights` is scratch. The
    /// request must have a block.
    pub(super) fn new(
        weights: &mut Vec<u64>,
        entries: &[Considered],
        request: &RouteRequest<'_>,
        config: &ColdPrefixes,
    ) -> Self {
        let first_block = request.chain[0];
        let best_ready = entries
            .iter()
            .map(|e| e.ready)
            .max()
            .unwrap_or(LoraReadiness::Running);
        weights.clear();
        weights.extend(
            entries
                .iter()
                .filter(|e| e.ready == best_ready)
                .map(|e| rendezvous_weight(first_block, e.node_key)),
        );
        let choices = match request.prefixes_recur {
            true => config.choices,
            false => config.choices.max(config.unshared_choices),
        };
        let choices = (choices.max(1) as usize).min(weights.len());
        // The `choices`-th highest weight, without sorting all of them.
        let floor = *weights
            .select_nth_unstable_by(choices - 1, |a, b| b.cmp(a))
            .1;
        let mut cold = ColdChoices {
            first_block,
            floor,
            best_ready,
            idle_choices: !request.prefixes_recur && config.unshared_to_idle,
            margin: 0,
        };
        cold.margin = cold.margin(entries, request, config);
        cold
    }

    /// The least load among the choices: a choice counts as busier only beyond it plus the
    /// margin, so that entry nodes whose views differ by a request or so (one reads its own
    /// engine live, the others through gossip) still agree. Where prefixes do not recur, no
    /// margin: nothing is gained by agreeing, and a request more is a request more.
    fn margin(
        &self,
        entries: &[Considered],
        request: &RouteRequest<'_>,
        config: &ColdPrefixes,
    ) -> u32 {
        let lightest = entries
            .iter()
            .filter(|e| self.is_choice(e))
            .map(|e| e.shared_load)
            .min()
            .unwrap_or(0);
        match request.prefixes_recur {
            true => lightest.saturating_add(config.load_margin),
            false => lightest,
        }
    }

    /// Whether `entry` is one of the choices.
    pub(super) fn is_choice(&self, entry: &Considered) -> bool {
        entry.ready == self.best_ready
            && (rendezvous_weight(self.first_block, entry.node_key) >= self.floor
                || (self.idle_choices && entry.shared_load == 0))
    }

    /// `entry`'s score: among the choices the least loaded, then the higher rendezvous weight;
    /// outside them the weight alone (below any choice: the fallback order under the bound).
    /// Loads as gossip shows them, not as this node alone knows them (its own engine live, a
    /// peer's last report): every entry node sending the same new prefix must rank its
    /// choices alike. Late binding corrects with the exact queue.
    pub(super) fn score(&self, entry: &Considered) -> f64 {
        let weight = rendezvous_weight(self.first_block, entry.node_key);
        let unit = weight as f64 / u64::MAX as f64;
        if self.is_choice(entry) {
            2.0 + unit - f64::from(entry.shared_load.saturating_sub(self.margin)) * 2.0
        } else {
            unit - f64::from(u32::MAX)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::tests::request;

    fn entry(node_key: u64, shared_load: u32) -> Considered {
        Considered {
            node_key,
            shared_load,
            ..Considered::blank(node_key)
        }
    }

    /// `entries`' node keys, best score first.
    fn order(cold: &ColdChoices, entries: &[Considered]) -> Vec<u64> {
        let mut ranked = entries.to_vec();
        ranked.sort_by(|a, b| cold.score(b).total_cmp(&cold.score(a)));
        ranked.iter().map(|e| e.node_key).collect()
    }

    /// Node keys by their rendezvous weight on `block`, highest first.
    fn by_weight(block: u64, keys: &[u64]) -> Vec<u64> {
        let mut keys = keys.to_vec();
        keys.sort_by_key(|&key| std::cmp::Reverse(rendezvous_weight(block, key)));
        keys
    }

    #[test]
    fn a_new_prefix_has_blocks_and_too_few_are_held() {
        let config = HitRules::default();
        assert!(is_new_prefix(&request(&[1]), 0, &config));
        assert!(!is_new_prefix(&request(&[1]), 1, &config));
        assert!(
            !is_new_prefix(&request(&[]), 0, &config),
            "too short to place"
        );
        let two = HitRules {
            min_blocks: 2,
            ..config
        };
        assert!(is_new_prefix(&request(&[1, 2]), 1, &two));
    }

    #[test]
    fn with_one_choice_the_highest_weight_wins_whatever_the_loads() {
        let chain = [42];
        let keys = by_weight(42, &[1, 2, 3, 4]);
        let config = ColdPrefixes::default();
        let mut weights = Vec::new();
        let entries: Vec<Considered> = keys.iter().rev().map(|&k| entry(k, 9)).collect();
        let cold = ColdChoices::new(&mut weights, &entries, &request(&chain), &config);
        assert_eq!(
            order(&cold, &entries),
            keys,
            "the choice, then the others by weight"
        );
        let entries = [entry(keys[0], 9), entry(keys[1], 0), entry(keys[2], 0)];
        let cold = ColdChoices::new(&mut weights, &entries, &request(&chain), &config);
        assert!(cold.is_choice(&entries[0]) && !cold.is_choice(&entries[1]));
        assert_eq!(
            order(&cold, &entries)[0],
            keys[0],
            "lighter engines are no choices"
        );
    }

    #[test]
    fn of_two_choices_the_lighter_beyond_the_margin_wins() {
        let chain = [7];
        let keys = by_weight(7, &[1, 2, 3, 4]);
        let config = ColdPrefixes {
            choices: 2,
            load_margin: 1,
            ..ColdPrefixes::default()
        };
        let mut weights = Vec::new();
        let mut with_loads = |first: u32, second: u32| {
            let entries = [
                entry(keys[0], first),
                entry(keys[1], second),
                entry(keys[2], 0),
                entry(keys[3], 0),
            ];
            let cold = ColdChoices::new(&mut weights, &entries, &request(&chain), &config);
            assert!(!cold.is_choice(&entries[2]) && !cold.is_choice(&entries[3]));
            order(&cold, &entries)[..2].to_vec()
        };
        assert_eq!(
            with_loads(1, 0),
            [keys[0], keys[1]],
            "within the margin: by weight"
        );
        assert_eq!(
            with_loads(2, 0),
            [keys[1], keys[0]],
            "beyond it: the lighter"
        );
        assert_eq!(with_loads(0, 3), [keys[0], keys[1]]);
    }

    #[test]
    fn where_prefixes_do_not_recur_idle_engines_are_choices_too() {
        let chain = [3];
        let keys = by_weight(3, &[1, 2, 3, 4]);
        let entries = [
            entry(keys[0], 2),
            entry(keys[1], 1),
            entry(keys[2], 0),
            entry(keys[3], 5),
        ];
        let unshared = RouteRequest {
            prefixes_recur: false,
            ..request(&chain)
        };
        let mut weights = Vec::new();
        let config = ColdPrefixes::default();
        let cold = ColdChoices::new(&mut weights, &entries, &unshared, &config);
        let choices: Vec<bool> = entries.iter().map(|e| cold.is_choice(e)).collect();
        assert_eq!(choices, [true, false, true, false]);
        assert_eq!(
            order(&cold, &entries)[0],
            keys[2],
            "the idle one, with no margin"
        );
        let off = ColdPrefixes {
            unshared_to_idle: false,
            ..config
        };
        let cold = ColdChoices::new(&mut weights, &entries, &unshared, &off);
        assert_eq!(order(&cold, &entries)[0], keys[0]);
    }

    #[test]
    fn an_adapters_choices_are_among_the_readiest() {
        let chain = [5];
        let keys = by_weight(5, &[1, 2]);
        let entries = [
            Considered {
                ready: LoraReadiness::NoSlot,
                ..entry(keys[0], 0)
            },
            Considered {
                ready: LoraReadiness::FreeSlot,
                ..entry(keys[1], 0)
            },
        ];
        let mut weights = Vec::new();
        let cold = ColdChoices::new(
            &mut weights,
            &entries,
            &request(&chain),
            &ColdPrefixes::default(),
        );
        assert!(!cold.is_choice(&entries[0]));
        assert_eq!(order(&cold, &entries)[0], keys[1]);
    }
}
