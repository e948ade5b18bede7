//! Fuzz targets for every kvmesh decoder that reads bytes from a peer or from an engine.
//!
//! Each target in [`targets`] is a plain function over a byte slice: libFuzzer calls it
//! through `fuzz_targets/<name>.rs`, and the `seeds` binary calls the same function on the
//! seed corpus with the stable toolchain. A target does more than look for panics: wherever an
//! encoder exists it checks the round trip (decode, encode, decode again: the same value), and
//! wherever the decoded value feeds state it checks that state against a small model, so a
//! logic bug fails as surely as a crash.

pub mod cache_model;
pub mod input;
pub mod msgpack;
pub mod samples;
pub mod targets;
