//! The last requests that entered at this node, where they went and why: `GET /debug/recent`
//! and the dashboard's "recent requests". A bounded ring, newest first when read.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;

/// How many requests are kept: enough to see a pattern on the dashboard, small enough that a
/// snapshot is cheap at any request rate.
pub const KEPT: usize = 50;

/// One request as the entry node saw it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RecentRequest {
    /// Wall-clock milliseconds since the Unix epoch, when the outcome was known.
    pub at_unix_ms: u64,
    pub request_id: String,
    pub model: String,
    /// The routing reason of the attempt that decided the outcome.
    pub reason: &'static str,
    /// The node whose engine answered; `None` when every attempt failed.
    pub served_by: Option<String>,
    /// `forwarded` (the response head came back) or `failed` (every attempt failed).
    pub outcome: &'static str,
    /// Attempts made (more than one after a decline or a failure).
    pub attempts: u32,
    /// From the routing decision to the response head, or to the last failure.
    pub head_ms: u64,
}

#[derive(Debug, Default)]
pub struct RecentRequests(Mutex<VecDeque<RecentRequest>>);

impl RecentRequests {
    pub fn record(&self, request: RecentRequest) {
        let mut ring = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if ring.len() == KEPT {
            ring.pop_back();
        }
        ring.push_front(request);
    }

    /// Newest first.
    pub fn snapshot(&self) -> Vec<RecentRequest> {
        let ring = self.0.lock().unwrap_or_else(|e| e.into_inner());
        ring.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(n: u64) -> RecentRequest {
        RecentRequest {
            at_unix_ms: n,
            request_id: format!("r{n}"),
            model: "m".into(),
            reason: "prefix-hit",
            served_by: Some("a".into()),
            outcome: "forwarded",
            attempts: 1,
            head_ms: 3,
        }
    }

    #[test]
    fn keeps_the_newest_first_and_at_most_kept() {
        let recent = RecentRequests::default();
        for n in 0..(KEPT as u64 + 5) {
            recent.record(request(n));
        }
        let snapshot = recent.snapshot();
        assert_eq!(snapshot.len(), KEPT);
        assert_eq!(snapshot[0].request_id, format!("r{}", KEPT + 4));
        assert_eq!(snapshot[KEPT - 1].request_id, "r5");
    }
}
