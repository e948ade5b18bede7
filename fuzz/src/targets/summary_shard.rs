//! `PeerSummary::apply_bytes` / `ShardWire::decode`: a peer's gossiped summary shards (rkyv
//! envelopes), applied in order as the view applies them.
//!
//! Input: [`crate::input::pieces`]; the first piece is a chain of probe hashes (u64
//! little-endian), every other piece one shard. Checks, for each shard that decodes:
//! - it round-trips (decode, encode, decode: the same shard);
//! - an exact shard contains each of its hashes and claims no false matches;
//! - once applied, the summary answers for that shard's slice of the hash space exactly as the
//!   shard does; a newer generation forgets every other slice; a stale shard changes nothing;
//! - the galloping longest match is bracketed as its doc says: never shorter than the linear
//!   walk, equal to it whenever the blocks held are a prefix of the chain, ending on a held
//!   block followed by a missing one.

use crate::input::{join, pieces};
use crate::samples;
use kvmesh_protocol::summary::{DecodedShard, PeerSummary, ShardBody, ShardWire, SummaryConfig};

pub fn run(data: &[u8]) {
    let mut pieces = pieces(data);
    let chain: Vec<u64> = pieces
        .next()
        .unwrap_or_default()
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("chunks of 8")))
        .collect();
    let mut peer = PeerSummary::new();
    for bytes in pieces.take(64) {
        let Ok(shard) = ShardWire::decode(bytes) else {
            continue;
        };
        check_shard(&shard, bytes.len());
        let mut probes: Vec<u64> = chain.clone();
        if let ShardBody::Exact(hashes) = &shard.wire.body {
            probes.extend(hashes);
        }
        let before: Vec<bool> = probes.iter().map(|&h| peer.contains(h)).collect();
        let generation = peer.generation();
        // `summary::peer::Applied` is not re-exported by the protocol crate, so it is told
        // apart by name.
        let stale = match format!("{:?}", peer.apply_bytes(bytes).expect("decoded above")) {
            name if name == "Stale" => true,
            name if name == "Updated" => false,
            other => panic!("unknown outcome {other}"),
        };
        assert!(peer.generation() >= generation, "generations only grow");
        // Only the shard count matters to which slice a hash falls in.
        let geometry = SummaryConfig {
            num_shards: shard.wire.num_shards,
            shard_bytes: 8,
        };
        for (&hash, held_before) in probes.iter().zip(before) {
            let now = peer.contains(hash);
            if stale {
                assert_eq!(now, held_before, "a stale shard changed {hash:#x}");
            } else if geometry.shard_of(hash) == shard.wire.index {
                assert_eq!(
                    now,
                    shard.contains(hash),
                    "the applied shard rules {hash:#x}"
                );
            } else if shard.wire.generation > generation {
                assert!(!now, "{hash:#x} outlived its generation");
            }
        }
        check_longest_match(&peer, &chain);
        let rate = peer.estimated_false_match_rate();
        assert!((0.0..=1.0).contains(&rate), "false-match rate {rate}");
        let _ = (peer.estimated_blocks(), peer.encoded_bytes());
    }
    check_longest_match(&peer, &chain);
}

fn check_shard(shard: &DecodedShard, len: usize) {
    assert_eq!(shard.encoded_len, len);
    let encoded = shard.wire.encode();
    let again = ShardWire::decode(&encoded).expect("a decoded shard re-encodes validly");
    assert_eq!(again.wire, shard.wire);
    assert_eq!(again.wire.encode(), encoded, "encoding is deterministic");
    match &shard.wire.body {
        ShardBody::Exact(hashes) => {
            assert!(hashes.iter().all(|&h| shard.contains(h)));
            assert_eq!(shard.false_match_rate(), 0.0);
            assert_eq!(shard.estimated_len(), hashes.len());
        }
        ShardBody::Bloom { .. } => {
            let rate = shard.false_match_rate();
            assert!((0.0..=1.0).contains(&rate), "false-match rate {rate}");
            let _ = shard.estimated_len();
        }
    }
}

fn check_longest_match(peer: &PeerSummary, chain: &[u64]) {
    let found = peer.longest_match(chain);
    let linear = peer.longest_match_linear(chain);
    assert!(found <= chain.len());
    assert!(
        found >= linear,
        "galloping found {found}, the walk {linear}"
    );
    // Galloping trusts that holding a block means holding every block before it; wherever
    // the summary answers that way for this chain, it must find exactly what the walk finds.
    let held: Vec<bool> = chain.iter().map(|&h| peer.contains(h)).collect();
    if held.windows(2).all(|w| w[0] || !w[1]) {
        assert_eq!(found, linear, "the held blocks are a prefix of the chain");
    }
    if found > 0 {
        assert!(peer.contains(chain[found - 1]));
    }
    if found < chain.len() {
        assert!(!peer.contains(chain[found]));
    }
}

pub fn seeds() -> Vec<Vec<u8>> {
    let shards = samples::shards();
    let probe_chain =
        |hashes: &[u64]| -> Vec<u8> { hashes.iter().flat_map(|h| h.to_le_bytes()).collect() };
    let mut out = Vec::new();
    for generation in &shards {
        let chain = probe_chain(&samples::chain_hashes(48));
        out.push(join(
            std::iter::once(chain).chain(generation.iter().cloned()),
        ));
    }
    // A newer generation after an older one, then a stale shard of the older one again.
    let (old, new) = (&shards[0], &shards[1]);
    let chain = probe_chain(&samples::chain_hashes(24));
    let sequence = std::iter::once(chain)
        .chain(old.iter().cloned())
        .chain(new.iter().take(4).cloned())
        .chain(old.iter().take(1).cloned());
    out.push(join(sequence));
    out
}
