#![no_main]
//! See `kvmesh_fuzz::targets::summary_shard` for what is decoded and checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvmesh_fuzz::targets::summary_shard::run(data));
