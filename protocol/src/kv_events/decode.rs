//! vLLM's KV-event batch payload (msgpack) into typed events.
//!
//! The payload is `[ts, events, data_parallel_rank]` or the same as a map. Each event is
//! either a positional array with the tag first (`["BlockStored", block_hashes,
//! parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, extra_keys, …]`,
//! `["BlockRemoved", block_hashes, medium, …]`, `["AllBlocksCleared"]`; trailing fields may be
//! missing) or a map with a `type` key. Unknown keys and unknown event types are ignored, so a
//! newer vLLM does not break an older sidecar; integers may be of any msgpack width; a block
//! hash is an integer or raw bytes, of which the last 8 are taken big-endian.
//!
//! An event that does not decode is skipped and counted, not fatal to its batch: vLLM puts its
//! KV connector's events (offload stores, with shapes that vary by version) in the same batch
//! as the GPU's, and losing the GPU's stores and removals to one odd event costs far more than
//! losing that event.

use rmpv::Value;

use crate::hashing::MediaId;

/// Where a block lives. vLLM's offloading connectors report `CPU` and `STORAGE` tiers.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Medium {
    Gpu,
    Cpu,
    Storage,
}

impl Medium {
    /// vLLM omits `medium` for the GPU; an unknown name is an offload tier of some kind.
    fn parse(value: Option<&Value>) -> Self {
        match value.and_then(Value::as_str) {
            None => Self::Gpu,
            Some(name) if name.eq_ignore_ascii_case("gpu") => Self::Gpu,
            Some(name) if name.eq_ignore_ascii_case("cpu") => Self::Cpu,
            Some(_) => Self::Storage,
        }
    }
}

/// A stored block's extra keys, as far as the mesh can reproduce them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum BlockExtraKeys {
    /// Nothing but the adapter name (which the mesh folds into its seed).
    #[default]
    None,
    /// The identities of the media items whose placeholders the block overlaps, in order:
    /// identifiers a sidecar wrote as the parts' `uuid` (see `hashing::MediaId::uuid`).
    Media(Vec<MediaId>),
    /// A key no entry node can reproduce: a `cache_salt`, prompt embeddings, or a media
    /// identifier the engine computed itself (a part the sidecar did not pin).
    Opaque,
}

/// One cache event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Consecutive full blocks of one sequence became cached.
    BlockStored {
        /// vLLM's hashes of the stored blocks, in chain order.
        block_hashes: Vec<u64>,
        /// vLLM's hash of the block before the first one; `None` at the start of a chain.
        parent_block_hash: Option<u64>,
        /// Token ids of all stored blocks, concatenated.
        token_ids: Vec<u32>,
        /// Tokens per block; 0 when not given (older vLLM's offloading connector sends 0).
        block_size: u32,
        /// The LoRA adapter's name, `None` for the base model.
        lora_name: Option<String>,
        medium: Medium,
        /// Per block: what vLLM folded into its hash besides the tokens and the LoRA name.
        /// Empty when the event carries none.
        extra_keys: Vec<BlockExtraKeys>,
    },
    /// Cached blocks were evicted.
    BlockRemoved {
        block_hashes: Vec<u64>,
        medium: Medium,
    },
    /// The whole prefix cache was reset.
    AllBlocksCleared,
}

/// One published batch.
#[derive(Clone, Debug, PartialEq)]
pub struct EventBatch {
    /// Publisher time, seconds since the epoch.
    pub ts: f64,
    pub events: Vec<KvEvent>,
    /// Events of a type this decoder does not know (skipped, counted).
    pub unknown_events: usize,
    /// Events of a known type that did not decode (skipped, counted).
    pub bad_events: usize,
    /// Why the first of them did not, to log once per batch.
    pub first_error: Option<DecodeError>,
}

/// A payload that is not a KV-event batch, or an event of one that does not decode.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("payload is not msgpack: {0}")]
    Msgpack(String),
    #[error("batch is neither `[ts, events, rank]` nor a map with `events`")]
    NotABatch,
    #[error("{event}: field `{field}` is missing or has the wrong type")]
    BadField {
        event: &'static str,
        field: &'static str,
    },
}

/// Decodes one batch payload. Fails only if the payload is not a batch; events that do not
/// decode are skipped (see [`EventBatch::bad_events`]).
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, DecodeError> {
    let mut reader = payload;
    let value =
        rmpv::decode::read_value(&mut reader).map_err(|e| DecodeError::Msgpack(e.to_string()))?;
    let (ts, events) = match &value {
        Value::Array(fields) => (fields.first(), fields.get(1)),
        Value::Map(_) => (map_get(&value, "ts"), map_get(&value, "events")),
        _ => return Err(DecodeError::NotABatch),
    };
    let Some(Value::Array(events)) = events else {
        return Err(DecodeError::NotABatch);
    };
    let mut batch = EventBatch {
        ts: ts.and_then(Value::as_f64).unwrap_or(0.0),
        events: Vec::with_capacity(events.len()),
        unknown_events: 0,
        bad_events: 0,
        first_error: None,
    };
    for event in events {
        match decode_event(event) {
            Ok(Some(event)) => batch.events.push(event),
            Ok(None) => batch.unknown_events += 1,
            Err(error) => {
                batch.bad_events += 1;
                batch.first_error.get_or_insert(error);
            }
        }
    }
    Ok(batch)
}

/// Positions of the fields of the positional (array) event shapes, after the tag.
mod pos {
    pub const STORED_HASHES: usize = 1;
    pub const STORED_PARENT: usize = 2;
    pub const STORED_TOKENS: usize = 3;
    pub const STORED_BLOCK_SIZE: usize = 4;
    pub const STORED_MEDIUM: usize = 6;
    pub const STORED_LORA_NAME: usize = 7;
    pub const STORED_EXTRA_KEYS: usize = 8;
    pub const REMOVED_HASHES: usize = 1;
    pub const REMOVED_MEDIUM: usize = 2;
}

/// Reads fields by name from a map event, by position from an array event.
struct Fields<'a> {
    value: &'a Value,
}

impl<'a> Fields<'a> {
    fn get(&self, name: &str, position: usize) -> Option<&'a Value> {
        let field = match self.value {
            Value::Array(items) => items.get(position),
            _ => map_get(self.value, name),
        };
        field.filter(|v| !v.is_nil())
    }
}

fn decode_event(value: &Value) -> Result<Option<KvEvent>, DecodeError> {
    let tag = match value {
        Value::Array(items) => items.first().and_then(Value::as_str),
        Value::Map(_) => map_get(value, "type").and_then(Value::as_str),
        _ => None,
    };
    let fields = Fields { value };
    let event = match tag {
        Some("BlockStored") => {
            const EVENT: &str = "BlockStored";
            let bad = |field| DecodeError::BadField {
                event: EVENT,
                field,
            };
            let block_hashes = fields
                .get("block_hashes", pos::STORED_HASHES)
                .and_then(hash_list)
                .ok_or(bad("block_hashes"))?;
            let parent_block_hash = match fields.get("parent_block_hash", pos::STORED_PARENT) {
                None => None,
                Some(v) => Some(block_hash(v).ok_or(bad("parent_block_hash"))?),
            };
            let token_ids = fields
                .get("token_ids", pos::STORED_TOKENS)
                .and_then(token_list)
                .ok_or(bad("token_ids"))?;
            let block_size = fields
                .get("block_size", pos::STORED_BLOCK_SIZE)
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or(bad("block_size"))?;
            let lora_name = fields
                .get("lora_name", pos::STORED_LORA_NAME)
                .and_then(Value::as_str)
                .map(str::to_owned);
            let extra_keys = fields
                .get("extra_keys", pos::STORED_EXTRA_KEYS)
                .map(|v| extra_keys(v, lora_name.as_deref()))
                .unwrap_or_default();
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_name,
                medium: Medium::parse(fields.get("medium", pos::STORED_MEDIUM)),
                extra_keys,
            }
        }
        Some("BlockRemoved") => KvEvent::BlockRemoved {
            block_hashes: fields
                .get("block_hashes", pos::REMOVED_HASHES)
                .and_then(hash_list)
                .ok_or(DecodeError::BadField {
                    event: "BlockRemoved",
                    field: "block_hashes",
                })?,
            medium: Medium::parse(fields.get("medium", pos::REMOVED_MEDIUM)),
        },
        Some("AllBlocksCleared") => KvEvent::AllBlocksCleared,
        _ => return Ok(None),
    };
    Ok(Some(event))
}

fn map_get<'a>(map: &'a Value, key: &str) -> Option<&'a Value> {
    match map {
        Value::Map(entries) => entries
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v),
        _ => None,
    }
}

/// A block hash: an integer of any width and sign (the bits are kept), or raw bytes whose
/// last 8 are read big-endian (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`).
fn block_hash(value: &Value) -> Option<u64> {
    match value {
        Value::Integer(n) => n.as_u64().or_else(|| n.as_i64().map(|i| i as u64)),
        Value::Binary(bytes) => {
            let mut last = [0u8; 8];
            let take = bytes.len().min(8);
            last[8 - take..].copy_from_slice(&bytes[bytes.len() - take..]);
            Some(u64::from_be_bytes(last))
        }
        _ => None,
    }
}

fn hash_list(value: &Value) -> Option<Vec<u64>> {
    value.as_array()?.iter().map(block_hash).collect()
}

fn token_list(value: &Value) -> Option<Vec<u32>> {
    value
        .as_array()?
        .iter()
        .map(|t| t.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

/// Per block, what its extra keys say: `nil` or an empty list is nothing; the adapter's
/// name is skipped; a verified media identifier (vLLM's `identifier`, which is the part's
/// `uuid`, possibly prefixed `"{lora}:"` when the adapter also applies to the vision tower;
/// older vLLM wraps it as `(identifier, offset)`) is kept; anything else makes the block
/// [`BlockExtraKeys::Opaque`].
fn extra_keys(value: &Value, lora_name: Option<&str>) -> Vec<BlockExtraKeys> {
    let Some(blocks) = value.as_array() else {
        return Vec::new();
    };
    blocks
        .iter()
        .map(|keys| match keys {
            Value::Nil => BlockExtraKeys::None,
            Value::Array(items) => block_extra_keys(items, lora_name),
            _ => BlockExtraKeys::Opaque,
        })
        .collect()
}

fn block_extra_keys(items: &[Value], lora_name: Option<&str>) -> BlockExtraKeys {
    let mut media = Vec::new();
    for item in items {
        let key = match item {
            Value::Nil => continue,
            Value::Array(pair) => pair.first().and_then(Value::as_str),
            other => other.as_str(),
        };
        let Some(key) = key else {
            return BlockExtraKeys::Opaque;
        };
        if lora_name == Some(key) {
            continue;
        }
        let unprefixed = lora_name
            .and_then(|lora| key.strip_prefix(lora)?.strip_prefix(':'))
            .unwrap_or(key);
        match MediaId::from_uuid(unprefixed) {
            Some(id) => media.push(id),
            None => return BlockExtraKeys::Opaque,
        }
    }
    match media.is_empty() {
        true => BlockExtraKeys::None,
        false => BlockExtraKeys::Media(media),
    }
}
