//! Rendezvous (highest-random-weight) hashing: every node computes the same ranking of
//! candidates for a key without talking to anyone, and removing a candidate only moves the
//! keys that were on it.

use crate::mix::mix64;

/// A node's stable 64-bit identity, from its node id.
pub fn node_key(node_id: &str) -> u64 {
    let digest = blake3::hash(node_id.as_bytes());
    u64::from_le_bytes(digest.as_bytes()[..8].try_into().expect("8 of 32 bytes"))
}

/// The weight of `node` for `key`; the highest weight wins.
#[inline]
pub fn rendezvous_weight(key: u64, node: u64) -> u64 {
    mix64(key ^ mix64(node))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_evenly_over_nodes() {
        let nodes: Vec<u64> = (0..8).map(|i| node_key(&format!("node-{i}"))).collect();
        let mut counts = [0u32; 8];
        for key in 0..80_000u64 {
            let winner = (0..8)
                .max_by_key(|&i| rendezvous_weight(mix64(key), nodes[i]))
                .unwrap();
            counts[winner] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
    }
}
