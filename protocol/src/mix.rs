//! [`mix64`]: the one 64-bit integer mixer of kvmesh, for rendezvous weights here and, in the
//! simulator, its deterministic random numbers, token ids and spreads.

/// SplitMix64's finalizer: a bijective 64-bit permutation with good avalanche (every input bit
/// flips each output bit with probability about 1/2). Not a cryptographic hash: it mixes
/// values that are already ids or hashes, and is fixed forever, since the simulator's seeds and
/// the nodes' rendezvous rankings depend on its exact output.
#[inline]
pub fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_splitmix64_reference() {
        // SplitMix64 seeded with 0: its outputs are mix64 of successive multiples of the
        // golden gamma (Vigna's reference, splitmix64.c).
        let gamma = 0x9e37_79b9_7f4a_7c15_u64;
        assert_eq!(mix64(gamma), 0xe220_a839_7b1d_cdaf);
        assert_eq!(mix64(gamma.wrapping_mul(2)), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(mix64(0), 0);
    }
}
