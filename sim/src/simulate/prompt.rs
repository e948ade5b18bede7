//! Prompts at the token level: segments, their token ids, and the prefix chain.
//!
//! A simulated prompt is a list of [`Segment`]s (a system prompt, a document, a question, a
//! Mooncake 512-token hash block), defined by the workload (`crate::workload`). [`tokens`]
//! gives their token ids, which are the mock engine's ids of the text the load generator sends
//! for the same request, so two prompts that start with the same segments start with the same
//! tokens: the engine model's own prefix cache hits exactly where the chain below says it
//! should, and where a real mock engine's would.
//!
//! The chain is cut into [`BLOCK_TOKENS`]-token blocks like the engine's KV blocks (only full
//! blocks count) and hashed directly from the token ids: `h_0 = H(seed, block_0)`,
//! `h_i = H(h_{i-1}, block_i)`. This is the protocol's token-mode chain in shape (each hash
//! names its whole prefix); the simulator uses a SplitMix-based hash instead of blake3 because
//! it hashes tens of millions of blocks per run and only needs equality, not wire stability.
//!
//! A prompt with pictures (the vision workload) is routed by the chain a kvmesh sidecar
//! computes in text mode for the very body the load generator sends ([`sidecar_chain`]): the
//! protocol keys a picture's blocks by its identity and gives it as many blocks as its
//! estimated tokens fill, which no chain of token ids reproduces. Its engine still sees token
//! ids ([`crate::workload::Request::tokens`]), the picture as a run unique to it.

pub use crate::workload::segment::{Segment, tokens};

use kvmesh_protocol::hashing::{Endpoint, HashConfig, hash_request};
use kvmesh_protocol::mix64;

use super::node::MODEL;
use crate::load::render::{Api, BodySettings};
use crate::workload::Request;

/// Tokens per KV block (vLLM's default, and the engine model's).
pub const BLOCK_TOKENS: usize = 16;

/// The prefix chain of `tokens`: one hash per full block.
pub fn chain(seed: u64, tokens: &[u32]) -> Vec<u64> {
    let mut prev = mix64(seed ^ 0x6368_6169_6e00);
    tokens
        .chunks_exact(BLOCK_TOKENS)
        .map(|block| {
            let mut h = prev;
            for &t in block {
                h = mix64(h ^ u64::from(t)).rotate_left(5);
            }
            prev = mix64(h ^ prev);
            prev
        })
        .collect()
}

/// The chain a kvmesh sidecar hashing in text mode (its default, `HashConfig::default()`)
/// computes for the body the load generator renders for `request`.
pub fn sidecar_chain(request: &Request) -> Vec<u64> {
    let settings = BodySettings {
        model: MODEL.to_owned(),
        stream: false,
        api: Api::Chat,
    };
    let (api, body) = settings.body_value(request);
    let endpoint = match api {
        Api::Completions => Endpoint::Completions,
        Api::Chat => Endpoint::ChatCompletions,
    };
    hash_request(endpoint, &body, &HashConfig::default())
        .expect("a rendered body is a valid request")
        .chain
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_segments_share_tokens_and_chain() {
        let system = Segment { key: 1, tokens: 40 };
        let a = tokens(&[system, Segment { key: 2, tokens: 30 }]);
        let b = tokens(&[system, Segment { key: 3, tokens: 30 }]);
        assert_eq!(a.len(), 70);
        assert_eq!(a[..40], b[..40]);
        assert_ne!(a[40..], b[40..]);
        let (ca, cb) = (chain(0, &a), chain(0, &b));
        assert_eq!(ca.len(), 4, "only full 16-token blocks");
        // Blocks 0 and 1 lie inside the shared 40 tokens; block 2 spans the difference.
        assert_eq!(ca[..2], cb[..2]);
        assert_ne!(ca[2], cb[2]);
        assert_ne!(ca[3], cb[3]);
        assert_ne!(chain(1, &a)[0], ca[0], "the seed names the model");
    }
}
