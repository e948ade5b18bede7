//! Prefix summaries: a bounded-size encoding of the set of chain hashes an engine holds,
//! published through gossip and queried by every entry node.
