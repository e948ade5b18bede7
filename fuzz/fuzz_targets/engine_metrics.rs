#![no_main]
//! See `kvmesh_fuzz::targets::engine_metrics` for what is decoded and checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvmesh_fuzz::targets::engine_metrics::run(data));
