//! Property tests: encoders round-trip, decoders never panic on hostile bytes, hashing keeps
//! the prefix property, and the decision keeps its invariants on arbitrary clusters.

use kvmesh_protocol::hashing::{ChainSeed, chain_from_text, chain_from_tokens};
use kvmesh_protocol::lifecycle::{LoadReport, prefix_samples};
use kvmesh_protocol::route::{BoundOn, PendingLedger, RouteError, node_key};
use kvmesh_protocol::summary::{PeerSummary, ShardWire, SummaryBuilder, SummaryConfig};
use kvmesh_protocol::wire::{
    Frame, FrameDecoder, RequestHead, ResponseHead, WireError, WireErrorCode,
};
use kvmesh_protocol::{
    Candidate, LoadDigest, LoraUse, Role, RouteConfig, RouteReason, RouteRequest, decide,
};
use proptest::prelude::*;

fn digest_strategy() -> impl Strategy<Value = LoadDigest> {
    (
        (
            any::<u64>(),
            any::<u64>(),
            0u32..200,
            0u32..200,
            0.0f32..=1.0,
        ),
        (
            any::<u32>(),
            any::<u16>(),
            0.0f32..1e6,
            0.0f32..1e6,
            any::<u32>(),
        ),
        (
            prop_oneof![Just(Role::Mixed), Just(Role::Prefill), Just(Role::Decode)],
            any::<bool>(),
        ),
        (
            prop::collection::vec("[a-z0-9/-]{1,24}", 0..3),
            prop::collection::vec("[a-z]{1,8}", 0..3),
            prop::collection::vec("[a-z]{1,8}", 0..3),
            any::<u16>(),
        ),
    )
        .prop_map(
            |(
                (version, ts, running, waiting, kv),
                (cap, bs, ttft, tps, inflight),
                (role, healthy),
                (models, loras, waiting_loras, max_loras),
            )| {
                LoadDigest {
                    version,
                    timestamp_ms: ts,
                    running,
                    waiting,
                    kv_usage: kv,
                    queued_tokens: None,
                    kv_capacity_blocks: cap,
                    block_size: bs,
                    ttft_ewma_ms: ttft,
                    prefill_tokens_per_s: tps,
                    inflight_forwarded: inflight,
                    role,
                    healthy,
                    hash_version: kvmesh_protocol::hashing::HASH_VERSION,
                    models,
                    lora_use: LoraUse {
                        running: loras.clone(),
                        waiting: waiting_loras,
                        max_loras,
                    },
                    loras,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_prefix_of_a_prompt_yields_a_prefix_of_the_chain(
        text in prop::collection::vec(any::<u8>(), 0..2000),
        cut in 0usize..2000,
        block in 1usize..200,
    ) {
        let seed = ChainSeed::new("m", None);
        let cut = cut.min(text.len());
        let whole = chain_from_text(seed, &text, block);
        let prefix = chain_from_text(seed, &text[..cut], block);
        prop_assert_eq!(prefix.len(), cut / block);
        prop_assert_eq!(&whole[..prefix.len()], &prefix[..]);
    }

    #[test]
    fn a_prefix_of_tokens_yields_a_prefix_of_the_chain(
        tokens in prop::collection::vec(any::<u32>(), 0..500),
        cut in 0usize..500,
    ) {
        let seed = ChainSeed::new("m", Some("salt"));
        let cut = cut.min(tokens.len());
        let whole = chain_from_tokens(seed, &tokens, 16);
        let prefix = chain_from_tokens(seed, &tokens[..cut], 16);
        prop_assert_eq!(&whole[..prefix.len()], &prefix[..]);
    }

    #[test]
    fn digests_round_trip(digest in digest_strategy()) {
        prop_assert_eq!(LoadDigest::decode(&digest.encode()).unwrap(), digest);
    }

    #[test]
    fn corrupted_digests_never_panic(digest in digest_strategy(), flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..8), cut in any::<usize>()) {
        let mut bytes = digest.encode();
        for (at, mask) in flips {
            let at = at % bytes.len();
            bytes[at] ^= mask | 1;
        }
        let _ = LoadDigest::decode(&bytes);
        let _ = LoadDigest::decode(&bytes[..cut % bytes.len()]);
    }

    #[test]
    fn random_bytes_are_rejected_by_every_decoder(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = LoadDigest::decode(&bytes);
        let _ = ShardWire::decode(&bytes);
        let mut decoder = FrameDecoder::new();
        decoder.push(&bytes);
        while let Ok(Some(_)) = decoder.next_frame() {}
        // A random envelope only decodes if it starts with our version and kind bytes.
        if bytes.first() != Some(&kvmesh_protocol::codec::FORMAT_VERSION) {
            prop_assert!(LoadDigest::decode(&bytes).is_err());
            prop_assert!(ShardWire::decode(&bytes).is_err());
        }
    }

    #[test]
    fn summary_shards_round_trip_and_survive_corruption(
        hashes in prop::collection::hash_set(any::<u64>(), 0..3000),
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6),
    ) {
        let mut builder = SummaryBuilder::new(SummaryConfig::default(), 9).unwrap();
        hashes.iter().for_each(|&h| { builder.insert(h); });
        let mut peer = PeerSummary::new();
        for shard in builder.publish_dirty() {
            peer.apply_bytes(&shard.bytes).unwrap();
            let mut corrupt = shard.bytes.clone();
            for &(at, mask) in &flips {
                let at = at % corrupt.len();
                corrupt[at] ^= mask | 1;
            }
            let _ = ShardWire::decode(&corrupt);
        }
        prop_assert!(hashes.iter().all(|&h| peer.contains(h)), "no false negatives");
    }

    #[test]
    fn galloping_match_equals_walking_on_whole_prefixes(
        chain in prop::collection::vec(any::<u64>(), 0..600),
        held in 0usize..600,
        noise in 0usize..3000,
    ) {
        let held = held.min(chain.len());
        let mut builder = SummaryBuilder::new(SummaryConfig::default(), 1).unwrap();
        chain[..held].iter().for_each(|&h| { builder.insert(h); });
        (0..noise as u64).for_each(|i| { builder.insert(kvmesh_protocol::route::rendezvous_weight(i, 99)); });
        let mut peer = PeerSummary::new();
        for shard in builder.publish_dirty() {
            peer.apply_bytes(&shard.bytes).unwrap();
        }
        let linear = peer.longest_match_linear(&chain);
        prop_assert!(linear >= held);
        // Both agree except where a false match past the held prefix lands on a probe.
        let galloping = peer.longest_match(&chain);
        prop_assert!(galloping >= held);
        if linear == held && (held..chain.len()).all(|i| !peer.contains(chain[i])) {
            prop_assert_eq!(galloping, held);
        }
    }

    #[test]
    fn wire_frames_round_trip(
        request_id in "[a-zA-Z0-9-]{0,40}",
        body in prop::collection::vec(any::<u8>(), 0..4096),
        status in 100u16..600,
        split in 1usize..64,
        chain in prop::collection::vec(any::<u64>(), 0..300),
    ) {
        let samples = prefix_samples(&chain, 16.0);
        let frames = vec![
            Frame::RequestHead(RequestHead {
                request_id,
                hop_count: 1,
                deadline_unix_ms: 5,
                model: "m".into(),
                method: "POST".into(),
                path: "/v1/completions".into(),
                headers: vec![("x-request-id".into(), "abc".into())],
                reason: RouteReason::ColdHash,
                entry_node: "n1".into(),
                prefix_key: Some(42),
                new_prefix: true,
                prefill_tokens: 2_000,
                decline_above_tokens: Some(250),
                streamed: true,
                prefix_samples: samples,
            }),
            Frame::Data(body.into()),
            Frame::ResponseHead(ResponseHead {
                status,
                headers: vec![],
                served_by: "n2".into(),
                load: Some(LoadReport { digest_version: 9, running: 3, waiting: 1, kv_usage: 0.5, queued_tokens: Some(2_048), inflight: 4 }),
            }),
            Frame::Error(WireError { code: WireErrorCode::EngineUnavailable, message: "down".into(), load: None }),
        ];
        let mut bytes = bytes::BytesMut::new();
        frames.iter().for_each(|f| f.encode_into(&mut bytes));
        let mut decoder = FrameDecoder::new();
        let mut decoded = Vec::new();
        for chunk in bytes.chunks(split) {
            decoder.push(chunk);
            while let Some(frame) = decoder.next_frame().unwrap() {
                decoded.push(frame);
            }
        }
        prop_assert_eq!(decoded, frames);
    }
}

/// A random cluster: per node (waiting, running, pending, healthy, serves, matched prefix len).
fn cluster_strategy() -> impl Strategy<Value = Vec<(u32, u32, u32, bool, bool, usize)>> {
    prop::collection::vec(
        (
            0u32..40,
            0u32..40,
            0u32..10,
            any::<bool>(),
            any::<bool>(),
            0usize..12,
        ),
        1..24,
    )
}

struct Cluster {
    names: Vec<String>,
    digests: Vec<LoadDigest>,
    summaries: Vec<PeerSummary>,
    pending: Vec<u32>,
}

fn build_cluster(spec: &[(u32, u32, u32, bool, bool, usize)], chain: &[u64]) -> Cluster {
    let mut cluster = Cluster {
        names: vec![],
        digests: vec![],
        summaries: vec![],
        pending: vec![],
    };
    for (i, &(waiting, running, pending, healthy, serves, matched)) in spec.iter().enumerate() {
        cluster.names.push(format!("node-{i}"));
        cluster.digests.push(LoadDigest {
            version: 1,
            timestamp_ms: 0,
            running,
            waiting,
            kv_usage: 0.5,
            queued_tokens: None,
            kv_capacity_blocks: 1000,
            block_size: 16,
            ttft_ewma_ms: 100.0,
            prefill_tokens_per_s: 1000.0,
            inflight_forwarded: 0,
            role: Role::Mixed,
            healthy,
            hash_version: kvmesh_protocol::hashing::HASH_VERSION,
            models: vec![if serves { "m".into() } else { "other".into() }],
            loras: vec![],
            lora_use: Default::default(),
        });
        let mut builder = SummaryBuilder::new(SummaryConfig::default(), 1).unwrap();
        chain.iter().take(matched).for_each(|&h| {
            builder.insert(h);
        });
        let mut summary = PeerSummary::new();
        for shard in builder.publish_dirty() {
            summary.apply_bytes(&shard.bytes).unwrap();
        }
        cluster.summaries.push(summary);
        cluster.pending.push(pending);
    }
    cluster
}

fn candidates<'a>(cluster: &'a Cluster, order: &[usize]) -> Vec<Candidate<'a>> {
    order
        .iter()
        .map(|&i| Candidate {
            node_key: node_key(&cluster.names[i]),
            digest: &cluster.digests[i],
            summary: Some(&cluster.summaries[i]),
            held_blocks: None,
            offload: None,
            digest_received_ms: 1_000,
            pending: cluster.pending[i],
            digest_pending: cluster.pending[i],
            recent_match: 0,
            fresh: None,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn decide_keeps_its_invariants(
        spec in cluster_strategy(),
        chain_seed in any::<u64>(),
        chain_len in 0usize..12,
        cost in any::<bool>(),
        bound_on_queue in any::<bool>(),
        rotate in any::<usize>(),
        spread in any::<Option<u64>>(),
    ) {
        let chain: Vec<u64> = (0..chain_len as u64).map(|i| kvmesh_protocol::route::rendezvous_weight(i, chain_seed)).collect();
        let cluster = build_cluster(&spec, &chain);
        let order: Vec<usize> = (0..spec.len()).collect();
        let cands = candidates(&cluster, &order);
        let mut config = RouteConfig::default();
        if cost {
            config.form = kvmesh_protocol::route::ScoreForm::Cost;
        }
        config.load.bound_on = if bound_on_queue { BoundOn::Queued } else { BoundOn::InFlight };
        let request = RouteRequest { model: "m", chain: &chain, prompt_tokens: chain_len as u32 * 16, tokens_per_block: 16.0, session: None, role: Role::Mixed, spread, popular: &[], prefixes_recur: true };
        let eligible: Vec<usize> = (0..spec.len()).filter(|&i| spec[i].3 && spec[i].4).collect();
        match decide(&cands, &request, &config, 1_500) {
            Err(RouteError::NoCandidate(_)) => prop_assert!(eligible.is_empty()),
            Ok(decision) => {
                prop_assert!(!decision.ranked.is_empty());
                for &i in &decision.ranked {
                    prop_assert!(eligible.contains(&i), "picked an unhealthy or foreign node");
                }
                // Bounded load: the chosen node is under the cap whenever any node is.
                let load = |i: usize| f64::from(match config.load.bound_on {
                    BoundOn::InFlight => spec[i].0 + spec[i].1 + spec[i].2,
                    BoundOn::Queued => spec[i].0 + spec[i].2,
                });
                let mean = (eligible.iter().map(|&i| load(i)).sum::<f64>() + 1.0) / eligible.len() as f64;
                let cap = config.load.cap(mean);
                if eligible.iter().any(|&i| load(i) + 1.0 <= cap) {
                    prop_assert!(load(decision.ranked[0]) + 1.0 <= cap, "load bound exceeded");
                }
                // The same view in another order gives the same node.
                let mut rotated = order.clone();
                rotated.rotate_left(rotate % spec.len());
                let other = decide(&candidates(&cluster, &rotated), &request, &config, 1_500).unwrap();
                prop_assert_eq!(rotated[other.ranked[0]], decision.ranked[0]);
                prop_assert_eq!(other.reason, decision.reason);
            }
        }
    }

    #[test]
    fn a_cold_prefix_lands_on_the_same_node_from_every_entry(
        loads in prop::collection::vec(0u32..4, 2..16),
        first_block in any::<u64>(),
        rotate in any::<usize>(),
        spread in any::<Option<u64>>(),
    ) {
        // Entry nodes see the same digests but list peers in their own order, and each has
        // its own pending counts of zero for a brand-new prefix.
        let spec: Vec<_> = loads.iter().map(|&w| (w, 0, 0, true, true, 0)).collect();
        let chain = vec![first_block, first_block ^ 1];
        let cluster = build_cluster(&spec, &chain);
        let order: Vec<usize> = (0..spec.len()).collect();
        let mut rotated = order.clone();
        rotated.rotate_left(rotate % spec.len());
        let request = RouteRequest { model: "m", chain: &chain, prompt_tokens: 32, tokens_per_block: 16.0, session: None, role: Role::Mixed, spread, popular: &[], prefixes_recur: true };
        let config = RouteConfig::default();
        let a = decide(&candidates(&cluster, &order), &request, &config, 1_500).unwrap();
        let b = decide(&candidates(&cluster, &rotated), &request, &config, 1_500).unwrap();
        prop_assert_eq!(order[a.ranked[0]], rotated[b.ranked[0]]);
        prop_assert!(matches!(a.reason, RouteReason::ColdHash | RouteReason::LoadSpill));
    }
}

#[test]
fn ledger_pending_is_bounded_by_ttl() {
    let mut ledger = PendingLedger::new(500);
    for t in 0..100 {
        ledger.record(7, t * 10);
    }
    // Sends at 490..=990 are within 500 ms of 990.
    assert_eq!(ledger.pending(7, 0, 990), 51);
}
