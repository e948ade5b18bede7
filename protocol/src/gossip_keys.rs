//! The gossip key schema: the key each fact a node publishes goes under, and how binary values
//! (the load digest, summary shards) are written as gossip's string values. Every node reads
//! its peers' state by these names, so they are defined once, here.

use crate::codec::DecodeError;
use crate::digest::LoadDigest;
use base64::Engine as _;

/// The load digest (base64 of its validated envelope, [`encode_digest`]).
pub const DIGEST: &str = "digest";
/// The node's client-facing HTTP address, for operators.
pub const HTTP: &str = "http";
/// The node's kvmesh version, for operators (`kvmesh status`).
pub const VERSION: &str = "version";
/// The hash of the node's intents file and embedding (`--intents`): nodes whose hashes differ
/// give `model: "auto"` different models.
pub const INTENTS: &str = "intents";
/// The LoRA adapters the node's engine may load at run time (JSON of
/// [`crate::route::LoadableAdapters`]); absent when it may load none.
pub const LORA: &str = "lora";
/// The engine's model cards (JSON).
pub const MODELS: &str = "models";

/// A tier of the engine's cache whose prefix summary a node gossips, one key per shard.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Tier {
    /// The engine's GPU: keys `s/NNN`.
    Gpu,
    /// Offload tiers (CPU, storage), known in exact mode only: keys `o/NNN`.
    Offload,
}

impl Tier {
    pub const ALL: [Tier; 2] = [Tier::Gpu, Tier::Offload];

    /// What every key of this tier's shards starts with.
    pub fn key_prefix(self) -> &'static str {
        match self {
            Tier::Gpu => "s/",
            Tier::Offload => "o/",
        }
    }

    /// The key of shard `index`.
    pub fn shard_key(self, index: u16) -> String {
        format!("{}{index:03}", self.key_prefix())
    }

    /// The shard index a key of this tier names; `None` for any other key.
    pub fn shard_index(self, key: &str) -> Option<u16> {
        key.strip_prefix(self.key_prefix())?.parse().ok()
    }
}

/// A binary value as gossip carries it.
pub fn encode_bytes(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A gossiped binary value's bytes; `None` when it is not base64.
pub fn decode_bytes(value: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(value).ok()
}

/// The value gossiped under [`DIGEST`].
pub fn encode_digest(digest: &LoadDigest) -> String {
    encode_bytes(&digest.encode())
}

/// A peer's digest from its value under [`DIGEST`], validated.
pub fn decode_digest(value: &str) -> Result<LoadDigest, DecodeError> {
    let bytes =
        decode_bytes(value).ok_or_else(|| DecodeError::Semantic("digest is not base64".into()))?;
    LoadDigest::decode(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_keys_name_their_tier_and_index() {
        assert_eq!(Tier::Gpu.shard_key(7), "s/007");
        assert_eq!(Tier::Offload.shard_key(123), "o/123");
        for tier in Tier::ALL {
            for index in [0, 9, 255, 1000, u16::MAX] {
                let key = tier.shard_key(index);
                assert_eq!(tier.shard_index(&key), Some(index));
            }
        }
        assert_eq!(Tier::Gpu.shard_index("o/001"), None);
        assert_eq!(Tier::Offload.shard_index("s/001"), None);
        assert_eq!(Tier::Gpu.shard_index("s/x"), None);
        assert_eq!(Tier::Gpu.shard_index(DIGEST), None);
    }

    #[test]
    fn no_key_is_another_keys_prefix() {
        // The node reads a tier's shards as the keys starting with its prefix: no other key
        // may start so.
        let names = [DIGEST, HTTP, VERSION, INTENTS, LORA, MODELS];
        for tier in Tier::ALL {
            for name in names {
                assert!(!name.starts_with(tier.key_prefix()), "{name}");
            }
        }
        assert_ne!(Tier::Gpu.key_prefix(), Tier::Offload.key_prefix());
    }

    #[test]
    fn digests_round_trip_through_gossip_values() {
        let digest = crate::digest::sample_digest();
        assert_eq!(decode_digest(&encode_digest(&digest)).unwrap(), digest);
        assert!(decode_digest("not base64!").is_err());
        assert!(decode_digest(&encode_bytes(b"not a digest")).is_err());
    }
}
