//! A request's routing lifecycle, sans-IO: guess at the entry, know at the target.
//!
//! The entry side ([`EntryState`], [`Plan`]) ranks the engines on a view that is always
//! somewhat stale (gossiped digests 100–600 ms old, plus its own recent sends) and attempts
//! them in rank order. The serving side ([`ServingState`]) knows its own engine's queue
//! exactly, since it hands over every request the engine gets, and may decline a request its
//! entry allowed it to decline when that queue is longer than the entry believed the next
//! candidate's to be (late binding). Every answer and every decline carries the serving
//! engine's [`LoadReport`] back, so an entry's view of the engines it talks to is as fresh as
//! its last exchange with them; gossip stays the source for the others.
//!
//! The node drives these from sockets and the simulator from its model, with time passed in:
//! a change measured in the simulator is the change the node ships.

mod entry;
mod pd;
mod plan;
mod report;
mod serving;
mod shared;

pub use entry::{
    EntryState, Estimated, PENDING_TTL_MS, PeerInput, RECENT_MAX_ENTRIES, RECENT_TTL_MS,
    REPORT_TTL_MS, Source,
};
pub use pd::{PAIR_TTL_MS, PdReason, PdRoute};
pub use plan::{Attempt, Failure, Outcome, Plan, PopularPlacement, Progress, tokens_bound};
pub use report::LoadReport;
pub use serving::{Admission, DeclineReason, ServingState, Ticket};
pub use shared::{
    MAX_PREFIX_SAMPLES, PrefixSample, prefix_samples, shared_tokens, validate_samples,
};

/// Blocks of a prompt that name its new prefix to the serving side's copy rules.
pub const PREFIX_KEY_BLOCKS: usize = 8;

/// The key by which a serving node tells copies of a new prefix from other prompts: the hash
/// of the prompt's block [`PREFIX_KEY_BLOCKS`] (its last, if it has fewer). A block's hash
/// commits to every block before it, so two prompts share a key exactly when they agree on
/// their first 8 blocks (128 tokens at vLLM's default block size) or are one shorter prompt.
/// The first block alone is what a chat template or a shared instruction puts before every
/// prompt: at a cold start, when no engine holds anything, every new prompt was taken for a
/// copy of the first sent to its engine, so it was never declined and was held until that
/// one's first token, then computed whole (`docs/studies/new-prefix-copies.md`).
pub fn prefix_key(chain: &[u64]) -> Option<u64> {
    chain
        .get(chain.len().min(PREFIX_KEY_BLOCKS).checked_sub(1)?)
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::{ChainSeed, chain_from_tokens};

    fn chain(tokens: impl Iterator<Item = u32>) -> Vec<u64> {
        chain_from_tokens(ChainSeed::new("m", None), &tokens.collect::<Vec<_>>(), 16)
    }

    #[test]
    fn prompts_share_a_prefix_key_only_when_their_first_eight_blocks_agree() {
        // A 32-token instruction, then a document of its own: two blocks in common.
        let one = chain((0..32).chain(1_000..3_000));
        let other = chain((0..32).chain(5_000..7_000));
        assert_eq!(one[0], other[0], "one first block");
        assert_ne!(prefix_key(&one), prefix_key(&other));
        // The same document and another question after it: a copy.
        let copy = chain((0..32).chain(1_000..3_000).chain(9_000..9_064));
        assert_eq!(prefix_key(&one), prefix_key(&copy));
        // A prompt of fewer blocks is named by its last.
        let short = chain(0..40);
        assert_eq!(short.len(), 2);
        assert_eq!(prefix_key(&short), Some(short[1]));
        assert_eq!(prefix_key(&[]), None);
    }
}
