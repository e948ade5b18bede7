//! One module per decoder of untrusted bytes. Each has `run`, what libFuzzer calls with an
//! input (it panics when a property fails), and `seeds`, inputs built from real encodings.

pub mod engine_metrics;
pub mod gossip_frame;
pub mod kv_event_batch;
pub mod kv_event_cache;
pub mod load_digest;
pub mod request_hash;
pub mod summary_shard;
pub mod wire_frames;

/// A fuzz target as the seed writer and the stable checker see it.
pub struct Target {
    /// Also the name of its binary in `fuzz_targets/` and of its corpus directories.
    pub name: &'static str,
    pub run: fn(&[u8]),
    pub seeds: fn() -> Vec<Vec<u8>>,
}

pub const ALL: [Target; 8] = [
    Target {
        name: "load_digest",
        run: load_digest::run,
        seeds: load_digest::seeds,
    },
    Target {
        name: "summary_shard",
        run: summary_shard::run,
        seeds: summary_shard::seeds,
    },
    Target {
        name: "wire_frames",
        run: wire_frames::run,
        seeds: wire_frames::seeds,
    },
    Target {
        name: "gossip_frame",
        run: gossip_frame::run,
        seeds: gossip_frame::seeds,
    },
    Target {
        name: "kv_event_batch",
        run: kv_event_batch::run,
        seeds: kv_event_batch::seeds,
    },
    Target {
        name: "kv_event_cache",
        run: kv_event_cache::run,
        seeds: kv_event_cache::seeds,
    },
    Target {
        name: "request_hash",
        run: request_hash::run,
        seeds: request_hash::seeds,
    },
    Target {
        name: "engine_metrics",
        run: engine_metrics::run,
        seeds: engine_metrics::seeds,
    },
];
