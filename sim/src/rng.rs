//! A tiny deterministic random number generator (SplitMix64).
//!
//! The engine model and the workloads must give the same answers for the same seed on every
//! platform and every version of every dependency, so they use this generator instead of a
//! crate whose algorithm may change between releases. Its finalizer is the protocol's
//! [`mix64`], which the simulator also uses directly to hash ids.

use kvmesh_protocol::mix64;

/// SplitMix64 generator: one `u64` of state, deterministic from its seed.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.state)
    }

    /// A uniform float in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform integer in `[0, n)`; `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        // Lemire's multiply-shift; the tiny bias is irrelevant for workload generation.
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// An exponentially distributed float with the given rate (mean `1/rate`).
    pub fn exponential(&mut self, rate: f64) -> f64 {
        // 1 - U is in (0, 1], so the logarithm is finite.
        -(1.0 - self.next_f64()).ln() / rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_and_different_seeds_differ() {
        let a: Vec<u64> = {
            let mut r = SplitMix64::new(7);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let mut r = SplitMix64::new(7);
        let b: Vec<u64> = (0..4).map(|_| r.next_u64()).collect();
        assert_eq!(a, b);
        let mut r = SplitMix64::new(8);
        assert_ne!(a[0], r.next_u64());
    }

    #[test]
    fn below_and_f64_stay_in_range() {
        let mut r = SplitMix64::new(1);
        for _ in 0..10_000 {
            assert!(r.below(10) < 10);
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
            assert!(r.exponential(2.0) >= 0.0);
        }
    }
}
