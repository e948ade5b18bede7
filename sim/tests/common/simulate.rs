//! Running `kvmesh-sim simulate` in process, through its command-line flags.

use clap::Parser;
use kvmesh_sim::simulate::{PolicyResult, Report, SimulateArgs, simulate};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: SimulateArgs,
}

/// Simulates with `flags` (as on the command line, without `simulate`).
pub fn run(flags: &str) -> Report {
    let argv = std::iter::once("simulate").chain(flags.split_whitespace());
    let cli = Cli::try_parse_from(argv).expect("valid flags");
    simulate(&cli.args).expect("simulation runs")
}

/// Why `simulate` refuses `flags` (valid as flags), if it does.
pub fn refusal(flags: &str) -> Option<String> {
    let argv = std::iter::once("simulate").chain(flags.split_whitespace());
    let cli = Cli::try_parse_from(argv).expect("valid flags");
    simulate(&cli.args).err().map(|e| e.to_string())
}

/// `name`'s result in the report's first run.
pub fn by_policy<'a>(report: &'a Report, name: &str) -> &'a PolicyResult {
    report.runs[0]
        .results
        .iter()
        .find(|r| r.policy == name)
        .unwrap_or_else(|| panic!("no result for {name}"))
}

/// The fastest and the slowest TTFT of a result: the ends of its CDF.
pub fn ttft_min_max(result: &PolicyResult) -> (f64, f64) {
    match (result.ttft_cdf.first(), result.ttft_cdf.last()) {
        (Some(&(_, min)), Some(&(_, max))) => (min, max),
        _ => panic!("{} completed nothing", result.policy),
    }
}
