//! When this node's engine last showed that it works: an answer's head or a chunk of an
//! answer's body came back from it.
//!
//! The poller reads it to tell a busy engine from a hung one. A vLLM whose API server shares
//! its cores with the engine (a CPU server, or any engine at deep overload) can leave its
//! `/metrics` unanswered for seconds while every stream it serves still moves; judged by its
//! poller alone it would be dropped as unhealthy, and the requests waiting at it for a first
//! byte given back to an engine as busy, over and over (issue 45: 245 of 640 requests failed
//! that way on two real vLLM servers). A frozen engine sends nothing, and is judged as before.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A clock of the engine's last sign of work, shared by every clone.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    /// Milliseconds since [`epoch`] plus one at the last sign; 0: never.
    last: Arc<AtomicU64>,
}

/// The process's reference instant for [`Progress`].
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Progress {
    /// The engine just sent something.
    pub fn note(&self) {
        self.note_at(Instant::now());
    }

    fn note_at(&self, at: Instant) {
        let ms = at.saturating_duration_since(epoch()).as_millis() as u64 + 1;
        self.last.fetch_max(ms, Ordering::Relaxed);
    }

    /// Whether the engine sent something within `window` before now.
    pub fn within(&self, window: Duration) -> bool {
        self.within_at(window, Instant::now())
    }

    fn within_at(&self, window: Duration, now: Instant) -> bool {
        match self.last.load(Ordering::Relaxed) {
            0 => false,
            last => {
                let now_ms = now.saturating_duration_since(epoch()).as_millis() as u64 + 1;
                now_ms.saturating_sub(last) <= window.as_millis() as u64
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sign_counts_within_its_window_and_not_after() {
        let progress = Progress::default();
        let start = epoch() + Duration::from_secs(10);
        assert!(!progress.within_at(Duration::from_secs(2), start), "never");
        progress.note_at(start);
        assert!(progress.within_at(Duration::from_secs(2), start));
        assert!(progress.within_at(Duration::from_secs(2), start + Duration::from_secs(2)));
        assert!(!progress.within_at(Duration::from_secs(2), start + Duration::from_secs(3)));
        // Clones share the clock; an older sign never moves it back.
        let clone = progress.clone();
        clone.note_at(start + Duration::from_secs(5));
        progress.note_at(start);
        assert!(progress.within_at(Duration::from_secs(1), start + Duration::from_secs(5)));
    }
}
