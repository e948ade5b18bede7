//! `kvmesh`: the sidecar that runs beside every vLLM server.

mod cli_cert;
mod cli_probe;
mod cli_status;

use clap::{Parser, Subcommand};

/// A decentralized, cache- and load-aware request router for vLLM clusters.
#[derive(Parser, Debug)]
#[command(name = "kvmesh", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create the cluster CA and issue node certificates.
    #[command(subcommand)]
    Cert(cli_cert::CertCommand),
    /// Debugging aid: run only the mesh (QUIC, mutual TLS, gossip) and print the live
    /// membership as JSON lines whenever it changes.
    MeshProbe(cli_probe::ProbeArgs),
    /// Run the sidecar beside a vLLM server: route every request to the best engine of
    /// the mesh.
    Serve(Box<kvmesh_node::serve::config::ServeArgs>),
    /// A table of the cluster as one sidecar sees it: every node's role, models, engine
    /// health, load, KV usage, digest age and version.
    Status(cli_status::StatusArgs),
}

fn serve(args: kvmesh_node::serve::config::ServeArgs) -> anyhow::Result<()> {
    let config = kvmesh_node::serve::config::ServeConfig::resolve(args)?;
    let mut builder = if config.worker_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(config.worker_threads);
        builder
    };
    let runtime = builder.enable_all().build()?;
    runtime.block_on(kvmesh_node::serve::run(config))
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Cert(command) => cli_cert::run(command),
        Command::MeshProbe(args) => cli_probe::run(args),
        Command::Serve(args) => serve(*args),
        Command::Status(args) => cli_status::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // The whole cause chain on one line, without a backtrace: these are user errors.
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
