//! Poisson arrival times, the same for the load generator and the simulator under one seed.

use crate::rng::SplitMix64;

/// Arrival times of a Poisson process at `rate` requests per second: seconds after the start,
/// increasing, endless.
#[derive(Debug, Clone)]
pub struct Poisson {
    rng: SplitMix64,
    rate: f64,
    clock_s: f64,
}

impl Poisson {
    /// The arrivals of a run with `seed`.
    pub fn new(rate: f64, seed: u64) -> Self {
        Self {
            rng: SplitMix64::new(seed ^ 0x6172_7269_7661_6c73),
            rate: rate.max(1e-9),
            clock_s: 0.0,
        }
    }
}

impl Iterator for Poisson {
    type Item = f64;

    fn next(&mut self) -> Option<f64> {
        self.clock_s += self.rng.exponential(self.rate);
        Some(self.clock_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_increase_at_the_rate_and_follow_the_seed() {
        let times: Vec<f64> = Poisson::new(50.0, 1).take(5_000).collect();
        assert!(times.windows(2).all(|w| w[0] < w[1]));
        let rate = 5_000.0 / times[4_999];
        assert!((45.0..55.0).contains(&rate), "{rate}");
        assert_eq!(
            times[..10],
            Poisson::new(50.0, 1).take(10).collect::<Vec<_>>()
        );
        assert_ne!(times[0], Poisson::new(50.0, 2).next().unwrap());
    }
}
