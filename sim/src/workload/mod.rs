//! Workloads at the token level.

pub mod segment;

pub use segment::Segment;
