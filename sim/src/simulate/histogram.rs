//! [`LogHistogram`]: latencies too many to keep one by one (every inter-token gap of a run),
//! counted in buckets 1 % wide, so a percentile is off by at most 1 %.

use crate::quantile;

/// Smallest value told apart, seconds (a smaller one counts in the first bucket).
const FLOOR_S: f64 = 1e-5;
/// Relative width of a bucket.
const GROWTH: f64 = 1.01;
/// Buckets from [`FLOOR_S`] up: 1e-5 · 1.01^2,800 ≈ 1.3e7 s, past any simulated gap.
const BUCKETS: usize = 2_800;

/// Counts of values (seconds) in geometric buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct LogHistogram {
    counts: Vec<u64>,
    total: u64,
    sum: f64,
}

impl Default for LogHistogram {
    fn default() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            total: 0,
            sum: 0.0,
        }
    }
}

impl LogHistogram {
    /// Counts `value` seconds (negative or NaN counts as zero).
    pub fn observe(&mut self, value: f64) {
        let value = if value.is_finite() {
            value.max(0.0)
        } else {
            0.0
        };
        let index = if value <= FLOOR_S {
            0
        } else {
            ((value / FLOOR_S).ln() / GROWTH.ln()).ceil() as usize
        };
        self.counts[index.min(BUCKETS - 1)] += 1;
        self.total += 1;
        self.sum += value;
    }

    /// Adds `other`'s counts.
    pub fn merge(&mut self, other: &LogHistogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.total += other.total;
        self.sum += other.sum;
    }

    /// Values counted.
    pub fn len(&self) -> u64 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum / self.total as f64
        }
    }

    /// The `q`-quantile by [`crate::quantile`]'s definition, approximated: each value stands
    /// as the upper bound of its bucket, so the result is never below the exact quantile of
    /// the values counted and at most 1 % above it.
    pub fn percentile(&self, q: f64) -> f64 {
        let Some(rank) = quantile::rank(self.total, q) else {
            return 0.0;
        };
        let (lo, hi, weight) = rank.bounds();
        let (lo, hi) = (self.value_at(lo), self.value_at(hi));
        lo + (hi - lo) * weight
    }

    /// The upper bound of the bucket holding the value of 0-based rank `rank`.
    fn value_at(&self, rank: u64) -> f64 {
        let mut seen = 0;
        for (index, &count) in self.counts.iter().enumerate() {
            seen += count;
            if seen > rank {
                return FLOOR_S * GROWTH.powi(index as i32);
            }
        }
        FLOOR_S * GROWTH.powi(BUCKETS as i32 - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_within_one_percent_above_the_exact_ones() {
        let mut h = LogHistogram::default();
        let values: Vec<f64> = (1..=1000).map(|i| f64::from(i) * 1e-3).collect();
        for &v in values.iter().rev() {
            h.observe(v);
        }
        for q in [0.5, 0.99, 1.0, 0.001, 0.0] {
            let (got, exact) = (h.percentile(q), quantile::quantile(&values, q));
            assert!(
                got >= exact * (1.0 - 1e-9) && got <= exact * 1.01,
                "{q}: {got}"
            );
        }
        assert!((h.mean() - 0.5005).abs() < 1e-9);
        assert_eq!(h.len(), 1000);
    }

    #[test]
    fn merging_adds_counts_and_odd_values_stay_in_range() {
        let (mut a, mut b) = (LogHistogram::default(), LogHistogram::default());
        a.observe(0.010);
        b.observe(0.030);
        b.observe(f64::NAN);
        b.observe(1e12);
        a.merge(&b);
        assert_eq!(a.len(), 4);
        assert_eq!(a.percentile(0.0), FLOOR_S, "NaN counts as zero");
        assert!(
            a.percentile(1.0) > 1e6,
            "a huge value lands in the last bucket"
        );
        assert!(LogHistogram::default().is_empty());
        assert_eq!(LogHistogram::default().percentile(0.5), 0.0);
    }
}
