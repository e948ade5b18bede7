//! What the decode side of the connector measures, as vLLM's `NixlKVConnectorStats` and
//! `NixlPromMetrics` do: per-transfer histograms (with vLLM's buckets) and failure counters.
//! The prefill side's `vllm:nixl_num_kv_expired_reqs` lives in the engine model, which owns
//! the leases.

use std::time::Duration;

use crate::engine::model::Histogram;

/// `vllm:nixl_xfer_time_seconds` buckets (vLLM's list without its first bound).
pub const XFER_TIME_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0,
];
/// `vllm:nixl_post_time_seconds` buckets.
pub const POST_TIME_BUCKETS: [f64; 13] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0,
];
/// `vllm:nixl_bytes_transferred` buckets: 2 KiB to 8 GiB, ×4.
pub const BYTES_BUCKETS: [f64; 12] = [
    2048.0,
    8192.0,
    32768.0,
    131_072.0,
    524_288.0,
    2_097_152.0,
    8_388_608.0,
    33_554_432.0,
    134_217_728.0,
    536_870_912.0,
    2_147_483_648.0,
    8_589_934_592.0,
];
/// `vllm:nixl_num_descriptors` buckets.
pub const DESCRIPTOR_BUCKETS: [f64; 14] = [
    10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 200.0, 400.0, 1000.0, 2000.0, 4000.0, 10000.0, 20000.0,
    50000.0,
];

/// The decode side's transfer statistics.
#[derive(Debug, Clone, PartialEq)]
pub struct TransferStats {
    /// Post to completion of each successful pull, seconds.
    pub xfer_time: Histogram,
    /// Time to post each pull (the prefill engine's answer to the read), seconds.
    pub post_time: Histogram,
    /// Bytes of each successful pull.
    pub bytes: Histogram,
    /// Descriptors of each successful pull: one per block (vLLM has one per block and layer
    /// region; the mock has no layers).
    pub descriptors: Histogram,
    /// Pulls that failed (`vllm:nixl_num_failed_transfers`).
    pub failed_transfers: u64,
    /// Notifications (read done, abort, heartbeat) that did not reach the prefill engine
    /// (`vllm:nixl_num_failed_notifications`).
    pub failed_notifications: u64,
}

impl Default for TransferStats {
    fn default() -> Self {
        Self {
            xfer_time: Histogram::new(&XFER_TIME_BUCKETS),
            post_time: Histogram::new(&POST_TIME_BUCKETS),
            bytes: Histogram::new(&BYTES_BUCKETS),
            descriptors: Histogram::new(&DESCRIPTOR_BUCKETS),
            failed_transfers: 0,
            failed_notifications: 0,
        }
    }
}

impl TransferStats {
    /// Records one successful pull.
    pub fn record_transfer(&mut self, xfer: Duration, post: Duration, bytes: u64, blocks: usize) {
        self.xfer_time.observe(xfer.as_secs_f64());
        self.post_time.observe(post.as_secs_f64());
        self.bytes.observe(bytes as f64);
        self.descriptors.observe(blocks as f64);
    }
}
