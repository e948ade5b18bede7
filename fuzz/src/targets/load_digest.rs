//! `LoadDigest::decode`: a peer's gossiped load report (an rkyv envelope).
//!
//! Checks: what decodes satisfies the ranges `decode` promises (the routing decision divides
//! and compares by these numbers), and re-encoding it decodes to the same digest, byte for
//! byte on a second encoding.

use crate::samples;
use kvmesh_protocol::LoadDigest;

pub fn run(data: &[u8]) {
    let Ok(digest) = LoadDigest::decode(data) else {
        return;
    };
    assert!((0.0..=1.0).contains(&digest.kv_usage), "{digest:?}");
    for ewma in [digest.ttft_ewma_ms, digest.prefill_tokens_per_s] {
        assert!(ewma.is_finite() && ewma >= 0.0, "{digest:?}");
    }
    let encoded = digest.encode();
    let again = LoadDigest::decode(&encoded).expect("a decoded digest re-encodes validly");
    assert_eq!(again, digest);
    assert_eq!(again.encode(), encoded, "encoding is deterministic");
}

pub fn seeds() -> Vec<Vec<u8>> {
    samples::digests().iter().map(LoadDigest::encode).collect()
}
