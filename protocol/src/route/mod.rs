//! The routing decision.
