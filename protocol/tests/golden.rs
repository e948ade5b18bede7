//! Golden vectors: the exact chain hashes of fixed inputs. Every node of a cluster must compute
//! the same hashes, so any change here is a deliberate, versioned break: bump
//! `hashing::HASH_VERSION` and update these vectors in the same commit.

use kvmesh_protocol::hashing::{
    ChainSeed, Endpoint, HASH_VERSION, chain_from_text, chain_from_tokens, hash_request,
};
use kvmesh_protocol::{HashConfig, LoadDigest};
use serde_json::json;

#[test]
fn hash_version_is_pinned() {
    assert_eq!(HASH_VERSION, 2);
}

#[test]
fn seeds() {
    let got = [
        ChainSeed::new("meta-llama/Llama-3.1-8B-Instruct", None).0,
        ChainSeed::new("meta-llama/Llama-3.1-8B-Instruct", Some("tenant-a")).0,
    ];
    assert_eq!(got, GOLDEN_SEEDS, "{got:#018x?}");
}

#[test]
fn text_chain() {
    let text: String = (0..200)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let chain = chain_from_text(ChainSeed::new("m", None), text.as_bytes(), 64);
    assert_eq!(chain, GOLDEN_TEXT, "{chain:#018x?}");
}

#[test]
fn token_chain() {
    let tokens: Vec<u32> = (1000..1040).collect();
    let chain = chain_from_tokens(ChainSeed::new("m", None), &tokens, 16);
    assert_eq!(chain, GOLDEN_TOKENS, "{chain:#018x?}");
}

#[test]
fn chat_request() {
    let body = json!({"model": "m", "messages": [
        {"role": "system", "content": "You are a helpful assistant that answers briefly."},
        {"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
        ]}
    ]});
    let hashes = hash_request(Endpoint::ChatCompletions, &body, &HashConfig::default()).unwrap();
    assert_eq!(hashes.chain, GOLDEN_CHAT, "{:#018x?}", hashes.chain);
}

#[test]
fn digest_encoding_is_stable() {
    let digest = LoadDigest {
        version: 3,
        timestamp_ms: 1_700_000_000_000,
        running: 1,
        waiting: 2,
        kv_usage: 0.5,
        queued_tokens: Some(512),
        kv_capacity_blocks: 1000,
        block_size: 16,
        ttft_ewma_ms: 12.5,
        prefill_tokens_per_s: 4000.0,
        inflight_forwarded: 0,
        role: kvmesh_protocol::Role::Mixed,
        healthy: true,
        hash_version: HASH_VERSION,
        models: vec!["m".into()],
        loras: vec![],
        lora_use: Default::default(),
    };
    let hash = blake3::hash(&digest.encode());
    assert_eq!(
        hash.to_hex().as_str(),
        GOLDEN_DIGEST_BLAKE3,
        "encoding changed"
    );
}

const GOLDEN_SEEDS: [u64; 2] = [0x99e194e7ca716cc2, 0x48145b7f4e771a22];
const GOLDEN_TEXT: [u64; 3] = [0x8c1213e252f045ce, 0xf2299099c67b213e, 0x3aa7a32c850f57e5];
const GOLDEN_TOKENS: [u64; 2] = [0x7cffe45fecce7de7, 0x4d6cf606c0201801];
/// Version 2: the image (a PNG signature without a header: 256 tokens assumed) is 16 blocks.
const GOLDEN_CHAT: [u64; 18] = [
    0x9eda2e81ee6a820c,
    0x17a8f72bdb8b584b,
    0x03752f4ef167b468,
    0xa8c8c7176d300df7,
    0x4e5594dc0b44fe74,
    0xe97ebabe37af14f5,
    0xb8d6de74c48f9ca6,
    0x52275d1ce52e4896,
    0x2623903b259b6742,
    0x36e579afe6d7d59f,
    0xdff7d8108de69eca,
    0xb4d98a1a1c4b909b,
    0x14b5520c86cedbc4,
    0xc2f5a0b5621224a8,
    0xc5c092809853172f,
    0x04b1bb035adb9b0b,
    0x52d0c68af3068259,
    0x00697991a6255f34,
];
/// Envelope format version 7 (`codec::FORMAT_VERSION`), hash version 2.
const GOLDEN_DIGEST_BLAKE3: &str =
    "ca88dc1593de5cbb24cacbd45dc1febd956d4202c1da755c077e72d589a4c371";
