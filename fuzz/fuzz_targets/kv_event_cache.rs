#![no_main]
//! See `kvmesh_fuzz::targets::kv_event_cache` for what is decoded and checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvmesh_fuzz::targets::kv_event_cache::run(data));
