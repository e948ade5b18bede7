//! Zipf-popular choices: rank `r` (from 1) drawn with weight `1 / r^s`.

/// A Zipf distribution over `0..n`, by its cumulative weights.
#[derive(Debug, Clone)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// Over `n` items (at least one) with exponent `s`.
    pub fn new(n: u32, s: f64) -> Self {
        let n = n.max(1) as usize;
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0;
        for rank in 1..=n {
            acc += 1.0 / (rank as f64).powf(s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Self { cdf }
    }

    /// Items to choose from.
    pub fn len(&self) -> usize {
        self.cdf.len()
    }

    /// Never: a distribution has at least one item.
    pub fn is_empty(&self) -> bool {
        self.cdf.is_empty()
    }

    /// The item a uniform `u` in `[0, 1)` falls on (item 0 is the most popular).
    pub fn pick(&self, u: f64) -> u32 {
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_items_take_their_share() {
        let zipf = Zipf::new(4, 1.0);
        // Weights 1, 1/2, 1/3, 1/4 of 25/12.
        assert_eq!(zipf.pick(0.0), 0);
        assert_eq!(zipf.pick(0.47), 0);
        assert_eq!(zipf.pick(0.49), 1);
        assert_eq!(zipf.pick(0.999_999), 3);
        assert_eq!(Zipf::new(0, 1.0).len(), 1);
        assert_eq!(Zipf::new(3, 0.0).pick(0.5), 1, "exponent 0 is uniform");
    }
}
