//! Power of two choices: the less loaded of two engines drawn at random.

use crate::rng::SplitMix64;

pub fn pick(loads: &[u32], rng: &mut SplitMix64) -> usize {
    let n = loads.len() as u64;
    let a = rng.below(n) as usize;
    let b = rng.below(n) as usize;
    if loads[b] < loads[a] { b } else { a }
}
