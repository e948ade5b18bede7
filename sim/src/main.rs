//! `kvmesh-sim`: mock vLLM engine, load generator and cluster simulator.

use std::io::Write;

use clap::{Parser, Subcommand};
use kvmesh_sim::engine;
use kvmesh_sim::engine::config::EngineArgs;
use kvmesh_sim::load::config::LoadArgs;
use kvmesh_sim::load::{report, runner};
use kvmesh_sim::report::ReportArgs;
use kvmesh_sim::simulate::{self, SimulateArgs};

/// Mock vLLM engine, load generator and cluster simulator for kvmesh.
#[derive(Parser, Debug)]
#[command(name = "kvmesh-sim", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a mock vLLM engine (OpenAI API, /metrics, /tokenize, KV events).
    Engine(EngineArgs),
    /// Generate load against OpenAI-compatible targets and report latency and cache hits.
    Load(LoadArgs),
    /// Simulate a cluster (engines, gossip, routing policies) in virtual time.
    Simulate(Box<SimulateArgs>),
    /// Sample engines during a run; render the demo's table, report.html and results.json.
    Report(ReportArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Engine(args) => run_engine(args),
        Command::Load(args) => run_load(args),
        Command::Simulate(args) => run_simulate(&args),
        Command::Report(args) => kvmesh_sim::report::main(args),
    }
}

fn run_load(args: LoadArgs) -> anyhow::Result<()> {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.threads {
        rt.worker_threads(n.max(1));
    }
    let rt = rt.enable_all().build()?;
    let report = rt.block_on(runner::run(&args))?;
    print!("{}", report::table(&report));
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, json + "\n")
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

fn run_simulate(args: &SimulateArgs) -> anyhow::Result<()> {
    let report = simulate::simulate(args)?;
    print!("{}", simulate::report::markdown(&report));
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, json + "\n")
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    if let Some(dir) = &args.svg_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
        let plots = [
            ("ttft-cdf.svg", simulate::svg::ttft_cdf(&report)),
            (
                "hit-rate-vs-nodes.svg",
                simulate::svg::hit_rate_vs_nodes(&report),
            ),
            (
                "gossip-vs-nodes.svg",
                simulate::svg::gossip_vs_nodes(&report),
            ),
        ];
        for (name, svg) in plots {
            if let Some(svg) = svg {
                let path = dir.join(name);
                std::fs::write(&path, svg)
                    .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
            }
        }
    }
    Ok(())
}

fn run_engine(args: EngineArgs) -> anyhow::Result<()> {
    // One thread: the engine is meant to be pinned to a core and to be cheap.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (addrs, serve) = engine::start(&args).await?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "kvmesh-sim engine listening on http://{}", addrs.http)?;
        if let Some(ep) = &addrs.kv_events {
            writeln!(out, "kv events on {ep}")?;
        }
        if let Some(ep) = &addrs.kv_events_replay {
            writeln!(out, "kv events replay on {ep}")?;
        }
        if let Some(addr) = &addrs.nixl_side_channel {
            writeln!(out, "nixl side channel on {addr}")?;
        }
        out.flush()?;
        drop(out);
        tokio::select! {
            r = serve => r?,
            _ = tokio::signal::ctrl_c() => {}
        }
        Ok(())
    })
}
