//! `kvmesh-sim engine`: a mock vLLM engine.

pub mod model;
