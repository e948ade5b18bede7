//! Sequence numbers of KV-event batches: what to do with each one that arrives.
//!
//! vLLM numbers batches from 0, +1 per batch. A live subscription never goes backwards, so a
//! smaller number than expected means the publisher restarted (a new engine process with an
//! empty cache); a larger one means batches were lost and should be replayed.

/// What the subscriber should do with a batch.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SeqVerdict {
    /// The next batch: apply it.
    InOrder,
    /// Batches `from..to` are missing: replay them, then apply this one (`to`).
    Gap { from: u64, to: u64 },
    /// The publisher started over: forget everything learned from it, then apply this one.
    Restarted,
}

/// Tracks the next expected sequence number.
#[derive(Clone, Debug, Default)]
pub struct SeqTracker {
    /// The next expected sequence number; `None` before the first batch.
    next: Option<u64>,
}

impl SeqTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Judges a batch from the live stream. The first batch ever is a gap from 0 unless it is
    /// 0 itself: whatever the engine cached before this sidecar subscribed is worth replaying.
    pub fn live(&mut self, seq: u64) -> SeqVerdict {
        let expected = self.next.unwrap_or(0);
        let verdict = if seq == expected {
            SeqVerdict::InOrder
        } else if seq > expected {
            SeqVerdict::Gap {
                from: expected,
                to: seq,
            }
        } else if self.next.is_some() {
            SeqVerdict::Restarted
        } else {
            SeqVerdict::InOrder
        };
        self.next = Some(seq.saturating_add(1));
        verdict
    }

    /// Whether any batch arrived yet.
    pub fn started(&self) -> bool {
        self.next.is_some()
    }

    /// Judges a batch from a replay of `from..to` (see [`SeqVerdict::Gap`]): apply it only if
    /// it falls inside the gap (a replay answers from `from` on, up to its buffer's end).
    pub fn replayed(seq: u64, from: u64, to: u64) -> bool {
        (from..to).contains(&seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_gap_and_restart() {
        let mut seq = SeqTracker::new();
        assert_eq!(seq.live(0), SeqVerdict::InOrder);
        assert_eq!(seq.live(1), SeqVerdict::InOrder);
        assert_eq!(seq.live(4), SeqVerdict::Gap { from: 2, to: 4 });
        assert!(SeqTracker::replayed(2, 2, 4) && SeqTracker::replayed(3, 2, 4));
        assert!(!SeqTracker::replayed(4, 2, 4) && !SeqTracker::replayed(1, 2, 4));
        assert_eq!(seq.live(5), SeqVerdict::InOrder);
        assert_eq!(seq.live(0), SeqVerdict::Restarted);
        assert_eq!(seq.live(1), SeqVerdict::InOrder);
    }

    #[test]
    fn a_late_subscriber_replays_from_zero() {
        let mut seq = SeqTracker::new();
        assert_eq!(seq.live(7), SeqVerdict::Gap { from: 0, to: 7 });
        assert_eq!(seq.live(8), SeqVerdict::InOrder);
    }

    #[test]
    fn the_largest_sequence_number_does_not_overflow() {
        let mut seq = SeqTracker::new();
        assert_eq!(seq.live(0), SeqVerdict::InOrder);
        assert_eq!(
            seq.live(u64::MAX),
            SeqVerdict::Gap {
                from: 1,
                to: u64::MAX
            }
        );
        assert_eq!(seq.live(0), SeqVerdict::Restarted);
    }
}
