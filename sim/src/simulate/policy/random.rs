//! Uniformly random engine.

use crate::rng::SplitMix64;

pub fn pick(rng: &mut SplitMix64, nodes: usize) -> usize {
    rng.below(nodes as u64) as usize
}
