//! Criterion benches of the hot paths: hashing a prompt, deciding over many candidates,
//! encoding/decoding summary shards, and the per-request bookkeeping of entry and serving nodes. Run: `cargo bench -p kvmesh-protocol --bench protocol`.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvmesh_protocol::hashing::{ChainSeed, Endpoint, chain_from_text, hash_request};
use kvmesh_protocol::index::PrefixIndex;
use kvmesh_protocol::lifecycle::{prefix_samples, shared_tokens};
use kvmesh_protocol::route::{PrefixTraffic, RecentSends, decide, node_key};
use kvmesh_protocol::summary::{PeerSummary, ShardWire, SummaryBuilder, SummaryConfig};
use kvmesh_protocol::{Candidate, HashConfig, LoadDigest, Role, RouteConfig, RouteRequest};
use std::hint::black_box;

fn uniform(seed: u64) -> impl Iterator<Item = u64> {
    let mut state = seed;
    std::iter::from_fn(move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        Some(kvmesh_protocol::mix64(state))
    })
}

fn prompt_text(bytes: usize) -> String {
    let words = [
        "the ",
        "router ",
        "sends ",
        "every ",
        "prefix ",
        "home ",
        "quickly. ",
    ];
    let mut text = String::with_capacity(bytes + 16);
    let mut i = 0;
    while text.len() < bytes {
        text.push_str(words[i % words.len()]);
        i += 1;
    }
    text.truncate(bytes);
    text
}

fn hashing(c: &mut Criterion) {
    let text = prompt_text(32 * 1024);
    let mut group = c.benchmark_group("hash");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.bench_function("text_32KiB", |b| {
        let seed = ChainSeed::new("meta-llama/Llama-3.1-8B-Instruct", None);
        b.iter(|| chain_from_text(seed, black_box(text.as_bytes()), 64))
    });
    let body = serde_json::json!({"model": "m", "messages": [
        {"role": "system", "content": text[..16 * 1024]},
        {"role": "user", "content": text[16 * 1024..]},
    ]});
    let config = HashConfig::default();
    group.bench_function("chat_request_32KiB", |b| {
        b.iter(|| hash_request(Endpoint::ChatCompletions, black_box(&body), &config).unwrap())
    });
    group.finish();
}

/// The entry's work on a chat with a 256 KiB image: parse, pin the identity (and splice it
/// into the body's bytes), hash, or encode again; the serving node parses and hashes once
/// more. The pin benches clone the parsed body each time (`clone_parsed_…` is that part).
fn media(c: &mut Criterion) {
    use base64::Engine as _;
    let mut image = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\0\x04\0\0\0\x03\0".to_vec();
    image.extend(
        uniform(7)
            .flat_map(u64::to_le_bytes)
            .take(256 * 1024 - image.len()),
    );
    let url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&image)
    );
    let body = serde_json::to_vec(&serde_json::json!({"model": "m", "messages": [
        {"role": "system", "content": prompt_text(2048)},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "What is in this picture?"},
        ]},
    ]}))
    .unwrap();
    let config = HashConfig::default();
    let mut group = c.benchmark_group("media");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("parse_256KiB_image", |b| {
        b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(&body)).unwrap())
    });
    let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap();
    group.bench_function("pin_256KiB_image", |b| {
        b.iter(|| kvmesh_protocol::hashing::pin_media_uuids(&mut black_box(parsed.clone())))
    });
    group.bench_function("pin_raw_256KiB_image", |b| {
        b.iter(|| {
            kvmesh_protocol::hashing::pin_media_uuids_raw(
                black_box(&body),
                &mut black_box(parsed.clone()),
            )
        })
    });
    group.bench_function("clone_parsed_256KiB_image", |b| {
        b.iter(|| black_box(parsed.clone()))
    });
    group.bench_function("hash_256KiB_image", |b| {
        b.iter(|| hash_request(Endpoint::ChatCompletions, black_box(&parsed), &config).unwrap())
    });
    let mut pinned = parsed.clone();
    kvmesh_protocol::hashing::pin_media_uuids(&mut pinned);
    group.bench_function("hash_pinned_256KiB_image", |b| {
        b.iter(|| hash_request(Endpoint::ChatCompletions, black_box(&pinned), &config).unwrap())
    });
    group.bench_function("encode_256KiB_image", |b| {
        b.iter(|| serde_json::to_vec(black_box(&parsed)).unwrap())
    });
    group.finish();
}

fn digest() -> LoadDigest {
    LoadDigest {
        version: 1,
        timestamp_ms: 0,
        running: 8,
        waiting: 1,
        kv_usage: 0.5,
        queued_tokens: Some(1_024),
        kv_capacity_blocks: 20_000,
        block_size: 16,
        ttft_ewma_ms: 150.0,
        prefill_tokens_per_s: 8_000.0,
        inflight_forwarded: 0,
        role: Role::Mixed,
        healthy: true,
        hash_version: kvmesh_protocol::hashing::HASH_VERSION,
        models: vec!["meta-llama/Llama-3.1-8B-Instruct".into()],
        loras: vec![],
        lora_use: Default::default(),
    }
}

/// `nodes` peers, each with a summary of `held` random hashes; `holders` of them also hold the
/// whole request chain (the realistic case: a prefix lives on a few replicas).
fn cluster(nodes: usize, held: usize, holders: usize, chain: &[u64]) -> Vec<PeerSummary> {
    (0..nodes)
        .map(|n| {
            let mut builder = SummaryBuilder::new(SummaryConfig::default(), 1).unwrap();
            uniform(n as u64 + 100).take(held).for_each(|h| {
                builder.insert(h);
            });
            if n < holders {
                chain.iter().for_each(|&h| {
                    builder.insert(h);
                });
            }
            let mut summary = PeerSummary::new();
            for shard in builder.publish_dirty() {
                summary.apply_bytes(&shard.bytes).unwrap();
            }
            summary
        })
        .collect()
}

fn deciding(c: &mut Criterion) {
    let chain: Vec<u64> = uniform(7).take(512).collect();
    let digest = digest();
    let request = RouteRequest {
        model: "meta-llama/Llama-3.1-8B-Instruct",
        chain: &chain,
        prompt_tokens: 8192,
        tokens_per_block: 16.0,
        session: None,
        role: Role::Mixed,
        spread: None,
        popular: &[],
        prefixes_recur: true,
    };
    let config = RouteConfig::default();
    let mut group = c.benchmark_group("decide");
    for (nodes, holders) in [(16, 3), (256, 3), (1024, 3), (256, 256)] {
        let summaries = cluster(nodes, 8_000, holders, &chain);
        let names: Vec<u64> = (0..nodes).map(|n| node_key(&format!("node-{n}"))).collect();
        let candidates: Vec<Candidate> = (0..nodes)
            .map(|n| Candidate {
                node_key: names[n],
                digest: &digest,
                summary: Some(&summaries[n]),
                held_blocks: None,
                offload: None,
                digest_received_ms: 1_000,
                pending: 0,
                digest_pending: 0,
                recent_match: 0,
                fresh: None,
            })
            .collect();
        let id = BenchmarkId::new(format!("512_blocks_{holders}_holders"), nodes);
        group.bench_with_input(id, &candidates, |b, candidates| {
            b.iter(|| decide(black_box(candidates), &request, &config, 1_500).unwrap())
        });
    }
    group.finish();
}

fn summaries(c: &mut Criterion) {
    let config = SummaryConfig::default();
    let mut builder = SummaryBuilder::new(config, 1).unwrap();
    uniform(3).take(config.capacity()).for_each(|h| {
        builder.insert(h);
    });
    let mut group = c.benchmark_group("summary_shard");
    group.bench_function("encode_bloom_at_capacity", |b| {
        b.iter(|| builder.encode_shard(black_box(5)))
    });
    let bytes = builder.encode_shard(5);
    group.bench_function("decode_bloom_at_capacity", |b| {
        b.iter(|| ShardWire::decode(black_box(&bytes)).unwrap())
    });
    let mut sparse = SummaryBuilder::new(config, 1).unwrap();
    uniform(4).take(32 * 64).for_each(|h| {
        sparse.insert(h);
    });
    let exact = sparse.encode_shard(5);
    group.bench_function("decode_exact_64", |b| {
        b.iter(|| ShardWire::decode(black_box(&exact)).unwrap())
    });
    group.finish();
}

/// The chains of a gsp-like stream: 16 shared 128-block prefixes, each request with its own
/// 8-block tail (a 2048-token system prompt and a 128-token question at 16 tokens per block).
fn gsp_chains(count: usize) -> Vec<Vec<u64>> {
    let prefixes: Vec<Vec<u64>> = (0..16)
        .map(|g| uniform(100 + g).take(128).collect())
        .collect();
    let mut tails = uniform(7);
    (0..count)
        .map(|i| {
            let mut chain = prefixes[i % prefixes.len()].clone();
            chain.extend(tails.by_ref().take(8));
            chain
        })
        .collect()
}

/// What every request costs besides hashing and deciding: the entry records where it sent the
/// chain (optimistic matches), the serving node indexes the chain it served.
fn bookkeeping(c: &mut Criterion) {
    let chains = gsp_chains(4096);
    let mut group = c.benchmark_group("bookkeeping");
    // 500 requests/s over 4 peers with the node's 3 s time to live: each call also expires the
    // send of 1,500 calls before.
    let mut recent = RecentSends::new(3_000, 1_000_000);
    let (mut now, mut i) = (0u64, 0usize);
    group.bench_function("recent_sends_record_136_blocks", |b| {
        b.iter(|| {
            now += 2;
            i += 1;
            recent.record(i as u64 % 4, black_box(&chains[i % chains.len()]), now);
        })
    });
    // The entry's count of the prefixes it routes (a full window: each call also forgets the
    // oldest request), and the shares one decision reads.
    let mut traffic = PrefixTraffic::default();
    let mut shares = Vec::new();
    group.bench_function("prefix_traffic_record_and_shares_136_blocks", |b| {
        b.iter(|| {
            i += 1;
            let chain = black_box(&chains[i % chains.len()]);
            traffic.shares(chain, &mut shares);
            traffic.record(chain);
            shares.len()
        })
    });
    // An engine's worth of blocks (4096, the demo's), full: every insert evicts 8.
    let mut index = PrefixIndex::new(4096);
    group.bench_function("prefix_index_insert_136_blocks_at_capacity", |b| {
        b.iter(|| {
            i += 1;
            index.insert_chain(black_box(&chains[i % chains.len()]))
        })
    });
    // A new prefix's samples at the entry, and what a copy shares with the earliest at the
    // serving node, for 100,000-token prompts (6,250 blocks) that share only the first 8
    // blocks, as little as a copy can: the longest search.
    let long: Vec<Vec<u64>> = (0..2u64)
        .map(|own| {
            (0..6_250u64)
                .map(|b| if b < 8 { b } else { own << 32 | b })
                .collect()
        })
        .collect();
    group.bench_function("prefix_samples_100k_tokens", |b| {
        b.iter(|| prefix_samples(black_box(&long[0]), 16.0))
    });
    let (one, other) = (
        prefix_samples(&long[0], 16.0),
        prefix_samples(&long[1], 16.0),
    );
    group.bench_function("shared_tokens_100k_tokens", |b| {
        b.iter(|| shared_tokens(black_box(&one), black_box(&other)))
    });
    group.finish();
}

criterion_group!(benches, hashing, media, deciding, summaries, bookkeeping);
criterion_main!(benches);
