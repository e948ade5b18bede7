//! [`LoadReport`]: the serving engine's load as its own sidecar knows it, carried back to the
//! entry on every response head and every decline.

use crate::route::Gauges;
use rkyv::{Archive, Deserialize, Serialize};

/// What a serving node tells the entry about its engine when it answers or declines.
#[derive(Archive, Serialize, Deserialize, Copy, Clone, Debug, PartialEq)]
#[rkyv(derive(Debug))]
pub struct LoadReport {
    /// Version of the serving node's latest digest: a gossiped digest of a higher version is
    /// newer than this report, one of a lower or equal version older.
    pub digest_version: u64,
    /// Requests in the engine's running batch.
    pub running: u32,
    /// Requests queued ahead of a new one (see [`super::ServingState::queued`]).
    pub waiting: u32,
    /// KV cache usage, 0..=1.
    pub kv_usage: f32,
    /// Prompt tokens queued ahead of a new request (see
    /// [`super::ServingState::queued_tokens`]).
    pub queued_tokens: Option<u32>,
    /// Requests the serving sidecar handed to its engine that have not finished.
    pub inflight: u32,
}

impl LoadReport {
    /// The gauges a decision judges the engine by.
    pub fn gauges(&self) -> Gauges {
        Gauges {
            running: self.running,
            waiting: self.waiting,
            kv_usage: self.kv_usage,
            queued_tokens: self.queued_tokens,
        }
    }

    /// Rejects values no honest node reports (a peer is never trusted to send sane numbers).
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.kv_usage) {
            return Err(format!("kv_usage {} out of 0..=1", self.kv_usage));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_kv_usage_is_rejected() {
        let mut report = LoadReport {
            digest_version: 1,
            running: 2,
            waiting: 3,
            kv_usage: 0.5,
            queued_tokens: Some(300),
            inflight: 5,
        };
        assert!(report.validate().is_ok());
        report.kv_usage = f32::NAN;
        assert!(report.validate().is_err());
        report.kv_usage = 1.01;
        assert!(report.validate().is_err());
    }
}
