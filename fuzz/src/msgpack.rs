//! A reference encoder of vLLM's KV-event batches: the inverse of
//! `kvmesh_protocol::kv_events::decode_batch`, in both of vLLM's shapes.
//!
//! The protocol crate only decodes these (vLLM encodes them), so the round-trip property of the
//! KV-event targets needs an encoder of its own. It writes what vLLM writes: positional arrays
//! with the tag first, or maps with a `type` key; hashes as integers or as raw bytes.

use kvmesh_protocol::kv_events::{BlockExtraKeys, KvEvent, Medium};
use rmpv::Value;

/// Which of vLLM's two encodings.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `[ts, events, rank]`, each event `[tag, field, …]` (msgspec's `array_like`).
    Array,
    /// `{"ts", "events", "data_parallel_rank"}`, each event a map with `type`.
    Map,
}

/// One batch payload.
pub fn encode_batch(ts: f64, events: &[KvEvent], shape: Shape) -> Vec<u8> {
    let events = Value::Array(events.iter().map(|e| event(e, shape)).collect());
    let batch = match shape {
        Shape::Array => Value::Array(vec![Value::F64(ts), events, Value::from(0)]),
        Shape::Map => map(vec![
            ("ts", Value::F64(ts)),
            ("events", events),
            ("data_parallel_rank", Value::Nil),
        ]),
    };
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).expect("writing to a Vec cannot fail");
    out
}

fn event(event: &KvEvent, shape: Shape) -> Value {
    // The array shape writes hashes as integers (vLLM's default), the map shape as 8 raw
    // big-endian bytes (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`): both must decode the same.
    let hash = |h: u64| match shape {
        Shape::Array => Value::from(h),
        Shape::Map => Value::Binary(h.to_be_bytes().to_vec()),
    };
    let hashes = |hs: &[u64]| Value::Array(hs.iter().map(|&h| hash(h)).collect());
    let fields: Vec<(&str, Value)> = match event {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_name,
            medium,
            extra_keys,
        } => vec![
            ("type", Value::from("BlockStored")),
            ("block_hashes", hashes(block_hashes)),
            (
                "parent_block_hash",
                parent_block_hash.map_or(Value::Nil, hash),
            ),
            (
                "token_ids",
                Value::Array(token_ids.iter().map(|&t| Value::from(t)).collect()),
            ),
            ("block_size", Value::from(*block_size)),
            ("lora_id", Value::Nil),
            ("medium", medium_value(*medium, shape)),
            (
                "lora_name",
                lora_name.as_deref().map_or(Value::Nil, Value::from),
            ),
            ("extra_keys", extra_keys_value(extra_keys)),
        ],
        KvEvent::BlockRemoved {
            block_hashes,
            medium,
        } => vec![
            ("type", Value::from("BlockRemoved")),
            ("block_hashes", hashes(block_hashes)),
            ("medium", medium_value(*medium, shape)),
        ],
        KvEvent::AllBlocksCleared => vec![("type", Value::from("AllBlocksCleared"))],
    };
    match shape {
        Shape::Array => Value::Array(fields.into_iter().map(|(_, v)| v).collect()),
        Shape::Map => map(fields),
    }
}

/// vLLM omits the GPU's medium in one shape and may name it in the other.
fn medium_value(medium: Medium, shape: Shape) -> Value {
    match (medium, shape) {
        (Medium::Gpu, Shape::Array) => Value::Nil,
        (Medium::Gpu, Shape::Map) => Value::from("GPU"),
        (Medium::Cpu, _) => Value::from("CPU"),
        (Medium::Storage, _) => Value::from("DISK"),
    }
}

/// Per block: `nil` when vLLM folded nothing in, the verified identifiers of its media, or a
/// key the mesh cannot reproduce (an integer, which can never be mistaken for the adapter's
/// name or an identifier).
fn extra_keys_value(extra_keys: &[BlockExtraKeys]) -> Value {
    if extra_keys.is_empty() {
        return Value::Nil;
    }
    Value::Array(
        extra_keys
            .iter()
            .map(|keys| match keys {
                BlockExtraKeys::None => Value::Nil,
                BlockExtraKeys::Media(ids) => {
                    Value::Array(ids.iter().map(|id| Value::from(id.uuid())).collect())
                }
                BlockExtraKeys::Opaque => Value::Array(vec![Value::from(7)]),
            })
            .collect(),
    )
}

fn map(fields: Vec<(&str, Value)>) -> Value {
    Value::Map(
        fields
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect(),
    )
}
