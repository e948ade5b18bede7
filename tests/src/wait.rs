//! Bounded polling: tests wait for conditions, never for fixed sleeps.

use std::time::{Duration, Instant};

/// Pause between two polls.
const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// Polls `condition` until it holds; returns how long that took. Panics after `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) -> Duration {
    wait_for(timeout, what, || {
        if condition() {
            Ok(())
        } else {
            Err(String::new())
        }
    })
    .1
}

/// Polls `probe` until it returns `Ok`; returns the value and how long that took. Panics after
/// `timeout`, showing the last `Err` (a description of what was observed instead).
pub fn wait_for<T>(
    timeout: Duration,
    what: &str,
    mut probe: impl FnMut() -> Result<T, String>,
) -> (T, Duration) {
    let started = Instant::now();
    loop {
        let last = match probe() {
            Ok(value) => return (value, started.elapsed()),
            Err(observed) => observed,
        };
        if started.elapsed() >= timeout {
            if last.is_empty() {
                panic!("timed out after {timeout:?} waiting until {what}");
            }
            panic!("timed out after {timeout:?} waiting until {what}; last observed: {last}");
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Checks that `condition` holds at every poll during `period` (an invariant that must not
/// break while something else happens). Panics at the first poll where it does not.
pub fn holds_during(
    period: Duration,
    what: &str,
    mut condition: impl FnMut() -> Result<(), String>,
) {
    let started = Instant::now();
    while started.elapsed() < period {
        if let Err(observed) = condition() {
            panic!(
                "{what} stopped holding after {:?}: {observed}",
                started.elapsed()
            );
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}
