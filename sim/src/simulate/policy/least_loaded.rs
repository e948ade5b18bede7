//! Shortest queue: the engine with the fewest requests in flight, ties broken at random.

use crate::rng::SplitMix64;

pub fn pick(loads: &[u32], rng: &mut SplitMix64) -> usize {
    let mut best = 0;
    let mut ties = 0u64;
    for (i, &load) in loads.iter().enumerate() {
        if load < loads[best] {
            best = i;
            ties = 1;
        } else if load == loads[best] {
            // Reservoir sampling over the tied minimum.
            ties += 1;
            if rng.below(ties) == 0 {
                best = i;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_a_minimum_and_spreads_ties() {
        let mut rng = SplitMix64::new(1);
        assert_eq!(pick(&[3, 1, 2], &mut rng), 1);
        let mut seen = [0; 3];
        for _ in 0..300 {
            seen[pick(&[0, 5, 0], &mut rng)] += 1;
        }
        assert_eq!(seen[1], 0);
        assert!(seen[0] > 100 && seen[2] > 100, "{seen:?}");
    }
}
