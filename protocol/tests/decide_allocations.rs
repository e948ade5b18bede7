//! `decide` allocates a constant number of times per call, however many candidates it scores:
//! nothing in the per-candidate loop touches the heap. Counted with a global allocator, so this
//! file holds this one test only (tests in one binary share the allocator).

// The one unsafe code in the workspace: a counting global allocator, test-only.
#![allow(unsafe_code)]

use kvmesh_protocol::route::{DecideScratch, decide_with, node_key};
use kvmesh_protocol::summary::{PeerSummary, SummaryBuilder, SummaryConfig};
use kvmesh_protocol::{Candidate, LoadDigest, Role, RouteConfig, RouteRequest};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: delegates to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn allocations_do_not_grow_with_candidates() {
    let chain: Vec<u64> = (0..512u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    let digest = LoadDigest {
        version: 1,
        timestamp_ms: 0,
        running: 1,
        waiting: 0,
        kv_usage: 0.2,
        queued_tokens: None,
        kv_capacity_blocks: 100,
        block_size: 16,
        ttft_ewma_ms: 0.0,
        prefill_tokens_per_s: 0.0,
        inflight_forwarded: 0,
        role: Role::Mixed,
        healthy: true,
        hash_version: kvmesh_protocol::hashing::HASH_VERSION,
        models: vec!["m".into()],
        loras: vec![],
        lora_use: Default::default(),
    };
    let mut builder = SummaryBuilder::new(SummaryConfig::default(), 1).unwrap();
    chain[..200].iter().for_each(|&h| {
        builder.insert(h);
    });
    let mut summary = PeerSummary::new();
    for shard in builder.publish_dirty() {
        summary.apply_bytes(&shard.bytes).unwrap();
    }
    let request = RouteRequest {
        model: "m",
        chain: &chain,
        prompt_tokens: 8192,
        tokens_per_block: 16.0,
        session: Some(5),
        role: Role::Mixed,
        spread: None,
        popular: &[],
        prefixes_recur: true,
    };
    let config = RouteConfig::default();
    let mut counts = Vec::new();
    for nodes in [8usize, 512] {
        let candidates: Vec<Candidate> = (0..nodes)
            .map(|n| Candidate {
                node_key: node_key(&n.to_string()),
                digest: &digest,
                summary: Some(&summary),
                held_blocks: None,
                offload: None,
                digest_received_ms: 0,
                pending: 0,
                digest_pending: 0,
                recent_match: 0,
                fresh: None,
            })
            .collect();
        let mut scratch = DecideScratch::default();
        decide_with(&mut scratch, &candidates, &request, &config, 10).unwrap();
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        decide_with(&mut scratch, &candidates, &request, &config, 10).unwrap();
        counts.push(ALLOCATIONS.load(Ordering::Relaxed) - before);
    }
    assert_eq!(
        counts[0], counts[1],
        "allocations grew with candidates: {counts:?}"
    );
    assert!(counts[0] <= 3, "{} allocations per decision", counts[0]);
}
