//! Consistent hashing with bounded loads (Mirrokni et al.; KubeAI's prefix routing) keyed on
//! the prompt's first block: walk the ring clockwise from the key and take the first engine
//! whose load, with this request, stays within `ceil((1 + ε) × mean)`.

use kvmesh_protocol::mix64;

/// Virtual points per engine on the ring.
const POINTS_PER_NODE: u32 = 100;

#[derive(Debug)]
pub struct Ring {
    points: Vec<(u64, u32)>,
}

impl Ring {
    pub fn new(node_keys: &[u64]) -> Self {
        let mut points: Vec<(u64, u32)> = node_keys
            .iter()
            .enumerate()
            .flat_map(|(i, &key)| {
                (0..POINTS_PER_NODE).map(move |v| (mix64(key ^ mix64(u64::from(v))), i as u32))
            })
            .collect();
        points.sort_unstable();
        Self { points }
    }

    /// How many engines the ring was made of.
    pub fn nodes(&self) -> usize {
        self.points.len() / POINTS_PER_NODE as usize
    }

    /// The engine for `key` given the loads in flight.
    pub fn pick(&self, key: u64, loads: &[u32], epsilon: f64) -> usize {
        let total: u64 = loads.iter().map(|&l| u64::from(l)).sum();
        let cap = ((1.0 + epsilon) * (total + 1) as f64 / loads.len() as f64).ceil();
        let start = self.points.partition_point(|&(p, _)| p < mix64(key));
        let len = self.points.len();
        (0..len)
            .map(|i| self.points[(start + i) % len].1 as usize)
            .find(|&node| f64::from(loads[node]) + 1.0 <= cap)
            .unwrap_or(self.points[start % len].1 as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_key_same_engine_until_it_is_over_the_bound() {
        let ring = Ring::new(&[11, 22, 33, 44]);
        let idle = [0u32; 4];
        let home = ring.pick(7, &idle, 0.25);
        assert_eq!(ring.pick(7, &idle, 0.25), home);
        let mut loads = [1u32; 4];
        loads[home] = 3; // mean with this request = 7/4, cap = ceil(2.19) = 3: over
        let spill = ring.pick(7, &loads, 0.25);
        assert_ne!(spill, home);
    }
}
