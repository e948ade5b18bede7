//! `kvmesh`: the sidecar that runs beside every vLLM server.

mod cli_cert;
mod cli_intents;
mod cli_probe;
mod cli_status;
mod malloc;

use clap::{Parser, Subcommand};

/// jemalloc, not the system allocator. A forwarded request's body (hundreds of kilobytes with
/// an image) passes through buffers of its size on each sidecar: the HTTP body, the pinned
/// copy, QUIC's packets, the serving side's frame. glibc's malloc gave such blocks back to the
/// kernel when they were freed (munmap, or a trimmed heap top) and took fresh ones for the
/// next request, each first touch a page fault: page faults, brk and munmap were a fifth of
/// both sidecars' CPU on 256 KiB images (`BENCHMARKS.md#media-overhead`). jemalloc keeps
/// freed pages and reuses them, returning them to the kernel only after seconds unused.
/// (Feature `jemalloc`, off by default because building it needs make and a C compiler; the
/// Docker image turns it on. heaptrack sees only the system allocator. Without it, glibc's
/// malloc is told to keep such blocks: `malloc`.)
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

// The optional features as string literals, for `concat!`.
#[cfg(feature = "tokenizer")]
macro_rules! tokenizer_feature {
    () => {
        " tokenizer"
    };
}
#[cfg(not(feature = "tokenizer"))]
macro_rules! tokenizer_feature {
    () => {
        ""
    };
}
#[cfg(feature = "jemalloc")]
macro_rules! jemalloc_feature {
    () => {
        " jemalloc"
    };
}
#[cfg(not(feature = "jemalloc"))]
macro_rules! jemalloc_feature {
    () => {
        ""
    };
}

/// `kvmesh --version`: the version and the optional features this binary was built with, so
/// that an operator (or `scripts/demo.sh`) can tell whether `--tokenizer` is available.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (features:",
    tokenizer_feature!(),
    jemalloc_feature!(),
    ")"
);

/// A decentralized, cache- and load-aware request router for vLLM clusters.
#[derive(Parser, Debug)]
#[command(name = "kvmesh", version = VERSION, about)]
struct Cli {
    /// Log lines on stderr: `text` for people, `json` (one object per event, with the fields
    /// of its span: request_id, node, reason, peer) for log pipelines. RUST_LOG filters.
    #[arg(long, global = true, env = "KVMESH_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create the cluster CA and issue node certificates.
    #[command(subcommand)]
    Cert(cli_cert::CertCommand),
    /// Debugging aid: run only the mesh (QUIC, mutual TLS, gossip) and print the live
    /// membership as JSON lines whenever it changes.
    MeshProbe(cli_probe::ProbeArgs),
    /// Check an intents file (`serve --intents`) and measure it on labelled prompts.
    #[command(subcommand)]
    Intents(cli_intents::IntentsCommand),
    /// Run the sidecar beside a vLLM server: route every request to the best engine of
    /// the mesh.
    Serve(Box<kvmesh_node::serve::config::ServeArgs>),
    /// A table of the cluster as one sidecar sees it: every node's role, models, engine
    /// health, load, KV usage, digest age and version.
    Status(cli_status::StatusArgs),
}

fn serve(args: kvmesh_node::serve::config::ServeArgs) -> anyhow::Result<()> {
    use tracing::Instrument as _;
    let config = kvmesh_node::serve::config::ServeConfig::resolve(args)?;
    let mut builder = if config.worker_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(config.worker_threads);
        builder
    };
    let runtime = builder.enable_all().build()?;
    // Events of the node's own steps (start-up, drain) carry its name; a request's events carry
    // the `request` span of the front (request_id, node, reason, peer).
    let span = tracing::info_span!("kvmesh", node = %config.node_id);
    runtime.block_on(kvmesh_node::serve::run(config).instrument(span))
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.init(),
        // The event's fields at the top level, its innermost span's fields under "span".
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
}

fn main() -> std::process::ExitCode {
    let malloc_tuned = malloc::keep_freed_bodies();
    let cli = Cli::parse();
    init_logs(cli.log_format);
    if !malloc_tuned {
        tracing::warn!("glibc refused the malloc thresholds: large request bodies will page-fault");
    }
    let result = match cli.command {
        Command::Cert(command) => cli_cert::run(command),
        Command::MeshProbe(args) => cli_probe::run(args),
        Command::Intents(command) => cli_intents::run(command),
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
