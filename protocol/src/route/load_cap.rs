//! Stage 2, the load bound: no candidate is given more than `(1 + ε)×` the mean load (plus a
//! slack) while one under it exists, so a hot prefix spills to the next best engine, which
//! then caches it too (consistent hashing with bounded loads, as KubeAI's CHWBL).

use super::config::{BoundOn, LoadBound};
use super::considered::Considered;
use super::decide::Gauges;

/// What the bound counts of an engine with `gauges` and `pending` sends from this node.
pub(super) fn bounded(bound_on: BoundOn, gauges: &Gauges, pending: u32) -> u32 {
    match bound_on {
        BoundOn::InFlight => gauges.load(),
        BoundOn::Queued => gauges.waiting,
    }
    .saturating_add(pending)
}

/// The most load a candidate may reach by taking this request, over the mean load of
/// `entries` counting the request ([`LoadBound::cap`]).
pub(super) fn cap(entries: &[Considered], load: &LoadBound) -> f64 {
    let total_load: u64 = entries.iter().map(|e| u64::from(e.bounded)).sum();
    let mean = (total_load + 1) as f64 / entries.len() as f64;
    load.cap(mean)
}

/// Whether `entry` stays within `cap` by taking the request.
pub(super) fn under(entry: &Considered, cap: f64) -> bool {
    f64::from(entry.bounded) + 1.0 <= cap
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(bounded: u32) -> Considered {
        Considered {
            bounded,
            ..Considered::blank(0)
        }
    }

    #[test]
    fn the_bound_counts_the_queue_or_everything_in_flight_plus_pending() {
        let gauges = Gauges {
            running: 6,
            waiting: 2,
            kv_usage: 0.5,
            queued_tokens: None,
        };
        assert_eq!(bounded(BoundOn::Queued, &gauges, 1), 3);
        assert_eq!(bounded(BoundOn::InFlight, &gauges, 1), 9);
        assert_eq!(bounded(BoundOn::Queued, &gauges, u32::MAX), u32::MAX);
    }

    #[test]
    fn the_cap_is_over_the_mean_counting_this_request() {
        let pure = LoadBound {
            slack: 0.0,
            ..LoadBound::default()
        };
        // Loads 0, 3, 4: mean (7 + 1) / 3 = 2.67; × 1.25 = 3.33, up to 4.
        let entries = [entry(0), entry(3), entry(4)];
        let cap = cap(&entries, &pure);
        assert_eq!(cap, 4.0);
        assert!(under(&entries[0], cap));
        assert!(
            under(&entries[1], cap),
            "3 + 1 reaches the cap, not past it"
        );
        assert!(!under(&entries[2], cap));
        // The default slack of 2 lets small differences stand.
        let cap = super::cap(&entries, &LoadBound::default());
        assert_eq!(cap, 6.0);
        assert!(under(&entries[2], cap));
    }
}
