//! The new prefixes this node's engine is computing: requests whose prompt no engine held when
//! their entry decided, sent to this engine (from here or by a peer), not yet answered with a
//! first byte. For a streamed answer that is the first token, so what is counted is exactly the
//! uncached prefill; a whole (non-streamed) answer counts until it is complete, which errs
//! towards sending the next new prefix to its other choice.

use kvmesh_protocol::route::admit_new_prefix;
use kvmesh_protocol::wire::RequestHead;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::{Arc, Mutex};

use super::state::lock;

#[derive(Clone, Debug, Default)]
pub struct NewPrefixes {
    /// First block of each new prefix in flight (a multiset: a prefix sent twice is here twice).
    in_flight: Arc<Mutex<Vec<u64>>>,
    /// Operator view (handles shared with [`crate::metrics::NodeMetrics`]): how many are in
    /// flight, how many this node declined.
    in_flight_gauge: Gauge,
    declined: Counter,
}

impl NewPrefixes {
    pub fn new(in_flight_gauge: Gauge, declined: Counter) -> Self {
        Self {
            in_flight: Arc::default(),
            in_flight_gauge,
            declined,
        }
    }

    /// Counts a new prefix sent to this engine, or declines it (`None`) when `may_decline` and
    /// the engine already computes `limit` others.
    pub fn admit(&self, first_block: u64, may_decline: bool, limit: u32) -> Option<InFlightPrefix> {
        let mut in_flight = lock(&self.in_flight);
        if may_decline && !admit_new_prefix(&in_flight, first_block, limit) {
            self.declined.inc();
            return None;
        }
        in_flight.push(first_block);
        self.in_flight_gauge.set(in_flight.len() as i64);
        Some(InFlightPrefix {
            owner: self.clone(),
            first_block,
        })
    }

    /// [`Self::admit`] for a forwarded or local request: its head says whether it carries a
    /// new prefix and whether it may be declined. `Err(Declined)` when this node declines it.
    pub fn admit_head(
        &self,
        head: &RequestHead,
        limit: u32,
    ) -> Result<Option<InFlightPrefix>, Declined> {
        match head.new_prefix {
            Some(first_block) => self
                .admit(first_block, head.may_decline, limit)
                .map(Some)
                .ok_or(Declined),
            None => Ok(None),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.in_flight).len()
    }
}

/// This node declined a new prefix: its engine computes others.
#[derive(Debug)]
pub struct Declined;

/// One new prefix in flight; dropping it (at the first byte of the answer, or when the request
/// ends without one) takes it out.
#[derive(Debug)]
pub struct InFlightPrefix {
    owner: NewPrefixes,
    first_block: u64,
}

impl Drop for InFlightPrefix {
    fn drop(&mut self) {
        let mut in_flight = lock(&self.owner.in_flight);
        if let Some(i) = in_flight.iter().position(|&b| b == self.first_block) {
            in_flight.swap_remove(i);
        }
        self.owner.in_flight_gauge.set(in_flight.len() as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::NewPrefixes;

    #[test]
    fn a_prefix_leaves_when_its_guard_drops_and_only_declinable_requests_are_declined() {
        let prefixes = NewPrefixes::default();
        let first = prefixes.admit(1, true, 1).expect("idle engine takes it");
        assert!(prefixes.admit(2, true, 1).is_none(), "busy: declined");
        assert_eq!(prefixes.declined.get(), 1);
        let same = prefixes.admit(1, true, 1).expect("same prefix joins");
        let forced = prefixes
            .admit(3, false, 1)
            .expect("a last attempt is never declined");
        assert_eq!((prefixes.len(), prefixes.in_flight_gauge.get()), (3, 3));
        drop((first, same, forced));
        assert_eq!((prefixes.len(), prefixes.in_flight_gauge.get()), (0, 0));
        assert!(prefixes.admit(2, true, 1).is_some());
    }
}
