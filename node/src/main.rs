//! `kvmesh`: the sidecar that runs beside every vLLM server.

use clap::Parser;

/// A decentralized, cache- and load-aware request router for vLLM clusters.
#[derive(Parser, Debug)]
#[command(name = "kvmesh", version, about)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
}
