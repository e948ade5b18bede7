//! `kvmesh-sim report`: the demo's report.
//!
//! - `report sample` polls the engines' `/metrics` during a run ([`sample`], [`snapshot`]),
//!   so per-engine load over time and the engine-side TTFT histogram can be charted.
//! - `report render` reads the load generator's JSON reports (one per workload × policy run,
//!   each with its samples file next to it), prints the side-by-side table ([`table`]) and
//!   writes `report.html` ([`html`], charts from [`crate::chart`]) and `results.json`
//!   ([`results`]).

pub mod html;
pub mod results;
pub mod run;
pub mod sample;
pub mod snapshot;
pub mod table;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use results::Results;
use run::Run;

/// `kvmesh-sim report`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    #[command(subcommand)]
    #[allow(missing_docs)]
    pub command: ReportCommand,
}

/// What `kvmesh-sim report` does.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ReportCommand {
    /// Print the side-by-side table and write report.html and results.json.
    Render(RenderArgs),
    /// Poll engines' /metrics into a JSON-lines file until stopped.
    Sample(sample::SampleArgs),
}

/// Flags of `kvmesh-sim report render`.
#[derive(Debug, Clone, clap::Args)]
pub struct RenderArgs {
    /// A run as POLICY=LOAD_JSON (repeatable, in table order): a `kvmesh-sim load --json`
    /// report; engine samples are read from LOAD_JSON's stem + `.samples.jsonl` if present.
    #[arg(long = "run", required = true, value_parser = parse_run)]
    pub runs: Vec<(String, PathBuf)>,
    /// Directory to write report.html and results.json into.
    #[arg(long, default_value = "demo-report")]
    pub out_dir: PathBuf,
    /// Policy the others are compared with.
    #[arg(long, default_value = "round-robin")]
    pub baseline: String,
    /// A fact about the run shown at the top, KEY=VALUE (repeatable).
    #[arg(long = "meta", value_parser = parse_key_value)]
    pub meta: Vec<(String, String)>,
    /// A remark shown at the top (repeatable).
    #[arg(long = "note")]
    pub notes: Vec<String>,
}

/// Runs the subcommand; prints the table for `render`.
pub fn main(args: ReportArgs) -> anyhow::Result<()> {
    match args.command {
        ReportCommand::Render(r) => {
            let table = render(&r)?;
            print!("{table}");
            println!(
                "report: {}\nresults: {}",
                r.out_dir.join("report.html").display(),
                r.out_dir.join("results.json").display()
            );
            Ok(())
        }
        ReportCommand::Sample(s) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(sample::run(&s))
        }
    }
}

/// Reads the runs, writes `report.html` and `results.json` into `out_dir`, returns the table.
pub fn render(args: &RenderArgs) -> anyhow::Result<String> {
    let runs = args
        .runs
        .iter()
        .map(|(policy, path)| run::load(policy, path))
        .collect::<anyhow::Result<Vec<Run>>>()?;
    let figures: Vec<_> = runs.iter().map(|r| r.figures.clone()).collect();
    let results = Results {
        schema: results::SCHEMA,
        generated_at_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0),
        meta: args.meta.iter().cloned().collect::<BTreeMap<_, _>>(),
        notes: args.notes.clone(),
        percentile_method: crate::quantile::METHOD,
        baseline: args.baseline.clone(),
        comparisons: results::comparisons(&figures, &args.baseline),
        runs: figures.clone(),
    };
    std::fs::create_dir_all(&args.out_dir)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", args.out_dir.display()))?;
    write(
        &args.out_dir.join("results.json"),
        serde_json::to_string_pretty(&results)? + "\n",
    )?;
    write(
        &args.out_dir.join("report.html"),
        html::render(&results, &runs),
    )?;
    Ok(table::render(&figures, &args.baseline))
}

fn write(path: &Path, text: String) -> anyhow::Result<()> {
    std::fs::write(path, text).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}

fn parse_run(s: &str) -> Result<(String, PathBuf), String> {
    let (policy, path) = s
        .split_once('=')
        .ok_or_else(|| format!("expected POLICY=LOAD_JSON, got {s:?}"))?;
    if policy.is_empty() || path.is_empty() {
        return Err(format!("expected POLICY=LOAD_JSON, got {s:?}"));
    }
    Ok((policy.to_owned(), PathBuf::from(path)))
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_files_from_load_reports() {
        let dir = std::env::temp_dir().join(format!("kvmesh-report-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("runs")).unwrap();
        let doc: serde_json::Value = serde_json::from_str(run::tests_doc()).unwrap();
        let mut slow = doc.clone();
        slow["ttft_s"]["mean"] = serde_json::json!(0.3);
        slow["cluster"]["hit_rate"] = serde_json::json!(0.2);
        let a = dir.join("runs/gsp-kvmesh.json");
        let b = dir.join("runs/gsp-rr.json");
        std::fs::write(&a, doc.to_string()).unwrap();
        std::fs::write(&b, slow.to_string()).unwrap();
        let args = RenderArgs {
            runs: vec![("kvmesh".into(), a), ("round-robin".into(), b)],
            out_dir: dir.join("out"),
            baseline: "round-robin".into(),
            meta: vec![("machine".into(), "test <box>".into())],
            notes: vec!["vllm-router: not installed".into()],
        };
        let table = render(&args).unwrap();
        assert!(
            table.contains("kvmesh vs round-robin: hit rate +30.0 points"),
            "{table}"
        );
        let results: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("out/results.json")).unwrap())
                .unwrap();
        assert_eq!(results["schema"], "kvmesh.demo.v1");
        assert_eq!(results["runs"].as_array().unwrap().len(), 2);
        assert_eq!(results["comparisons"][0]["beats_baseline"], true);
        let html = std::fs::read_to_string(dir.join("out/report.html")).unwrap();
        assert!(html.contains("test &lt;box&gt;") && html.contains("<svg"));
        assert!(!html.contains("<script"), "self-contained, no script");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn run_flags_need_a_policy_and_a_path() {
        assert!(parse_run("kvmesh=a.json").is_ok());
        assert!(parse_run("a.json").is_err());
        assert!(parse_run("=a.json").is_err());
    }
}
