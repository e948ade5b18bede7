//! Bloom-filter geometry over chain hashes. The hashes are already uniform (blake3), so the
//! probe positions come straight from their bits (Kirsch–Mitzenmacher double hashing); no
//! rehashing is needed.

/// Probes per hash. 7 is the optimum for a ~1% false-match rate.
pub const PROBES: u8 = 7;

/// The false-match rate the advertised capacity is computed for. Lower than the 1% promised
/// because shards fill unevenly (hashes are random): the fullest shards run above the mean.
pub const DESIGN_FALSE_MATCH_RATE: f64 = 0.007;

/// Hashes a filter of `bits` bits holds at [`DESIGN_FALSE_MATCH_RATE`] with [`PROBES`] probes:
/// solves `(1 - e^{-kn/m})^k = p` for n.
pub fn capacity(bits: usize) -> usize {
    let k = f64::from(PROBES);
    let per_probe = DESIGN_FALSE_MATCH_RATE.powf(1.0 / k);
    (-(bits as f64) / k * (1.0 - per_probe).ln()).floor() as usize
}

/// Probe positions of `hash` in a filter of `bits` bits (a power of two).
#[inline]
pub fn positions(hash: u64, bits: usize, probes: u8) -> impl Iterator<Item = usize> {
    let mask = bits as u64 - 1;
    let h1 = hash & 0xffff_ffff;
    // Bits 27..59 (below the shard selector); odd, so successive probes never repeat early.
    let h2 = ((hash >> 27) & 0xffff_ffff) | 1;
    (0..u64::from(probes)).map(move |i| (h1.wrapping_add(i.wrapping_mul(h2)) & mask) as usize)
}

#[inline]
pub fn insert(words: &mut [u64], hash: u64, probes: u8) {
    for pos in positions(hash, words.len() * 64, probes) {
        words[pos / 64] |= 1 << (pos % 64);
    }
}

#[inline]
pub fn contains(words: &[u64], hash: u64, probes: u8) -> bool {
    positions(hash, words.len() * 64, probes).all(|pos| words[pos / 64] & (1 << (pos % 64)) != 0)
}

/// Expected false-match rate of a filter with this many bits set.
pub fn false_match_rate(words: &[u64], probes: u8) -> f64 {
    let set: u32 = words.iter().map(|w| w.count_ones()).sum();
    (f64::from(set) / (words.len() * 64) as f64).powi(i32::from(probes))
}

/// Hashes a filter holds, estimated from its fill (Swamidass and Baldi):
/// `n ≈ -(m/k) ln(1 - X/m)` for `X` of `m` bits set with `k` probes. A full filter says only
/// "at least this many": the estimate is capped where one bit in `m` is still clear.
pub fn estimated_count(words: &[u64], probes: u8) -> usize {
    let bits = (words.len() * 64) as f64;
    if bits == 0.0 || probes == 0 {
        return 0;
    }
    let set: u32 = words.iter().map(|w| w.count_ones()).sum();
    let clear = (bits - f64::from(set)).max(1.0);
    (-(bits / f64::from(probes)) * (clear / bits).ln()).round() as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_estimate_is_within_five_percent_up_to_capacity() {
        let mut state = 0x1234_5678_u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            state ^ (state >> 29)
        };
        let capacity = capacity(8192);
        for n in [0, 10, 100, capacity / 2, capacity] {
            let mut words = vec![0u64; 128];
            for _ in 0..n {
                insert(&mut words, next(), PROBES);
            }
            let estimate = estimated_count(&words, PROBES);
            let error = (estimate as f64 - n as f64).abs();
            assert!(
                error <= (n as f64 * 0.05).max(2.0),
                "{n} inserted, estimated {estimate}"
            );
        }
        // Full: capped at (m/k) ln m, finite.
        assert_eq!(estimated_count(&[u64::MAX; 128], PROBES), 10545);
    }

    #[test]
    fn capacity_of_one_kib_is_near_eight_hundred() {
        let n = capacity(8192);
        assert!((780..=800).contains(&n), "capacity {n}");
    }

    #[test]
    fn inserted_hashes_are_found() {
        let mut words = vec![0u64; 128];
        let hashes: Vec<u64> = (0..500u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        for &h in &hashes {
            insert(&mut words, h, PROBES);
        }
        assert!(hashes.iter().all(|&h| contains(&words, h, PROBES)));
    }
}
