//! Summary statistics: mean and percentiles ([`crate::quantile`]'s definition).

use serde::{Deserialize, Serialize};

use crate::quantile::quantile;

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
        p50: Some(quantile(values, 0.50)),
        p90: Some(quantile(values, 0.90)),
        p99: Some(quantile(values, 0.99)),
        max: values.last().copied(),
    }
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
