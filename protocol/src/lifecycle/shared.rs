//! How much of a new prefix two of its copies share, told by the serving node from a few
//! sampled block hashes each copy's entry sends along.
//!
//! Copies of a new prefix (prompts agreeing on their first [`super::PREFIX_KEY_BLOCKS`]
//! blocks) meet on one engine, and a copy's own work there is what its prompt has beyond the
//! part the earliest copy computes. That part is known only to the serving node, which sees
//! both, and only if it can compare them: a system prompt shared by every copy and a question
//! of each one's own, say, leaves each copy a few hundred tokens to compute, while a prompt
//! sent twice leaves nothing. Counting every copy as sharing the whole earliest prompt made
//! a burst of copies look like no work at all: at a cold start a hot system prompt's copies
//! from every entry queued on one engine for a second and more
//! (`docs/studies/new-prefix-copies.md`).

use crate::route::sampled_depths;
use rkyv::{Archive, Deserialize, Serialize};

/// Most samples one request may carry: the depths counted for the longest chain a `u32`
/// numbers (four per doubling), with room to spare. A peer sending more is refused.
pub const MAX_PREFIX_SAMPLES: usize = 160;

/// A point of a prompt's chain: the prompt tokens up to a sampled block, and that block's
/// hash, which commits to every block before it.
#[derive(Archive, Serialize, Deserialize, Copy, Clone, Debug, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct PrefixSample {
    pub tokens: u32,
    pub hash: u64,
}

/// The samples of `chain` at the depths prefix popularity counts (1, 2, 3, then four per
/// doubling, and the whole chain): a shared prefix is then told within a quarter of its
/// length, from at most a few dozen hashes.
pub fn prefix_samples(chain: &[u64], tokens_per_block: f32) -> Vec<PrefixSample> {
    sampled_depths(chain.len())
        .map(|depth| PrefixSample {
            tokens: (depth as f32 * tokens_per_block)
                .round()
                .clamp(0.0, u32::MAX as f32) as u32,
            hash: chain[depth as usize - 1],
        })
        .collect()
}

/// The prompt tokens two prompts share, as far as their samples tell: those of the deepest
/// sample both have (0 when they share none, or either has none).
pub fn shared_tokens(one: &[PrefixSample], other: &[PrefixSample]) -> u32 {
    one.iter()
        .rev()
        .find(|sample| other.iter().any(|o| o.hash == sample.hash))
        .map_or(0, |sample| sample.tokens)
}

/// Rejects samples no honest entry sends: too many, or not in ascending depth.
pub fn validate_samples(samples: &[PrefixSample]) -> Result<(), String> {
    if samples.len() > MAX_PREFIX_SAMPLES {
        return Err(format!(
            "{} prefix samples, at most {MAX_PREFIX_SAMPLES}",
            samples.len()
        ));
    }
    if samples
        .windows(2)
        .any(|pair| pair[0].tokens > pair[1].tokens)
    {
        return Err("prefix samples out of order".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::{ChainSeed, chain_from_tokens};

    fn samples(tokens: impl Iterator<Item = u32>) -> Vec<PrefixSample> {
        let tokens: Vec<u32> = tokens.collect();
        prefix_samples(
            &chain_from_tokens(ChainSeed::new("m", None), &tokens, 16),
            16.0,
        )
    }

    #[test]
    fn copies_share_their_common_system_prompt_and_no_more() {
        // A 2,048-token system prompt, then a 256-token question of each copy's own.
        let one = samples((0..2_048).chain(10_000..10_256));
        let other = samples((0..2_048).chain(20_000..20_256));
        assert_eq!(shared_tokens(&one, &other), 2_048);
        assert_eq!(shared_tokens(&other, &one), 2_048);
        // The same prompt sent twice shares all of it.
        assert_eq!(shared_tokens(&one, &one.clone()), 2_304);
        // A prompt of its own shares nothing.
        let own = samples(30_000..32_304);
        assert_eq!(shared_tokens(&one, &own), 0);
        assert_eq!(shared_tokens(&one, &[]), 0);
    }

    #[test]
    fn a_shared_part_between_samples_is_told_within_a_quarter() {
        // 1,800 tokens in common: 112 whole blocks, between the sampled depths 112 and 128.
        let one = samples((0..1_800).chain(10_000..10_500));
        let other = samples((0..1_800).chain(20_000..20_500));
        assert_eq!(shared_tokens(&one, &other), 112 * 16);
    }

    #[test]
    fn the_longest_chain_stays_within_the_bound() {
        let depths = sampled_depths(u32::MAX as usize).count();
        assert!(depths <= MAX_PREFIX_SAMPLES, "{depths} depths");
        let samples = vec![PrefixSample { tokens: 1, hash: 1 }; MAX_PREFIX_SAMPLES + 1];
        assert!(validate_samples(&samples).is_err());
        let backwards = [
            PrefixSample {
                tokens: 32,
                hash: 2,
            },
            PrefixSample {
                tokens: 16,
                hash: 1,
            },
        ];
        assert!(validate_samples(&backwards).is_err());
        assert!(validate_samples(&samples[..MAX_PREFIX_SAMPLES]).is_ok());
    }
}
