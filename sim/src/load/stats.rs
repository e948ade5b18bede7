//! Summary statistics (mean and linearly interpolated percentiles, like numpy's default).

use serde::{Deserialize, Serialize};

/// Distribution summary of one metric, in seconds. Fields are `null` when `count` is 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Arithmetic mean.
    pub mean: Option<f64>,
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Largest sample.
    pub max: Option<f64>,
}

/// Summarises `values` (sorted in place).
pub fn summarize(values: &mut [f64]) -> Summary {
    if values.is_empty() {
        return Summary {
            count: 0,
            mean: None,
            p50: None,
            p90: None,
            p99: None,
            max: None,
        };
    }
    values.sort_by(f64::total_cmp);
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    Summary {
        count: values.len(),
        mean: Some(mean),
        p50: Some(percentile(values, 50.0)),
        p90: Some(percentile(values, 90.0)),
        p99: Some(percentile(values, 99.0)),
        max: values.last().copied(),
    }
}

/// The `q`-th percentile of sorted `v` with linear interpolation between closest ranks.
pub fn percentile(v: &[f64], q: f64) -> f64 {
    debug_assert!(!v.is_empty());
    let pos = (q / 100.0) * (v.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_match_numpy() {
        let mut v: Vec<f64> = (1..=10).map(f64::from).collect();
        let s = summarize(&mut v);
        assert_eq!(s.count, 10);
        assert_eq!(s.mean, Some(5.5));
        assert_eq!(s.p50, Some(5.5));
        assert!((s.p90.unwrap() - 9.1).abs() < 1e-12);
        assert!((s.p99.unwrap() - 9.91).abs() < 1e-12);
        assert_eq!(s.max, Some(10.0));
        assert_eq!(summarize(&mut []).mean, None);
    }
}
