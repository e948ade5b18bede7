//! Helpers for the end-to-end tests: starting `kvmesh` and `kvmesh-sim` processes on ephemeral
//! loopback ports, bounded waits, and cleanup that leaves no process behind.
