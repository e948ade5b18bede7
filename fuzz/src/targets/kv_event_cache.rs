//! The exact cache fed long, valid event histories: structure-aware, so that the states random
//! msgpack bytes rarely reach are the common case here: vLLM hashes reused for other content,
//! parents never seen, offload relabels of blocks stored long before or never, removals from
//! the wrong tier, resets in the middle.
//!
//! The input is read with `arbitrary` into a list of events over a small space of vLLM hashes
//! and token ids (so that hashes collide and chains share prefixes). Each batch is encoded
//! with the reference encoder, decoded by `decode_batch` (which must give back the very
//! events: the encode-then-decode direction of the round trip), and applied to an
//! [`ExactCache`] whose changes must describe its contents exactly ([`crate::cache_model`]).
//! Any byte string is a valid input, so the seeds are only a few fixed byte patterns.

use crate::cache_model::CheckedCache;
use crate::msgpack::{Shape, encode_batch};
use arbitrary::{Arbitrary, Unstructured};
use kvmesh_protocol::hashing::MediaId;
use kvmesh_protocol::kv_events::{BlockExtraKeys, KvEvent, Medium, decode_batch};

/// The mesh's token block size here: small, so a few token ids make several blocks.
const BLOCK_TOKENS: u32 = 2;

#[derive(Arbitrary, Debug)]
enum Step {
    Store {
        /// Indices into a small hash space: reuse is likely.
        blocks: Vec<u8>,
        parent: Option<u8>,
        /// Token ids from a small alphabet: shared prefixes are likely.
        tokens: Vec<u8>,
        /// 0: the mesh's size; otherwise the value itself, mostly a mismatch.
        block_size: u8,
        lora: bool,
        medium: ArbMedium,
        /// Per block: 0 none, 1 a key the mesh cannot reproduce, n an image of a small set.
        extra_keys: Vec<u8>,
    },
    /// A token-less store: an offload connector's report.
    Offload {
        blocks: Vec<u8>,
        medium: ArbMedium,
        /// Older vLLM sends 0.
        zero_block_size: bool,
    },
    Remove {
        blocks: Vec<u8>,
        medium: ArbMedium,
    },
    Clear,
    /// Ends the current batch.
    Flush {
        map_shape: bool,
    },
}

#[derive(Arbitrary, Copy, Clone, Debug)]
enum ArbMedium {
    Gpu,
    Cpu,
    Storage,
}

impl From<ArbMedium> for Medium {
    fn from(medium: ArbMedium) -> Self {
        match medium {
            ArbMedium::Gpu => Medium::Gpu,
            ArbMedium::Cpu => Medium::Cpu,
            ArbMedium::Storage => Medium::Storage,
        }
    }
}

/// A vLLM block hash from a small index: 32 of them, spread over 64 bits like real ones.
fn vllm_hash(index: u8) -> u64 {
    u64::from(index % 32).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

fn block_extra_keys(code: u8) -> BlockExtraKeys {
    match code % 4 {
        0 => BlockExtraKeys::None,
        1 => BlockExtraKeys::Opaque,
        image => BlockExtraKeys::Media(vec![MediaId([image; 32])]),
    }
}

fn event(step: Step) -> Option<KvEvent> {
    let hashes = |blocks: Vec<u8>| blocks.into_iter().map(vllm_hash).collect::<Vec<_>>();
    Some(match step {
        Step::Store {
            blocks,
            parent,
            tokens,
            block_size,
            lora,
            medium,
            extra_keys,
        } => KvEvent::BlockStored {
            block_hashes: hashes(blocks),
            parent_block_hash: parent.map(vllm_hash),
            token_ids: tokens.into_iter().map(|t| u32::from(t % 4)).collect(),
            block_size: match block_size {
                0 => BLOCK_TOKENS,
                other => u32::from(other % 4),
            },
            lora_name: lora.then(|| "sql-lora".to_owned()),
            medium: medium.into(),
            extra_keys: extra_keys.into_iter().map(block_extra_keys).collect(),
        },
        Step::Offload {
            blocks,
            medium,
            zero_block_size,
        } => KvEvent::BlockStored {
            block_hashes: hashes(blocks),
            parent_block_hash: None,
            token_ids: vec![],
            block_size: if zero_block_size { 0 } else { BLOCK_TOKENS },
            lora_name: None,
            medium: medium.into(),
            extra_keys: vec![],
        },
        Step::Remove { blocks, medium } => KvEvent::BlockRemoved {
            block_hashes: hashes(blocks),
            medium: medium.into(),
        },
        Step::Clear => KvEvent::AllBlocksCleared,
        Step::Flush { .. } => return None,
    })
}

pub fn run(data: &[u8]) {
    let mut input = Unstructured::new(data);
    let mut cache = CheckedCache::new(BLOCK_TOKENS as usize);
    let mut batch = Vec::new();
    let mut ts = 0.0;
    while !input.is_empty() {
        let Ok(step) = Step::arbitrary(&mut input) else {
            break;
        };
        let flush = match step {
            Step::Flush { map_shape } => Some(map_shape),
            step => {
                batch.extend(event(step));
                None
            }
        };
        if let Some(map_shape) = flush {
            apply_batch(&mut cache, &mut batch, map_shape, &mut ts);
        }
    }
    apply_batch(&mut cache, &mut batch, false, &mut ts);
}

fn apply_batch(cache: &mut CheckedCache, batch: &mut Vec<KvEvent>, map_shape: bool, ts: &mut f64) {
    let shape = if map_shape { Shape::Map } else { Shape::Array };
    *ts += 0.1;
    let decoded = decode_batch(&encode_batch(*ts, batch, shape)).expect("an encoded batch decodes");
    assert_eq!(&decoded.events, batch, "{shape:?} round trip");
    assert_eq!((decoded.unknown_events, decoded.bad_events), (0, 0));
    for event in &decoded.events {
        cache.apply(event);
    }
    batch.clear();
}

pub fn seeds() -> Vec<Vec<u8>> {
    // Counting bytes, and a pattern that repeats: any input is a valid history.
    vec![
        (0..=255).collect(),
        [0u8, 3, 1, 1, 9, 0, 2, 0, 1, 1, 3, 0, 0, 2, 4, 1].repeat(8),
    ]
}
