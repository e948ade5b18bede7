#![no_main]
//! See `kvmesh_fuzz::targets::load_digest` for what is decoded and checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvmesh_fuzz::targets::load_digest::run(data));
