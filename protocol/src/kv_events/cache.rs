//! The exact state of an engine's prefix cache, rebuilt from its KV events in mesh hashes.
//!
//! vLLM's own block hashes are seeded per process and cannot be reproduced, so each stored
//! block gets the mesh's chain hash instead, computed from its token ids and its parent's mesh
//! hash ([`extend_with_media_tokens`]); the map from vLLM's hash to the mesh hash is kept only
//! to apply `BlockRemoved`. A block overlapping media placeholders is hashed with the items'
//! identities from its `extra_keys`, as the entry hashes the same prompt
//! (`hashing::chain_from_media_tokens`). A block vLLM hashed with extra keys the mesh cannot
//! reproduce (`cache_salt`, prompt embeddings, a media hash the engine computed itself), or
//! whose parent is unknown (events lost before this sidecar subscribed), is skipped rather
//! than guessed: skipping costs a missed match, guessing would advertise a prefix the engine
//! does not hold.
//!
//! A `BlockStored` without token ids re-labels blocks vLLM already stored with them: vLLM's
//! `OffloadingConnector` reports a finished offload that way (parent `None`, medium `CPU` or
//! another offload tier), under the same vLLM hashes the GPU's events used. Such a block takes
//! the mesh hash its vLLM hash already maps to; one this cache never mapped is skipped.
//!
//! Tiers are kept apart: the GPU tier and the offload tier (CPU and storage) change
//! independently, since a hit in an offload tier still costs a transfer.

use super::decode::{BlockExtraKeys, KvEvent, Medium};
use crate::block_map::BlockMap;
use crate::hashing::{ChainSeed, extend_with_media_tokens};

/// A published tier of the cache.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Tier {
    Gpu,
    /// CPU and storage together.
    Offload,
}

/// Mesh hashes that entered or left one tier.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TierChanges {
    pub added: Vec<u64>,
    pub removed: Vec<u64>,
}

impl TierChanges {
    /// Keeps only what the event changed overall. A vLLM hash reused for other content
    /// releases its old mesh hash mid-event, and a later block of the same event may take that
    /// mesh hash again (or the other way round): reported as both added and removed, it would
    /// be dropped by a reader applying the lists in either order, although still held (or
    /// kept although gone). A hash's additions and removals alternate, so their difference says
    /// whether it entered (1), left (-1) or is as before (0).
    fn net_out(&mut self) {
        if self.added.is_empty() || self.removed.is_empty() {
            return;
        }
        let mut net: BlockMap<u64, i32> = BlockMap::default();
        for &hash in &self.added {
            *net.entry(hash).or_default() += 1;
        }
        for &hash in &self.removed {
            *net.entry(hash).or_default() -= 1;
        }
        let mut keep = |hash: &u64, sign: i32| match net.get_mut(hash) {
            Some(n) if *n == sign => {
                *n = 0;
                true
            }
            _ => false,
        };
        self.added.retain(|hash| keep(hash, 1));
        self.removed.retain(|hash| keep(hash, -1));
    }
}

/// What one event changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventChanges {
    pub gpu: TierChanges,
    pub offload: TierChanges,
    /// Blocks of the event that could not be mapped, with why.
    pub skipped: Option<(SkipReason, usize)>,
    /// `BlockRemoved` hashes this cache never mapped (usually blocks skipped earlier).
    pub unknown_removed: usize,
}

/// Why a stored block got no mesh hash.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// Its parent was never seen (stored before this sidecar subscribed, or lost).
    UnknownParent,
    /// The event's block size differs from the mesh's token block size.
    BlockSizeMismatch,
    /// vLLM hashed extra keys (media, `cache_salt`, prompt embeddings) into it.
    ExtraKeys,
    /// The event carries fewer token ids than its blocks need.
    MissingTokens,
    /// A token-less store (an offload) of a block never stored with tokens, e.g. stored before
    /// this sidecar subscribed.
    UnknownBlock,
}

impl SkipReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnknownParent => "unknown_parent",
            Self::BlockSizeMismatch => "block_size_mismatch",
            Self::ExtraKeys => "extra_keys",
            Self::MissingTokens => "missing_tokens",
            Self::UnknownBlock => "unknown_block",
        }
    }
}

const MEDIA: [Medium; 3] = [Medium::Gpu, Medium::Cpu, Medium::Storage];

fn medium_bit(medium: Medium) -> u8 {
    match medium {
        Medium::Gpu => 1,
        Medium::Cpu => 2,
        Medium::Storage => 4,
    }
}

/// A vLLM block as this cache knows it.
#[derive(Copy, Clone, Debug)]
struct Mapped {
    mesh: u64,
    /// Bits of [`medium_bit`]: the media this vLLM block is stored in.
    media: u8,
}

/// The engine's cache in mesh hashes, per medium.
#[derive(Debug)]
pub struct ExactCache {
    block_tokens: usize,
    by_vllm: BlockMap<u64, Mapped>,
    /// Per medium (index of [`MEDIA`]): mesh hash → how many vLLM blocks hold it there.
    held: [BlockMap<u64, u32>; 3],
    /// Mesh hashes in the CPU or storage medium (kept, not recounted per event).
    offload_len: usize,
}

impl ExactCache {
    /// `block_tokens`: the mesh's token block size, which must equal vLLM's `--block-size`.
    pub fn new(block_tokens: usize) -> Self {
        Self {
            block_tokens,
            by_vllm: BlockMap::default(),
            held: Default::default(),
            offload_len: 0,
        }
    }

    /// Blocks held in a tier.
    pub fn len(&self, tier: Tier) -> usize {
        match tier {
            Tier::Gpu => self.held[0].len(),
            Tier::Offload => self.offload_len,
        }
    }

    pub fn contains(&self, tier: Tier, mesh: u64) -> bool {
        match tier {
            Tier::Gpu => self.held[0].contains_key(&mesh),
            Tier::Offload => self.in_offload(mesh),
        }
    }

    fn in_offload(&self, mesh: u64) -> bool {
        self.held[1].contains_key(&mesh) || self.held[2].contains_key(&mesh)
    }

    /// Applies one event. `model` is the engine's served model name: chains of the base model
    /// are seeded with it, chains of an adapter with the adapter's name (as requests name them).
    pub fn apply(&mut self, event: &KvEvent, model: &str) -> EventChanges {
        let mut changes = EventChanges::default();
        match event {
            KvEvent::BlockStored {
                block_hashes,
                token_ids,
                block_size,
                medium,
                ..
            } if token_ids.is_empty() => {
                self.relabel(block_hashes, *block_size, *medium, &mut changes);
            }
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_name,
                medium,
                extra_keys,
            } => {
                let seed = ChainSeed::new(lora_name.as_deref().unwrap_or(model), None);
                let parent = match parent_block_hash {
                    None => Some(seed.0),
                    Some(vllm) => self.by_vllm.get(vllm).map(|m| m.mesh),
                };
                let skip = |reason, from: usize| Some((reason, block_hashes.len() - from));
                let Some(mut prev) = parent else {
                    changes.skipped = skip(SkipReason::UnknownParent, 0);
                    return changes;
                };
                if *block_size as usize != self.block_tokens {
                    changes.skipped = skip(SkipReason::BlockSizeMismatch, 0);
                    return changes;
                }
                for (i, &vllm) in block_hashes.iter().enumerate() {
                    let media = match extra_keys.get(i) {
                        None | Some(BlockExtraKeys::None) => &[][..],
                        Some(BlockExtraKeys::Media(ids)) => ids.as_slice(),
                        Some(BlockExtraKeys::Opaque) => {
                            changes.skipped = skip(SkipReason::ExtraKeys, i);
                            break;
                        }
                    };
                    let Some(tokens) =
                        token_ids.get(i * self.block_tokens..(i + 1) * self.block_tokens)
                    else {
                        changes.skipped = skip(SkipReason::MissingTokens, i);
                        break;
                    };
                    prev = extend_with_media_tokens(prev, tokens, media);
                    self.store(vllm, prev, *medium, &mut changes);
                }
            }
            KvEvent::BlockRemoved {
                block_hashes,
                medium,
            } => {
                for vllm in block_hashes {
                    self.remove(*vllm, *medium, &mut changes);
                }
            }
            KvEvent::AllBlocksCleared => changes = self.clear(),
        }
        changes.gpu.net_out();
        changes.offload.net_out();
        changes
    }

    /// A token-less store: records blocks already mapped (by their tokens) in `medium`.
    fn relabel(
        &mut self,
        block_hashes: &[u64],
        block_size: u32,
        medium: Medium,
        changes: &mut EventChanges,
    ) {
        if block_hashes.is_empty() {
            return;
        }
        // An offload block spanning several GPU blocks is named by its last GPU block's hash;
        // the others' hashes are not in the event, so the chain up to it cannot be enumerated.
        // Older vLLM sends 0 even then: the blocks recorded are every n-th of a chain, never
        // its first, so the offload tier's prefix match misses them rather than overstating.
        if block_size != 0 && block_size as usize != self.block_tokens {
            changes.skipped = Some((SkipReason::BlockSizeMismatch, block_hashes.len()));
            return;
        }
        let mut unknown = 0;
        for &vllm in block_hashes {
            match self.by_vllm.get(&vllm) {
                Some(mapped) => self.store(vllm, mapped.mesh, medium, changes),
                None => unknown += 1,
            }
        }
        if unknown > 0 {
            changes.skipped = Some((SkipReason::UnknownBlock, unknown));
        }
    }

    /// Forgets everything (the cache was reset, or the engine restarted).
    pub fn clear(&mut self) -> EventChanges {
        let mut changes = EventChanges {
            gpu: TierChanges {
                removed: self.held[0].keys().copied().collect(),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut offload: Vec<u64> = self.held[1].keys().copied().collect();
        offload.extend(
            self.held[2]
                .keys()
                .filter(|h| !self.held[1].contains_key(h)),
        );
        changes.offload.removed = offload;
        self.by_vllm.clear();
        self.held = Default::default();
        self.offload_len = 0;
        changes
    }

    fn store(&mut self, vllm: u64, mesh: u64, medium: Medium, changes: &mut EventChanges) {
        let bit = medium_bit(medium);
        let mapped = self
            .by_vllm
            .entry(vllm)
            .or_insert(Mapped { mesh, media: 0 });
        if mapped.mesh != mesh {
            // vLLM reused a hash for different content (a collision of its 64-bit hash, or a
            // publisher restart not yet noticed): the newest event wins.
            let (old, media) = (mapped.mesh, mapped.media);
            *mapped = Mapped { mesh, media: 0 };
            for medium in MEDIA {
                if media & medium_bit(medium) != 0 {
                    self.release(old, medium, changes);
                }
            }
        }
        let mapped = self.by_vllm.get_mut(&vllm).expect("inserted above");
        if mapped.media & bit != 0 {
            return;
        }
        mapped.media |= bit;
        let was_offloaded = self.in_offload(mesh);
        let count = self.held[slot(medium)].entry(mesh).or_insert(0);
        *count += 1;
        if *count == 1 {
            match medium {
                Medium::Gpu => changes.gpu.added.push(mesh),
                Medium::Cpu | Medium::Storage if !was_offloaded => {
                    self.offload_len += 1;
                    changes.offload.added.push(mesh);
                }
                _ => {}
            }
        }
    }

    fn remove(&mut self, vllm: u64, medium: Medium, changes: &mut EventChanges) {
        let bit = medium_bit(medium);
        let Some(mapped) = self.by_vllm.get_mut(&vllm) else {
            changes.unknown_removed += 1;
            return;
        };
        if mapped.media & bit == 0 {
            changes.unknown_removed += 1;
            return;
        }
        mapped.media &= !bit;
        let mesh = mapped.mesh;
        if mapped.media == 0 {
            self.by_vllm.remove(&vllm);
        }
        self.release(mesh, medium, changes);
    }

    /// One vLLM block holding `mesh` in `medium` is gone.
    fn release(&mut self, mesh: u64, medium: Medium, changes: &mut EventChanges) {
        let held = &mut self.held[slot(medium)];
        let Some(count) = held.get_mut(&mesh) else {
            return;
        };
        *count -= 1;
        if *count > 0 {
            return;
        }
        held.remove(&mesh);
        match medium {
            Medium::Gpu => changes.gpu.removed.push(mesh),
            Medium::Cpu | Medium::Storage if !self.in_offload(mesh) => {
                self.offload_len -= 1;
                changes.offload.removed.push(mesh)
            }
            _ => {}
        }
    }
}

fn slot(medium: Medium) -> usize {
    match medium {
        Medium::Gpu => 0,
        Medium::Cpu => 1,
        Medium::Storage => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::chain_from_tokens;

    const MODEL: &str = "m";

    fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32], medium: Medium) -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: hashes.to_vec(),
            parent_block_hash: parent,
            token_ids: tokens.to_vec(),
            block_size: 4,
            lora_name: None,
            medium,
            extra_keys: Vec::new(),
        }
    }

    /// A store as vLLM's `OffloadingConnector` reports it: no parent, no tokens.
    fn offloaded(hashes: &[u64], block_size: u32, medium: Medium) -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: hashes.to_vec(),
            parent_block_hash: None,
            token_ids: Vec::new(),
            block_size,
            lora_name: None,
            medium,
            extra_keys: Vec::new(),
        }
    }

    fn removed(hashes: &[u64], medium: Medium) -> KvEvent {
        KvEvent::BlockRemoved {
            block_hashes: hashes.to_vec(),
            medium,
        }
    }

    #[test]
    fn stored_blocks_get_the_chain_a_request_of_the_same_tokens_gets() {
        let tokens: Vec<u32> = (0..12).collect();
        let request_chain = chain_from_tokens(ChainSeed::new(MODEL, None), &tokens, 4);
        let mut cache = ExactCache::new(4);
        // Stored in two events, the second naming the first's last block as parent.
        let first = cache.apply(&stored(&[101], None, &tokens[..4], Medium::Gpu), MODEL);
        let rest = cache.apply(
            &stored(&[102, 103], Some(101), &tokens[4..], Medium::Gpu),
            MODEL,
        );
        assert_eq!(first.gpu.added, request_chain[..1]);
        assert_eq!(rest.gpu.added, request_chain[1..]);
        assert!(request_chain.iter().all(|&h| cache.contains(Tier::Gpu, h)));

        let gone = cache.apply(&removed(&[103], Medium::Gpu), MODEL);
        assert_eq!(gone.gpu.removed, vec![request_chain[2]]);
        assert!(!cache.contains(Tier::Gpu, request_chain[2]));
        assert!(cache.contains(Tier::Gpu, request_chain[1]));
    }

    #[test]
    fn blocks_keyed_by_media_get_the_chain_the_entry_computes_for_the_same_prompt() {
        use crate::hashing::{MediaId, MediaSpan, chain_from_media_tokens};
        let image = MediaId::of_bytes(b"a picture");
        // Tokens 0..3 text, 3..10 the image's placeholders, 10..12 text: blocks 0..2 overlap it.
        let tokens: Vec<u32> = (0..12).collect();
        let span = MediaSpan {
            offset: 3,
            length: 7,
            id: image,
        };
        let entry = chain_from_media_tokens(ChainSeed::new(MODEL, None), &tokens, 4, &[span]);
        let mut event = stored(&[1, 2, 3], None, &tokens, Medium::Gpu);
        if let KvEvent::BlockStored { extra_keys, .. } = &mut event {
            *extra_keys = vec![BlockExtraKeys::Media(vec![image]); 3];
        }
        let mut cache = ExactCache::new(4);
        assert_eq!(cache.apply(&event, MODEL).gpu.added, entry);
        // Another image under the same placeholder tokens is another chain from its first block.
        let other = MediaId::of_bytes(b"another picture");
        if let KvEvent::BlockStored { extra_keys, .. } = &mut event {
            *extra_keys = vec![BlockExtraKeys::Media(vec![other]); 3];
        }
        let added = ExactCache::new(4).apply(&event, MODEL).gpu.added;
        assert!(added.iter().all(|h| !entry.contains(h)), "{added:?}");
    }

    #[test]
    fn adapters_seed_with_their_name() {
        let tokens: Vec<u32> = (0..4).collect();
        let mut cache = ExactCache::new(4);
        let mut event = stored(&[1], None, &tokens, Medium::Gpu);
        if let KvEvent::BlockStored { lora_name, .. } = &mut event {
            *lora_name = Some("sql".into());
        }
        let changes = cache.apply(&event, MODEL);
        assert_eq!(
            changes.gpu.added,
            chain_from_tokens(ChainSeed::new("sql", None), &tokens, 4)
        );
    }

    #[test]
    fn tiers_change_independently() {
        let tokens: Vec<u32> = (0..4).collect();
        let mesh = chain_from_tokens(ChainSeed::new(MODEL, None), &tokens, 4)[0];
        let mut cache = ExactCache::new(4);
        cache.apply(&stored(&[7], None, &tokens, Medium::Gpu), MODEL);
        let offloaded = cache.apply(&stored(&[7], None, &tokens, Medium::Cpu), MODEL);
        assert_eq!(offloaded.offload.added, vec![mesh]);
        assert!(offloaded.gpu.added.is_empty());
        let to_disk = cache.apply(&stored(&[7], None, &tokens, Medium::Storage), MODEL);
        assert!(
            to_disk.offload.added.is_empty(),
            "already in the offload tier"
        );

        let evicted = cache.apply(&removed(&[7], Medium::Gpu), MODEL);
        assert_eq!(evicted.gpu.removed, vec![mesh]);
        assert!(cache.contains(Tier::Offload, mesh));
        let off_cpu = cache.apply(&removed(&[7], Medium::Cpu), MODEL);
        assert!(off_cpu.offload.removed.is_empty(), "still on storage");
        let off_disk = cache.apply(&removed(&[7], Medium::Storage), MODEL);
        assert_eq!(off_disk.offload.removed, vec![mesh]);
        assert_eq!(cache.len(Tier::Offload), 0);
    }

    #[test]
    fn unmappable_blocks_are_skipped_not_guessed() {
        let tokens: Vec<u32> = (0..8).collect();
        let mut cache = ExactCache::new(4);
        let orphan = cache.apply(&stored(&[2, 3], Some(99), &tokens, Medium::Gpu), MODEL);
        assert_eq!(orphan.skipped, Some((SkipReason::UnknownParent, 2)));
        assert!(orphan.gpu.added.is_empty());

        let mut wrong_size = stored(&[2], None, &tokens, Medium::Gpu);
        if let KvEvent::BlockStored { block_size, .. } = &mut wrong_size {
            *block_size = 16;
        }
        let mismatch = cache.apply(&wrong_size, MODEL);
        assert_eq!(mismatch.skipped, Some((SkipReason::BlockSizeMismatch, 1)));

        let mut salted = stored(&[2, 3], None, &tokens, Medium::Gpu);
        if let KvEvent::BlockStored { extra_keys, .. } = &mut salted {
            *extra_keys = vec![BlockExtraKeys::None, BlockExtraKeys::Opaque];
        }
        let partial = cache.apply(&salted, MODEL);
        assert_eq!(partial.gpu.added.len(), 1);
        assert_eq!(partial.skipped, Some((SkipReason::ExtraKeys, 1)));

        let short = cache.apply(&stored(&[5, 6], None, &tokens[..6], Medium::Gpu), MODEL);
        assert_eq!(short.skipped, Some((SkipReason::MissingTokens, 1)));

        let unknown = cache.apply(&removed(&[3, 12345], Medium::Gpu), MODEL);
        assert_eq!(unknown.unknown_removed, 2);
    }

    #[test]
    fn token_less_stores_relabel_blocks_stored_with_tokens() {
        let tokens: Vec<u32> = (0..8).collect();
        let chain = chain_from_tokens(ChainSeed::new(MODEL, None), &tokens, 4);
        let mut cache = ExactCache::new(4);
        cache.apply(&stored(&[1, 2], None, &tokens, Medium::Gpu), MODEL);

        let offload = cache.apply(&offloaded(&[1, 2], 0, Medium::Cpu), MODEL);
        assert_eq!(offload.offload.added, chain);
        assert!(offload.gpu.added.is_empty());
        assert_eq!(offload.skipped, None);
        assert!(chain.iter().all(|&h| cache.contains(Tier::Offload, h)));
        assert_eq!(cache.len(Tier::Offload), 2);

        let off_cpu = cache.apply(&removed(&[1, 2], Medium::Cpu), MODEL);
        assert_eq!(off_cpu.offload.removed, chain);
        assert!(off_cpu.gpu.removed.is_empty());
        assert_eq!(cache.len(Tier::Offload), 0);
        assert!(chain.iter().all(|&h| cache.contains(Tier::Gpu, h)));

        // A stated block size equal to the mesh's is fine too.
        let to_disk = cache.apply(&offloaded(&[1], 4, Medium::Storage), MODEL);
        assert_eq!(to_disk.offload.added, chain[..1]);
        let nothing = cache.apply(&offloaded(&[], 0, Medium::Cpu), MODEL);
        assert_eq!(nothing, EventChanges::default());
    }

    #[test]
    fn token_less_stores_of_unknown_or_larger_blocks_are_skipped() {
        let tokens: Vec<u32> = (0..32).collect();
        let mut cache = ExactCache::new(16);
        let unknown = cache.apply(&offloaded(&[99], 0, Medium::Cpu), MODEL);
        assert_eq!(unknown.skipped, Some((SkipReason::UnknownBlock, 1)));
        assert!(unknown.offload.added.is_empty());

        let mut gpu = stored(&[1, 2], None, &tokens, Medium::Gpu);
        if let KvEvent::BlockStored { block_size, .. } = &mut gpu {
            *block_size = 16;
        }
        cache.apply(&gpu, MODEL);
        let partly = cache.apply(&offloaded(&[1, 99], 0, Medium::Cpu), MODEL);
        assert_eq!(partly.offload.added.len(), 1);
        assert_eq!(partly.skipped, Some((SkipReason::UnknownBlock, 1)));

        // One offload block of 256 tokens covers 16 GPU blocks the event does not name.
        let larger = cache.apply(&offloaded(&[1, 2], 256, Medium::Storage), MODEL);
        assert_eq!(larger.skipped, Some((SkipReason::BlockSizeMismatch, 2)));
        assert!(larger.offload.added.is_empty());
        assert_eq!(cache.len(Tier::Offload), 1);
    }

    #[test]
    fn clearing_reports_every_block_once() {
        let tokens: Vec<u32> = (0..8).collect();
        let mut cache = ExactCache::new(4);
        cache.apply(&stored(&[1, 2], None, &tokens, Medium::Gpu), MODEL);
        cache.apply(&stored(&[1], None, &tokens[..4], Medium::Cpu), MODEL);
        cache.apply(&stored(&[1], None, &tokens[..4], Medium::Storage), MODEL);
        let cleared = cache.apply(&KvEvent::AllBlocksCleared, MODEL);
        assert_eq!(cleared.gpu.removed.len(), 2);
        assert_eq!(cleared.offload.removed.len(), 1);
        assert_eq!(cache.len(Tier::Gpu), 0);
        // A parent forgotten by the clear is unknown afterwards.
        let after = cache.apply(&stored(&[2], Some(1), &tokens[4..], Medium::Gpu), MODEL);
        assert_eq!(after.skipped, Some((SkipReason::UnknownParent, 1)));
    }

    /// Found by the `kv_event_cache` fuzz target: a vLLM hash stored again at another place in
    /// a chain releases its old mesh hash, which a later block of the same event takes again.
    /// The event used to report that hash both added and removed, and the node, applying
    /// additions before removals, stopped advertising a block the engine still held.
    #[test]
    fn a_hash_released_and_taken_again_in_one_event_is_no_change() {
        let (a, b, c) = (11, 12, 13);
        let tokens = [0, 2, 0, 2, 0, 2, 0, 2];
        let chain = chain_from_tokens(ChainSeed::new(MODEL, None), &tokens, 4);
        let mut cache = ExactCache::new(4);
        cache.apply(&stored(&[a, b], None, &tokens, Medium::Gpu), MODEL);
        // `b` now names the chain's first block, and `c` its second (what `b` named before).
        let changes = cache.apply(&stored(&[b, c], None, &tokens, Medium::Gpu), MODEL);
        assert_eq!(changes.gpu, TierChanges::default());
        assert!(chain.iter().all(|&h| cache.contains(Tier::Gpu, h)));
        assert_eq!(cache.len(Tier::Gpu), 2);
        // And the other way round: the second block's hash reused for a new third block.
        let longer = [tokens.as_slice(), &[5, 5, 5, 5]].concat();
        let third = chain_from_tokens(ChainSeed::new(MODEL, None), &longer, 4)[2];
        let changes = cache.apply(&stored(&[c], Some(c), &longer[8..], Medium::Gpu), MODEL);
        assert_eq!(changes.gpu.added, vec![third]);
        assert_eq!(changes.gpu.removed, vec![chain[1]]);
    }

    #[test]
    fn duplicate_stores_and_removes_are_idempotent() {
        let tokens: Vec<u32> = (0..4).collect();
        let mut cache = ExactCache::new(4);
        let once = cache.apply(&stored(&[1], None, &tokens, Medium::Gpu), MODEL);
        let twice = cache.apply(&stored(&[1], None, &tokens, Medium::Gpu), MODEL);
        assert_eq!(once.gpu.added.len(), 1);
        assert!(twice.gpu.added.is_empty());
        let gone = cache.apply(&removed(&[1], Medium::Gpu), MODEL);
        let again = cache.apply(&removed(&[1], Medium::Gpu), MODEL);
        assert_eq!(gone.gpu.removed.len(), 1);
        assert_eq!(again.unknown_removed, 1);
    }
}
