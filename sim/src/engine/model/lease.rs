//! KV leases: the blocks of a finished prefill leg, kept for the decode engine that will read
//! them (vLLM's NixlConnector `kv_lease_duration`, PR 41383).
//!
//! When a prefill leg finishes by length, the engine does not free its blocks: it grants a
//! lease on them. The blocks stay referenced (they count in KV usage) until the decode engine
//! reports that it read them, aborts, or stops renewing and the lease runs out. A renewal
//! (the decode side's heartbeat) sets the expiry to `max(expiry, now + 2/3 · duration)`, as
//! vLLM does, so a renewal never shortens a lease.

use std::collections::HashMap;
use std::time::Duration;

use super::block_pool::BlockId;
use super::request::RequestId;

#[derive(Debug)]
struct Lease {
    blocks: Vec<BlockId>,
    /// The blocks the decode engine may read (the prompt's; `blocks` may hold more).
    readable: usize,
    expires: Duration,
}

/// The leases an engine has granted, by request.
#[derive(Debug)]
pub struct Leases {
    duration: Duration,
    leases: HashMap<RequestId, Lease>,
}

/// Why a read of leased blocks was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadRefused {
    /// No lease for this request: unknown, already read, aborted or expired.
    #[error("no KV blocks are held for request {0} (unknown, already read or expired)")]
    NotLeased(RequestId),
    /// The blocks asked for are not the tail of the leased prompt blocks.
    #[error("blocks {asked:?} are not held for request {request} (it holds {held:?})")]
    WrongBlocks {
        /// The request.
        request: RequestId,
        /// The blocks asked for.
        asked: Vec<BlockId>,
        /// The readable blocks held.
        held: Vec<BlockId>,
    },
}

impl Leases {
    /// No leases; new ones last `duration`.
    pub fn new(duration: Duration) -> Self {
        Self {
            duration,
            leases: HashMap::new(),
        }
    }

    /// Keeps `blocks` for `id` until `now + duration`; the first `readable` may be read.
    pub fn grant(&mut self, id: RequestId, blocks: Vec<BlockId>, readable: usize, now: Duration) {
        let readable = readable.min(blocks.len());
        let expires = now + self.duration;
        self.leases.insert(
            id,
            Lease {
                blocks,
                readable,
                expires,
            },
        );
    }

    /// The readable blocks of `id`'s lease.
    pub fn readable(&self, id: RequestId) -> Option<&[BlockId]> {
        self.leases.get(&id).map(|l| &l.blocks[..l.readable])
    }

    /// When `id`'s lease runs out.
    pub fn expiry(&self, id: RequestId) -> Option<Duration> {
        self.leases.get(&id).map(|l| l.expires)
    }

    /// Checks that a decode engine may read `asked` from `id`'s lease: a suffix of the readable
    /// blocks (the decode engine skips the blocks its own prefix cache already holds).
    pub fn check_read(&self, id: RequestId, asked: &[BlockId]) -> Result<(), ReadRefused> {
        let held = self.readable(id).ok_or(ReadRefused::NotLeased(id))?;
        if asked.is_empty() || !held.ends_with(asked) {
            return Err(ReadRefused::WrongBlocks {
                request: id,
                asked: asked.to_vec(),
                held: held.to_vec(),
            });
        }
        Ok(())
    }

    /// Extends `id`'s lease to at least `now + 2/3 · duration`. Returns whether it was held.
    pub fn renew(&mut self, id: RequestId, now: Duration) -> bool {
        let extension = self.duration * 2 / 3;
        match self.leases.get_mut(&id) {
            Some(l) => {
                l.expires = l.expires.max(now + extension);
                true
            }
            None => false,
        }
    }

    /// Ends `id`'s lease (read, or aborted by the decode side) and returns its blocks.
    pub fn take(&mut self, id: RequestId) -> Option<Vec<BlockId>> {
        self.leases.remove(&id).map(|l| l.blocks)
    }

    /// Ends every lease that ran out by `now`, calling `free` with each one's blocks.
    /// Returns how many expired.
    pub fn expire(&mut self, now: Duration, mut free: impl FnMut(Vec<BlockId>)) -> usize {
        if self.leases.is_empty() {
            return 0;
        }
        // Every lease is looked at: renewals move expiries, so no order can be relied on.
        let expired: Vec<RequestId> = self
            .leases
            .iter()
            .filter(|(_, l)| l.expires <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in &expired {
            if let Some(l) = self.leases.remove(id) {
                free(l.blocks);
            }
        }
        expired.len()
    }

    /// The earliest expiry, if any lease is held.
    pub fn next_expiry(&self) -> Option<Duration> {
        self.leases.values().map(|l| l.expires).min()
    }

    /// Number of leases held.
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// Whether no lease is held.
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn renewals_extend_by_two_thirds_and_never_shorten() {
        let mut l = Leases::new(30 * S);
        l.grant(1, vec![4, 5, 6], 3, Duration::ZERO);
        assert_eq!(l.expiry(1), Some(30 * S));
        assert!(l.renew(1, 5 * S), "renewing early keeps the longer expiry");
        assert_eq!(l.expiry(1), Some(30 * S));
        assert!(l.renew(1, 25 * S));
        assert_eq!(l.expiry(1), Some(45 * S));
        assert!(!l.renew(2, 25 * S));
    }

    #[test]
    fn reads_must_name_a_suffix_of_the_readable_blocks() {
        let mut l = Leases::new(30 * S);
        l.grant(1, vec![4, 5, 6, 9], 3, Duration::ZERO);
        assert_eq!(l.check_read(1, &[4, 5, 6]), Ok(()));
        assert_eq!(l.check_read(1, &[6]), Ok(()));
        assert!(matches!(
            l.check_read(1, &[9]),
            Err(ReadRefused::WrongBlocks { .. })
        ));
        assert!(matches!(
            l.check_read(1, &[]),
            Err(ReadRefused::WrongBlocks { .. })
        ));
        assert_eq!(l.check_read(2, &[4]), Err(ReadRefused::NotLeased(2)));
        assert_eq!(l.take(1), Some(vec![4, 5, 6, 9]));
        assert_eq!(l.check_read(1, &[4]), Err(ReadRefused::NotLeased(1)));
    }

    #[test]
    fn expiry_frees_every_lapsed_lease_whatever_the_order() {
        let mut l = Leases::new(30 * S);
        l.grant(1, vec![1], 1, Duration::ZERO);
        l.grant(2, vec![2], 1, 10 * S);
        l.renew(1, 20 * S); // now 1 expires at 40 s, after 2 (40 s too) and 3
        l.grant(3, vec![3], 1, Duration::ZERO);
        let mut freed = Vec::new();
        assert_eq!(l.expire(35 * S, |b| freed.extend(b)), 1);
        assert_eq!(freed, vec![3]);
        assert_eq!(l.next_expiry(), Some(40 * S));
        assert_eq!(l.expire(40 * S, |b| freed.extend(b)), 2);
        assert!(l.is_empty());
    }
}
