//! The false-match rate of a prefix summary at its advertised capacity, measured.
//!
//! A false match makes the router believe an engine holds a block it does not; the summary
//! promises at most 1% per lookup at capacity. The figures printed here go to
//! BENCHMARKS.md#summary-false-match
//! (`cargo test -p kvmesh-protocol --release --test summary_false_match -- --nocapture`).

use kvmesh_protocol::summary::{PeerSummary, SummaryBuilder, SummaryConfig};

/// A deterministic stream of uniform 64-bit values (chain hashes are uniform: blake3).
fn uniform(seed: u64) -> impl Iterator<Item = u64> {
    let mut state = seed;
    std::iter::from_fn(move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        Some(kvmesh_protocol::mix64(state))
    })
}

fn summary_with(config: SummaryConfig, count: usize) -> (PeerSummary, SummaryBuilder) {
    let mut builder = SummaryBuilder::new(config, 1).unwrap();
    uniform(1).take(count).for_each(|h| {
        builder.insert(h);
    });
    let mut peer = PeerSummary::new();
    let mut shards = builder.publish_dirty();
    shards.sort_by_key(|s| s.index);
    for shard in &shards {
        peer.apply_bytes(&shard.bytes).unwrap();
    }
    (peer, builder)
}

fn measured_rate(peer: &PeerSummary, queries: usize) -> f64 {
    let hits = uniform(0xdead_beef)
        .take(queries)
        .filter(|&h| peer.contains(h))
        .count();
    hits as f64 / queries as f64
}

#[test]
fn false_match_rate_at_capacity_is_at_most_one_percent() {
    for config in [
        SummaryConfig::default(),
        SummaryConfig::with_budget(8 * 1024),
    ] {
        let capacity = config.capacity();
        let (peer, builder) = summary_with(config, capacity);
        let rate = measured_rate(&peer, 400_000);
        let estimate = builder.estimated_false_match_rate();
        println!(
            "budget {} B, capacity {capacity} hashes, {} B on the wire: measured false-match \
             rate {:.3}% (estimated {:.3}%)",
            config.budget_bytes(),
            peer.encoded_bytes(),
            rate * 100.0,
            estimate * 100.0
        );
        assert!(rate <= 0.01, "false-match rate {rate} above 1% at capacity");
        assert!(
            (rate - estimate).abs() < 0.004,
            "estimate {estimate} far from measured {rate}"
        );
        assert!(peer.encoded_bytes() <= config.budget_bytes() + 64 * config.num_shards as usize);
        assert!(
            uniform(1).take(capacity).all(|h| peer.contains(h)),
            "false negative"
        );
    }
}

#[test]
fn past_capacity_the_size_holds_and_the_rate_is_reported() {
    let config = SummaryConfig::default();
    let (peer, builder) = summary_with(config, config.capacity() * 2);
    let rate = measured_rate(&peer, 200_000);
    println!(
        "at 2x capacity: measured {:.2}%, estimated {:.2}%",
        rate * 100.0,
        builder.estimated_false_match_rate() * 100.0
    );
    assert!(peer.encoded_bytes() <= config.budget_bytes() + 64 * config.num_shards as usize);
    assert!(rate > 0.01, "the rate grows past capacity");
    assert!((rate - builder.estimated_false_match_rate()).abs() < 0.02);
}

#[test]
fn a_false_match_extends_a_longest_match_by_about_one_block_at_most() {
    let config = SummaryConfig::default();
    let (peer, _) = summary_with(config, config.capacity());
    // Chains of 64 blocks nobody holds: the longest match is 0 unless the first block matches
    // falsely, and extends further only with another independent false match.
    let mut total = 0usize;
    let chains = 20_000;
    let mut values = uniform(77);
    for _ in 0..chains {
        let chain: Vec<u64> = values.by_ref().take(64).collect();
        total += peer.longest_match(&chain);
    }
    let mean = total as f64 / chains as f64;
    println!("mean false longest match over {chains} cold chains: {mean:.4} blocks");
    assert!(mean < 0.02, "mean false match {mean}");
}

#[test]
fn an_exact_summary_reports_a_rate_of_plus_zero() {
    // Small enough to stay exact lists in every shard: no false match, and +0.0, not the
    // -0.0 of an empty float sum (which /metrics would print as `-0.0`).
    let (_, builder) = summary_with(SummaryConfig::default(), 10);
    let rate = builder.estimated_false_match_rate();
    assert_eq!(rate, 0.0);
    assert!(rate.is_sign_positive(), "{rate:?}");
}
