//! `kvmesh-sim`: mock vLLM engine, load generator and cluster simulator.

use clap::Parser;

/// Mock vLLM engine, load generator and cluster simulator for kvmesh.
#[derive(Parser, Debug)]
#[command(name = "kvmesh-sim", version, about)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
}
