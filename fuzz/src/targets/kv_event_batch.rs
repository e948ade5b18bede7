//! `kv_events::decode_batch`: one ZMQ payload of the local engine's KV events (msgpack, either
//! of vLLM's shapes), then applied to the exact cache as the subscriber applies it.
//!
//! Checks:
//! - every event of the payload is accounted for: decoded, unknown or bad;
//! - the decoded events round-trip through the reference encoder ([`crate::msgpack`]) in both
//!   shapes: the same events, none unknown or bad;
//! - applied to an [`ExactCache`], their changes describe its contents exactly
//!   ([`crate::cache_model`]).

use crate::cache_model::CheckedCache;
use crate::msgpack::{Shape, encode_batch};
use crate::samples;
use kvmesh_protocol::kv_events::{KvEvent, decode_batch};
use rmpv::Value;

pub fn run(data: &[u8]) {
    let Ok(batch) = decode_batch(data) else {
        return;
    };
    let total = batch.events.len() + batch.unknown_events + batch.bad_events;
    assert_eq!(total, raw_event_count(data), "events lost or invented");
    assert_eq!(batch.first_error.is_some(), batch.bad_events > 0);
    for shape in [Shape::Array, Shape::Map] {
        let again = decode_batch(&encode_batch(batch.ts, &batch.events, shape))
            .expect("re-encoded events decode");
        assert_eq!(again.events, batch.events, "{shape:?} round trip");
        assert_eq!(again.ts.to_bits(), batch.ts.to_bits());
        assert_eq!((again.unknown_events, again.bad_events), (0, 0));
    }
    // The engine's block size is a setting the mesh must match; follow the first store's, so
    // that stores are applied rather than all skipped as a mismatch.
    let block_tokens = batch
        .events
        .iter()
        .find_map(|e| match e {
            KvEvent::BlockStored { block_size, .. } => Some(*block_size as usize),
            _ => None,
        })
        .filter(|size| (1..=1024).contains(size))
        .unwrap_or(16);
    let mut cache = CheckedCache::new(block_tokens);
    for event in &batch.events {
        cache.apply(event);
    }
}

/// How many events the payload's `events` array holds, read independently of the decoder.
fn raw_event_count(data: &[u8]) -> usize {
    let value = rmpv::decode::read_value(&mut &data[..]).expect("decoded once already");
    let events = match &value {
        Value::Array(fields) => fields.get(1),
        Value::Map(entries) => entries
            .iter()
            .find(|(k, _)| k.as_str() == Some("events"))
            .map(|(_, v)| v),
        _ => None,
    };
    events.and_then(Value::as_array).map_or(0, Vec::len)
}

pub fn seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (i, events) in samples::kv_events(16).iter().enumerate() {
        let ts = 1_790_000_000.25 + i as f64;
        out.push(encode_batch(ts, events, Shape::Array));
        out.push(encode_batch(ts, events, Shape::Map));
    }
    // Everything in one batch, at a small block size, so one input reaches every path.
    let all: Vec<KvEvent> = samples::kv_events(2).into_iter().flatten().collect();
    out.push(encode_batch(1.0, &all, Shape::Array));
    out
}
