//! `decide` over summaries as a sidecar really holds them (issue 5's benchmark): 256 peers, each
//! with its own engine's cache filled to capacity by realistic requests, published and decoded
//! the way the node does it, then one request whose prefix 0, 1, 16 or all 256 peers hold.
//!
//! Per peer, exactly the node's path (`node/src/prefix`, `node/src/view.rs`):
//! request body → [`hash_request`] → [`PrefixIndex::insert_chain`] (LRU at the engine's capacity)
//! → [`SummaryBuilder`] insert/remove → [`SummaryBuilder::publish_dirty`] → base64 gossip value
//! → base64 decode → [`PeerSummary::apply_bytes`]. Capacity is 20,000 hash blocks (an 8B model on
//! one 80 GB GPU: ~20k vLLM blocks of 16 tokens), so every shard of every peer is a Bloom filter.
//!
//! Two contents:
//! - `gsp`: SGLang's generated-shared-prefix shape, 2048-token system prompts shared by 16
//!   128-token questions (chat bodies); the request is a held system prompt with a new question.
//! - `trace`: requests of the Mooncake synthetic trace (`sim/data/`), each 512-token hash id
//!   mapped to its own deterministic text (completions bodies); the request is a 512-block
//!   prefix held by the holders with a new 2 KiB tail.
//!
//! Run: `cargo bench -p kvmesh-protocol --bench decide_gossiped`.

use base64::Engine as _;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kvmesh_protocol::hashing::{Endpoint, hash_request};
use kvmesh_protocol::index::PrefixIndex;
use kvmesh_protocol::route::{decide, node_key};
use kvmesh_protocol::summary::{PeerSummary, SummaryBuilder, SummaryConfig};
use kvmesh_protocol::{
    Candidate, HashConfig, LoadDigest, RequestHashes, Role, RouteConfig, RouteRequest, mix64,
};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::hint::black_box;

const PEERS: usize = 256;
/// Index capacity in hash blocks (the node converts `num_gpu_blocks × block_size` to these).
const CAPACITY_BLOCKS: usize = 20_000;
const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
/// Bytes of text per token, as the node's text-mode hashing estimates it.
const BYTES_PER_TOKEN: usize = 4;

/// One splitmix64 step from `z`: deterministic content for a seed.
fn mix(z: u64) -> u64 {
    mix64(z.wrapping_add(0x9e37_79b9_7f4a_7c15))
}

/// About `bytes` of English-looking text, different for every seed.
fn text(seed: u64, bytes: usize) -> String {
    const WORDS: [&str; 32] = [
        "the ",
        "model ",
        "answers ",
        "every ",
        "question ",
        "about ",
        "router ",
        "cache ",
        "prefix ",
        "engine ",
        "tokens ",
        "quickly ",
        "with ",
        "care. ",
        "a ",
        "user ",
        "asks ",
        "why ",
        "latency ",
        "matters ",
        "when ",
        "serving ",
        "long ",
        "prompts ",
        "from ",
        "many ",
        "clients, ",
        "and ",
        "context ",
        "grows; ",
        "then ",
        "it ",
    ];
    let mut out = String::with_capacity(bytes + 16);
    let mut state = mix(seed);
    while out.len() < bytes {
        state = mix(state);
        for shift in (0..60).step_by(5) {
            out.push_str(WORDS[(state >> shift) as usize & 31]);
        }
    }
    out.truncate(bytes);
    out
}

fn hash(endpoint: Endpoint, body: &Value) -> RequestHashes {
    hash_request(endpoint, body, &HashConfig::default()).expect("a valid request body")
}

fn chat(system: &str, question: &str) -> RequestHashes {
    let body = json!({"model": MODEL, "max_tokens": 128, "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": question},
    ]});
    hash(Endpoint::ChatCompletions, &body)
}

fn completion(prompt: &str) -> RequestHashes {
    hash(
        Endpoint::Completions,
        &json!({"model": MODEL, "max_tokens": 64, "prompt": prompt}),
    )
}

/// One node's own engine cache as its sidecar tracks it, and the summary it gossips.
struct Node {
    index: PrefixIndex,
    builder: SummaryBuilder,
}

impl Node {
    fn new(generation: u64) -> Self {
        Self {
            index: PrefixIndex::new(CAPACITY_BLOCKS),
            builder: SummaryBuilder::new(SummaryConfig::default(), generation)
                .expect("the default geometry is valid"),
        }
    }

    /// The engine served a request (`LocalPrefixes::observe_chain`).
    fn serve(&mut self, chain: &[u64]) {
        let changes = self.index.insert_chain(chain);
        changes.added.iter().for_each(|&h| {
            self.builder.insert(h);
        });
        changes.evicted.iter().for_each(|&h| {
            self.builder.remove(h);
        });
    }

    /// Publishes the changed shards as gossip values and decodes them as a peer's view does.
    fn gossiped_summary(&mut self) -> PeerSummary {
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut summary = PeerSummary::new();
        for shard in self.builder.publish_dirty() {
            let value = b64.encode(&shard.bytes);
            let bytes = b64.decode(&value).expect("our own base64");
            summary.apply_bytes(&bytes).expect("a valid shard");
        }
        summary
    }
}

/// gsp content: each peer serves its own groups (a system prompt and its questions) until its
/// index has turned over past capacity.
fn fill_gsp(node: &mut Node, peer: usize) {
    let mut group = 0u64;
    while node.index.len() < CAPACITY_BLOCKS || group < 100 {
        let system = text(mix(peer as u64) ^ group, 2048 * BYTES_PER_TOKEN);
        for question in 0..16u64 {
            let asked = text(
                mix(group) ^ (question << 32) ^ peer as u64,
                128 * BYTES_PER_TOKEN,
            );
            node.serve(&chat(&system, &asked).chain);
        }
        group += 1;
    }
}

/// The Mooncake synthetic trace: per request, its 512-token block ids.
fn trace_requests() -> Vec<Vec<u64>> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../sim/data/mooncake_synthetic_trace.jsonl"
    );
    let text = std::fs::read_to_string(path).expect("the Mooncake trace in sim/data");
    text.lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line).expect("a JSON line");
            value["hash_ids"]
                .as_array()
                .expect("hash_ids")
                .iter()
                .map(|id| id.as_u64().expect("a numeric id"))
                .collect()
        })
        .collect()
}

/// trace content: each peer serves trace requests picked at random (as a router with no prefix
/// knowledge would spread them) until its index has turned over past capacity. Shared ids give
/// byte-identical shared prefixes, as in the trace.
fn fill_trace(
    node: &mut Node,
    peer: usize,
    requests: &[Vec<u64>],
    blocks: &mut HashMap<u64, String>,
) {
    let mut state = mix(peer as u64 + 1_000);
    let mut served_blocks = 0;
    while served_blocks < 2 * CAPACITY_BLOCKS {
        state = mix(state);
        let ids = &requests[state as usize % requests.len()];
        let mut prompt = String::with_capacity(ids.len() * 512 * BYTES_PER_TOKEN);
        for &id in ids {
            prompt.push_str(
                blocks
                    .entry(id)
                    .or_insert_with(|| text(id ^ 0x7ace, 512 * BYTES_PER_TOKEN)),
            );
        }
        let chain = completion(&prompt).chain;
        served_blocks += chain.len();
        node.serve(&chain);
    }
}

/// What the bench asks for, and what holders served of it.
struct Target {
    held: RequestHashes,
    request: RequestHashes,
}

fn gsp_target() -> Target {
    let system = text(0x0051_57e3, 2048 * BYTES_PER_TOKEN);
    Target {
        held: chat(&system, &text(1, 128 * BYTES_PER_TOKEN)),
        request: chat(&system, &text(2, 128 * BYTES_PER_TOKEN)),
    }
}

fn trace_target() -> Target {
    let prefix = text(0x7ace_7a6e, 512 * 64);
    Target {
        held: completion(&(prefix.clone() + &text(3, 2048))),
        request: completion(&(prefix + &text(4, 2048))),
    }
}

/// A load digest that differs per peer, so load terms are not all equal.
fn digest(peer: usize) -> LoadDigest {
    let r = mix(peer as u64 ^ 0x10ad);
    LoadDigest {
        version: 1,
        timestamp_ms: 0,
        running: (r % 32) as u32,
        waiting: ((r >> 8) % 4) as u32,
        kv_usage: ((r >> 16) % 100) as f32 / 100.0,
        queued_tokens: None,
        kv_capacity_blocks: CAPACITY_BLOCKS as u32,
        block_size: 16,
        ttft_ewma_ms: 100.0 + ((r >> 24) % 200) as f32,
        prefill_tokens_per_s: 12_000.0,
        inflight_forwarded: 0,
        role: Role::Mixed,
        healthy: true,
        hash_version: kvmesh_protocol::hashing::HASH_VERSION,
        models: vec![MODEL.into()],
        loras: vec![],
        lora_use: Default::default(),
    }
}

/// Fills every peer, lets the first `holders` serve the target last, and decodes their summaries.
/// Returns summaries for each holder count in `holder_counts` (holders are a prefix of peers, so
/// one fill serves every count: peers are filled once, the holders re-published per count).
fn summaries_for(
    workload: &str,
    target: &Target,
    holder_counts: &[usize],
) -> Vec<(usize, Vec<PeerSummary>)> {
    let requests = (workload == "trace").then(trace_requests);
    let mut blocks = HashMap::new();
    let mut nodes: Vec<Node> = (0..PEERS)
        .map(|peer| {
            let mut node = Node::new(peer as u64 + 1);
            match &requests {
                Some(requests) => fill_trace(&mut node, peer, requests, &mut blocks),
                None => fill_gsp(&mut node, peer),
            }
            node
        })
        .collect();
    let base: Vec<PeerSummary> = nodes.iter_mut().map(Node::gossiped_summary).collect();
    let mut out = Vec::new();
    let mut served = 0;
    let mut current = base;
    for &holders in holder_counts {
        // Holders serve the target after the fill: its blocks are the most recent in their LRU.
        for (peer, node) in nodes.iter_mut().enumerate().take(holders).skip(served) {
            node.serve(&target.held.chain);
            let mut updated = current[peer].clone();
            for shard in node.builder.publish_dirty() {
                let b64 = base64::engine::general_purpose::STANDARD;
                let bytes = b64.decode(b64.encode(&shard.bytes)).expect("base64");
                updated.apply_bytes(&bytes).expect("a valid shard");
            }
            current[peer] = updated;
        }
        served = served.max(holders);
        report(workload, holders, &nodes, &current, target);
        out.push((holders, current.clone()));
    }
    out
}

/// Checks the premise (Bloom shards at capacity, holders match) and prints what was built.
fn report(workload: &str, holders: usize, nodes: &[Node], summaries: &[PeerSummary], t: &Target) {
    let matches: Vec<usize> = summaries
        .iter()
        .map(|s| s.longest_match(&t.request.chain))
        .collect();
    let shared = t
        .held
        .chain
        .iter()
        .zip(&t.request.chain)
        .take_while(|(a, b)| a == b)
        .count();
    assert!(
        matches[..holders].iter().all(|&m| m >= shared),
        "a holder lost the target"
    );
    let bytes: usize = summaries.iter().map(PeerSummary::encoded_bytes).sum();
    let fp: f64 = summaries
        .iter()
        .map(PeerSummary::estimated_false_match_rate)
        .sum::<f64>()
        / summaries.len() as f64;
    let blocks: usize = nodes.iter().map(|n| n.index.len()).sum();
    assert!(fp > 0.0, "summaries at capacity are Bloom filters");
    let false_holders: Vec<usize> = matches[holders..]
        .iter()
        .copied()
        .filter(|&m| m > 0)
        .collect();
    let exact_first = nodes
        .iter()
        .filter(|n| n.index.contains(t.request.chain[0]))
        .count();
    eprintln!(
        "{workload}: {holders} holders; request {} blocks, {shared} shared with the held chain; \
         mean index {} blocks; mean summary {} B; mean estimated false-match rate {:.3}%; \
         non-holders' false matches (blocks): {false_holders:?}; indexes holding block 0: {exact_first}",
        t.request.chain.len(),
        blocks / nodes.len(),
        bytes / summaries.len(),
        fp * 100.0,
    );
}

fn bench_workload(c: &mut Criterion, workload: &str, target: Target) {
    let config = RouteConfig::default();
    let digests: Vec<LoadDigest> = (0..PEERS).map(digest).collect();
    let keys: Vec<u64> = (0..PEERS).map(|n| node_key(&format!("node-{n}"))).collect();
    let request = RouteRequest {
        model: &target.request.model,
        chain: &target.request.chain,
        prompt_tokens: target.request.prompt_tokens,
        tokens_per_block: target.request.tokens_per_block,
        session: None,
        role: Role::Mixed,
        // As the node passes it (`serve/routing.rs`): near-equal holders share by request id.
        spread: Some(node_key("bench-request-1")),
        popular: &[],
        prefixes_recur: true,
    };
    let mut group = c.benchmark_group(format!("decide_gossiped_{workload}"));
    for (holders, summaries) in summaries_for(workload, &target, &[0, 1, 16, PEERS]) {
        let candidates: Vec<Candidate> = (0..PEERS)
            .map(|n| Candidate {
                node_key: keys[n],
                digest: &digests[n],
                summary: Some(&summaries[n]),
                held_blocks: None,
                digest_received_ms: 1_000,
                pending: 0,
                digest_pending: 0,
                recent_match: 0,
                fresh: None,
                offload: None,
            })
            .collect();
        let decision = decide(&candidates, &request, &config, 1_500).expect("a target");
        eprintln!(
            "  decision with {holders} holders: {:?}, matched {} blocks",
            decision.reason, decision.matched_blocks
        );
        let id = BenchmarkId::new(
            format!("{}_blocks_256_peers_held_by", request.chain.len()),
            holders,
        );
        group.bench_with_input(id, &candidates, |b, candidates| {
            b.iter(|| decide(black_box(candidates), &request, &config, 1_500).expect("a target"))
        });
    }
    group.finish();
}

fn gossiped(c: &mut Criterion) {
    bench_workload(c, "gsp", gsp_target());
    bench_workload(c, "trace", trace_target());
}

criterion_group!(benches, gossiped);
criterion_main!(benches);
