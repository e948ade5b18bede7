//! The one percentile definition of kvmesh: the load generator's measured latencies, the
//! simulator's and the node's CLI figures (`kvmesh intents`) alike, so that a simulated p99
//! compares with a measured one.
//!
//! Linear interpolation between the closest ranks: numpy's default (`method="linear"`), R's
//! type 7. The q-quantile of n sorted values sits at rank q · (n − 1), so q = 0 is the
//! smallest value, q = 1 the largest, and the median of an even count is the mean of the
//! middle two. The JSON reports name it in their `percentile_method` field ([`METHOD`]).

/// The definition's name in the JSON reports.
pub const METHOD: &str = "linear";

/// The `q`-quantile (`q` in 0..=1, clamped) of `sorted` (ascending); 0 when it is empty.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    let Some(rank) = rank(sorted.len() as u64, q) else {
        return 0.0;
    };
    let (lo, hi, weight) = rank.bounds();
    sorted[lo as usize] + (sorted[hi as usize] - sorted[lo as usize]) * weight
}

/// Where the `q`-quantile of `count` values sits: between the values of ranks `lo` and `hi`
/// (0-based, `hi` = `lo` or `lo + 1`), `weight` of the way to `hi`. Lets a structure that does
/// not keep its values one by one (a histogram) follow the same definition.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rank {
    position: f64,
}

impl Rank {
    /// `(lo, hi, weight)`.
    pub fn bounds(self) -> (u64, u64, f64) {
        let lo = self.position.floor();
        (lo as u64, self.position.ceil() as u64, self.position - lo)
    }
}

/// The rank of the `q`-quantile among `count` values; `None` when there are none.
pub fn rank(count: u64, q: f64) -> Option<Rank> {
    (count > 0).then(|| Rank {
        position: q.clamp(0.0, 1.0) * (count - 1) as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_numpy_linear() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        // numpy.percentile(range(1, 11), [0, 50, 90, 99, 100])
        for (q, want) in [
            (0.0, 1.0),
            (0.5, 5.5),
            (0.9, 9.1),
            (0.99, 9.91),
            (1.0, 10.0),
        ] {
            assert!((quantile(&v, q) - want).abs() < 1e-12, "{q}");
        }
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
        assert_eq!(quantile(&[1.0, 2.0], 7.0), 2.0, "q is clamped");
    }
}
