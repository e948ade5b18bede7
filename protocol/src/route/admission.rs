//! Admission of new prefixes at the serving node.
//!
//! Entry nodes place a new prefix on the less loaded of its rendezvous choices, but they judge
//! load from digests that are 100–400 ms old and from their own sends only; in a burst of new
//! prefixes several entries pick the same engine, and each uncached prefill then waits for the
//! others (BENCHMARKS.md, "Where the gsp tail comes from"). The serving node proxies every
//! request to its engine and knows exactly which new prefixes it is still computing, so it
//! may decline one more: the entry then sends it to the prefix's next choice.

/// Whether an engine computing the uncached prefills of `in_flight` (the first block of each new
/// prefix sent to it and not yet answered with a first byte) should take one more, whose first
/// block is `first_block`, given at most `limit` new prefixes computed at once (0: no limit).
///
/// A request sharing its first block with one in flight is always taken: it meets that
/// prefix's blocks as they are computed, while anywhere else it would compute them again, and
/// every entry node sending the same new prefix at once must still land on one engine.
pub fn admit_new_prefix(in_flight: &[u64], first_block: u64, limit: u32) -> bool {
    limit == 0 || in_flight.len() < limit as usize || in_flight.contains(&first_block)
}

#[cfg(test)]
mod tests {
    use super::admit_new_prefix;

    #[test]
    fn an_idle_engine_takes_a_new_prefix() {
        assert!(admit_new_prefix(&[], 7, 1));
    }

    #[test]
    fn a_second_new_prefix_is_declined_at_the_limit_and_taken_below_it() {
        assert!(!admit_new_prefix(&[3], 7, 1));
        assert!(admit_new_prefix(&[3], 7, 2));
        assert!(!admit_new_prefix(&[3, 5], 7, 2));
    }

    #[test]
    fn the_same_new_prefix_is_always_taken() {
        assert!(admit_new_prefix(&[3, 7], 7, 1));
    }

    #[test]
    fn no_limit_takes_everything() {
        assert!(admit_new_prefix(&[1, 2, 3, 4], 7, 0));
    }
}
