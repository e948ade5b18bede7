//! Axes: a value range with a linear or logarithmic scale, and its ticks.

/// Axis scaling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Linear.
    Linear,
    /// Base-10 logarithmic (a value ≤ 0 counts as 1e-9).
    Log,
}

/// The range `lo..=hi` of an axis on its scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Axis {
    pub scale: Scale,
    pub lo: f64,
    pub hi: f64,
}

impl Axis {
    /// The range the data `lo..=hi` spans, widened to a unit of the scale (× 10 on a log
    /// scale) when it is a single value.
    pub fn spanning(scale: Scale, lo: f64, hi: f64) -> Self {
        let (a, b) = (scale.transform(lo), scale.transform(hi));
        let b = if b - a < 1e-9 { a + 1.0 } else { b };
        Self {
            scale,
            lo: scale.inverse(a),
            hi: scale.inverse(b),
        }
    }

    /// Where `v` falls along the axis: 0 at `lo`, 1 at `hi`.
    pub fn fraction(&self, v: f64) -> f64 {
        let (lo, hi) = (self.scale.transform(self.lo), self.scale.transform(self.hi));
        (self.scale.transform(v) - lo) / (hi - lo)
    }

    /// The value at `fraction` of the axis.
    pub fn value_at(&self, fraction: f64) -> f64 {
        let (lo, hi) = (self.scale.transform(self.lo), self.scale.transform(self.hi));
        self.scale.inverse(lo + (hi - lo) * fraction)
    }

    /// `n + 1` ticks evenly spaced on the scale, from `lo` to `hi`.
    pub fn even_ticks(&self, n: usize) -> Vec<f64> {
        (0..=n)
            .map(|i| self.value_at(i as f64 / n as f64))
            .collect()
    }

    /// Round ticks: about five from `lo` to `hi`, or the powers of ten on a log scale.
    pub fn round_ticks(&self) -> Vec<f64> {
        match self.scale {
            Scale::Linear => linear_ticks(self.lo, self.hi),
            Scale::Log => log_ticks(self.lo, self.hi),
        }
    }
}

impl Scale {
    fn transform(self, v: f64) -> f64 {
        match self {
            Scale::Linear => v,
            Scale::Log => v.max(1e-9).log10(),
        }
    }

    fn inverse(self, t: f64) -> f64 {
        match self {
            Scale::Linear => t,
            Scale::Log => 10f64.powf(t),
        }
    }
}

/// The smallest of 1, 2, 2.5, 5 × 10^k that is ≥ `v`.
pub fn nice_ceil(v: f64) -> f64 {
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * p >= v * (1.0 - 1e-9) {
            return m * p;
        }
    }
    10.0 * p
}

/// About five round ticks from `lo` to `hi`.
pub fn linear_ticks(lo: f64, hi: f64) -> Vec<f64> {
    if hi <= lo {
        return vec![lo];
    }
    let step = nice_ceil((hi - lo) / 5.0);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 {
        out.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    out
}

/// Powers of ten from `lo` to `hi`.
pub fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (a, b) = (lo.log10().round() as i32, hi.log10().round() as i32);
    (a..=b).map(|k| 10f64.powi(k)).collect()
}

/// A tick label of a few characters: `1.2M`, `3.4k`, `12`, `1.5`, `0.25`, `0.003`.
pub fn short_number(v: f64) -> String {
    match v.abs() {
        a if a >= 1e6 => format!("{:.1}M", v / 1e6),
        a if a >= 1e3 => format!("{:.1}k", v / 1e3),
        a if a >= 10.0 || a == 0.0 => format!("{v:.0}"),
        a if a >= 1.0 => format!("{v:.1}"),
        a if a >= 0.1 => format!("{v:.2}"),
        _ => format!("{v:.3}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_numbers_and_ticks() {
        assert_eq!(nice_ceil(0.73), 1.0);
        assert_eq!(nice_ceil(3.1), 5.0);
        assert_eq!(nice_ceil(120.0), 200.0);
        assert_eq!(
            linear_ticks(0.0, 1.0),
            vec![0.0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0]
        );
        assert_eq!(log_ticks(0.001, 10.0).len(), 5);
        assert_eq!(short_number(2_500.0), "2.5k");
        assert_eq!(short_number(0.25), "0.25");
    }

    #[test]
    fn axes_map_both_scales_and_widen_a_single_value() {
        let log = Axis::spanning(Scale::Log, 10.0, 1000.0);
        assert!((log.fraction(100.0) - 0.5).abs() < 1e-12);
        assert!((log.value_at(0.5) - 100.0).abs() < 1e-9);
        let lin = Axis::spanning(Scale::Linear, 2.0, 2.0);
        assert_eq!((lin.lo, lin.hi), (2.0, 3.0));
        assert_eq!(lin.even_ticks(4), vec![2.0, 2.25, 2.5, 2.75, 3.0]);
        let point = Axis::spanning(Scale::Log, 5.0, 5.0);
        assert!((point.hi / point.lo - 10.0).abs() < 1e-9);
    }
}
