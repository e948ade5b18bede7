//! vLLM's KV-event payloads, in both shapes, as vLLM's msgspec encoder writes them.

use kvmesh_protocol::hashing::MediaId;
use kvmesh_protocol::kv_events::{BlockExtraKeys, DecodeError, KvEvent, Medium, decode_batch};
use proptest::prelude::*;
use rmpv::Value;

fn encode(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, value).unwrap();
    out
}

fn s(text: &str) -> Value {
    Value::from(text)
}

fn ints(values: &[u64]) -> Value {
    Value::Array(values.iter().map(|&v| Value::from(v)).collect())
}

fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (s(k), v)).collect())
}

fn expected_stored(medium: Medium) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: vec![11, u64::MAX],
        parent_block_hash: Some(7),
        token_ids: vec![1, 2, 3, 4, 5, 6, 7, 8],
        block_size: 4,
        lora_name: None,
        medium,
        extra_keys: Vec::new(),
    }
}

#[test]
fn array_shape_with_trailing_fields_missing_or_present() {
    let batch = Value::Array(vec![
        Value::F64(1_700_000_000.5),
        Value::Array(vec![
            // The legacy shape as old vLLM sends it: no lora_name, no extra keys.
            Value::Array(vec![
                s("BlockStored"),
                ints(&[11, u64::MAX]),
                Value::from(7u8),
                ints(&[1, 2, 3, 4, 5, 6, 7, 8]),
                Value::from(4u16),
                Value::Nil,
                s("GPU"),
            ]),
            // A newer one with every field, an offload tier and unknown trailing fields.
            Value::Array(vec![
                s("BlockStored"),
                ints(&[11, u64::MAX]),
                Value::from(7u64),
                ints(&[1, 2, 3, 4, 5, 6, 7, 8]),
                Value::from(4u64),
                Value::Nil,
                s("CPU"),
                Value::Nil,
                Value::Nil,
                Value::from(0),
                s("full_attention"),
                Value::Nil,
            ]),
            Value::Array(vec![
                s("BlockRemoved"),
                ints(&[11]),
                s("GPU"),
                Value::from(0),
            ]),
            Value::Array(vec![s("BlockRemoved"), ints(&[12])]),
            Value::Array(vec![s("AllBlocksCleared")]),
            Value::Array(vec![s("SomethingNew"), Value::from(1)]),
        ]),
        Value::Nil,
    ]);
    let decoded = decode_batch(&encode(&batch)).unwrap();
    assert_eq!(decoded.ts, 1_700_000_000.5);
    assert_eq!(decoded.unknown_events, 1);
    assert_eq!(
        decoded.events,
        vec![
            expected_stored(Medium::Gpu),
            expected_stored(Medium::Cpu),
            KvEvent::BlockRemoved {
                block_hashes: vec![11],
                medium: Medium::Gpu
            },
            KvEvent::BlockRemoved {
                block_hashes: vec![12],
                medium: Medium::Gpu
            },
            KvEvent::AllBlocksCleared,
        ]
    );
}

#[test]
fn map_shape_with_unknown_keys_and_a_map_batch() {
    let stored = map(vec![
        ("type", s("BlockStored")),
        ("future_field", s("ignored")),
        ("block_hashes", ints(&[11, u64::MAX])),
        ("parent_block_hash", Value::from(7)),
        ("token_ids", ints(&[1, 2, 3, 4, 5, 6, 7, 8])),
        ("block_size", Value::from(4)),
        ("lora_id", Value::Nil),
        ("medium", s("STORAGE")),
    ]);
    let batch = map(vec![
        ("ts", Value::F64(2.0)),
        (
            "events",
            Value::Array(vec![
                stored,
                map(vec![
                    ("type", s("BlockRemoved")),
                    ("block_hashes", ints(&[11])),
                    ("medium", s("GPU")),
                ]),
                map(vec![("type", s("AllBlocksCleared"))]),
            ]),
        ),
        ("data_parallel_rank", Value::from(0)),
    ]);
    let decoded = decode_batch(&encode(&batch)).unwrap();
    assert_eq!(decoded.events.len(), 3);
    assert_eq!(decoded.events[0], expected_stored(Medium::Storage));
    assert_eq!(decoded.events[2], KvEvent::AllBlocksCleared);
}

#[test]
fn byte_hashes_take_the_last_eight_bytes_big_endian() {
    let mut digest = vec![0xAAu8; 24];
    digest.extend_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
    let batch = Value::Array(vec![
        Value::F64(0.0),
        Value::Array(vec![Value::Array(vec![
            s("BlockRemoved"),
            Value::Array(vec![Value::Binary(digest), Value::Binary(vec![1, 2])]),
        ])]),
    ]);
    let decoded = decode_batch(&encode(&batch)).unwrap();
    assert_eq!(
        decoded.events,
        vec![KvEvent::BlockRemoved {
            block_hashes: vec![0x0102_0304_0506_0708, 0x0102],
            medium: Medium::Gpu
        }]
    );
}

#[test]
fn extra_keys_keep_verified_media_and_mark_what_the_mesh_cannot_reproduce() {
    let image = MediaId::of_bytes(b"a picture");
    let uuid = image.uuid();
    let batch = Value::Array(vec![
        Value::F64(0.0),
        Value::Array(vec![map(vec![
            ("type", s("BlockStored")),
            ("block_hashes", ints(&[1, 2, 3, 4, 5, 6])),
            ("parent_block_hash", Value::Nil),
            ("token_ids", ints(&[0; 24])),
            ("block_size", Value::from(4)),
            ("lora_name", s("sql")),
            (
                "extra_keys",
                Value::Array(vec![
                    Value::Array(vec![s("sql")]),
                    Value::Nil,
                    Value::Array(vec![s("sql"), s(&uuid)]),
                    // The adapter also applies to the vision tower: vLLM prefixes its name.
                    Value::Array(vec![s(&format!("sql:{uuid}"))]),
                    // Older vLLM: (identifier, offset in the block).
                    Value::Array(vec![Value::Array(vec![s(&uuid), Value::from(-3)])]),
                    Value::Array(vec![s("sql"), s("salt")]),
                ]),
            ),
        ])]),
    ]);
    let decoded = decode_batch(&encode(&batch)).unwrap();
    let KvEvent::BlockStored {
        extra_keys,
        lora_name,
        ..
    } = &decoded.events[0]
    else {
        panic!("not a BlockStored: {:?}", decoded.events[0]);
    };
    assert_eq!(lora_name.as_deref(), Some("sql"));
    let media = BlockExtraKeys::Media(vec![image]);
    assert_eq!(
        extra_keys,
        &vec![
            BlockExtraKeys::None,
            BlockExtraKeys::None,
            media.clone(),
            media.clone(),
            media,
            BlockExtraKeys::Opaque,
        ]
    );
}

#[test]
fn a_media_hash_the_engine_computed_itself_is_opaque() {
    let batch = Value::Array(vec![
        Value::F64(0.0),
        Value::Array(vec![map(vec![
            ("type", s("BlockStored")),
            ("block_hashes", ints(&[1])),
            ("parent_block_hash", Value::Nil),
            ("token_ids", ints(&[0; 4])),
            ("block_size", Value::from(4)),
            (
                "extra_keys",
                Value::Array(vec![Value::Array(vec![s("3f2a9c0d5e")])]),
            ),
        ])]),
    ]);
    let decoded = decode_batch(&encode(&batch)).unwrap();
    let KvEvent::BlockStored { extra_keys, .. } = &decoded.events[0] else {
        panic!("not a BlockStored");
    };
    assert_eq!(extra_keys, &vec![BlockExtraKeys::Opaque]);
}

fn batch_of(events: Vec<Value>) -> Vec<u8> {
    encode(&Value::Array(vec![
        Value::F64(0.0),
        Value::Array(events),
        Value::Nil,
    ]))
}

#[test]
fn a_malformed_event_is_skipped_and_the_rest_of_its_batch_kept() {
    let good = Value::Array(vec![
        s("BlockStored"),
        ints(&[11, u64::MAX]),
        Value::from(7),
        ints(&[1, 2, 3, 4, 5, 6, 7, 8]),
        Value::from(4),
        Value::Nil,
        s("GPU"),
    ]);
    let hashes_as_a_string = Value::Array(vec![
        s("BlockStored"),
        s("not a list"),
        Value::Nil,
        ints(&[]),
        Value::from(0),
    ]);
    let removed = Value::Array(vec![s("BlockRemoved"), ints(&[11]), s("GPU")]);
    let decoded = decode_batch(&batch_of(vec![good, hashes_as_a_string, removed])).unwrap();
    assert_eq!(
        decoded.events,
        vec![
            expected_stored(Medium::Gpu),
            KvEvent::BlockRemoved {
                block_hashes: vec![11],
                medium: Medium::Gpu
            },
        ]
    );
    assert_eq!(decoded.bad_events, 1);
    assert_eq!(decoded.unknown_events, 0);
    assert_eq!(
        decoded.first_error,
        Some(DecodeError::BadField {
            event: "BlockStored",
            field: "block_hashes"
        })
    );
}

/// What vLLM's `OffloadingConnector` publishes when blocks reach its CPU tier.
fn expected_offload_store() -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: vec![11, 12],
        parent_block_hash: None,
        token_ids: Vec::new(),
        block_size: 0,
        lora_name: None,
        medium: Medium::Cpu,
        extra_keys: Vec::new(),
    }
}

#[test]
fn a_token_less_offload_store_with_block_size_zero_decodes_in_both_shapes() {
    let positional = Value::Array(vec![
        s("BlockStored"),
        ints(&[11, 12]),
        Value::Nil,
        ints(&[]),
        Value::from(0),
        Value::Nil,
        s("CPU"),
        Value::Nil,
    ]);
    let keyed = map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", ints(&[11, 12])),
        ("parent_block_hash", Value::Nil),
        ("token_ids", ints(&[])),
        ("block_size", Value::from(0)),
        ("lora_id", Value::Nil),
        ("medium", s("CPU")),
        ("lora_name", Value::Nil),
    ]);
    let decoded = decode_batch(&batch_of(vec![positional, keyed])).unwrap();
    assert_eq!(decoded.bad_events, 0, "{:?}", decoded.first_error);
    assert_eq!(
        decoded.events,
        vec![expected_offload_store(), expected_offload_store()]
    );
}

#[test]
fn malformed_payloads_are_errors_and_malformed_events_are_skipped() {
    assert!(matches!(
        decode_batch(&[0x92, 0xcb]),
        Err(DecodeError::Msgpack(_))
    ));
    assert_eq!(
        decode_batch(&encode(&Value::from(3))),
        Err(DecodeError::NotABatch)
    );
    let missing_tokens = Value::Array(vec![
        Value::F64(0.0),
        Value::Array(vec![Value::Array(vec![
            s("BlockStored"),
            ints(&[1]),
            Value::Nil,
        ])]),
    ]);
    // A malformed event is skipped, not an error of the batch.
    let decoded = decode_batch(&encode(&missing_tokens)).unwrap();
    assert!(decoded.events.is_empty());
    assert_eq!(
        decoded.first_error,
        Some(DecodeError::BadField {
            event: "BlockStored",
            field: "token_ids"
        })
    );
    let negative_token = Value::Array(vec![
        Value::F64(0.0),
        Value::Array(vec![Value::Array(vec![
            s("BlockStored"),
            ints(&[1]),
            Value::Nil,
            Value::Array(vec![Value::from(-1)]),
            Value::from(1),
        ])]),
    ]);
    assert_eq!(
        decode_batch(&encode(&negative_token)).unwrap().bad_events,
        1
    );
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_batch(&bytes);
    }

    #[test]
    fn truncated_valid_payloads_never_panic(cut in 0usize..200) {
        let batch = Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![Value::Array(vec![
                s("BlockStored"), ints(&[1, 2]), Value::Nil, ints(&[9; 8]), Value::from(4),
            ])]),
        ]);
        let bytes = encode(&batch);
        let _ = decode_batch(&bytes[..cut.min(bytes.len())]);
    }
}
