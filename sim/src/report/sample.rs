//! `kvmesh-sim report sample`: polls engines' `/metrics` while a load runs and appends one
//! JSON line per tick, so the report can chart per-engine load over time.
//!
//! Each line is written and flushed whole, so stopping the sampler at any moment (SIGINT,
//! SIGTERM) leaves a readable file; a torn last line is skipped by [`read`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::snapshot::{self, EngineSnapshot};
use crate::load::client::LoadClient;

/// Flags of `kvmesh-sim report sample`.
#[derive(Debug, Clone, clap::Args)]
pub struct SampleArgs {
    /// Engine base URLs whose /metrics to poll (comma-separated).
    #[arg(long, value_delimiter = ',', required = true)]
    pub engines: Vec<String>,
    /// Seconds between samples.
    #[arg(long, default_value_t = 0.5)]
    pub interval: f64,
    /// JSON-lines output file (truncated first).
    #[arg(long)]
    pub out: PathBuf,
    /// Stop after this many seconds (default: run until SIGINT or SIGTERM).
    #[arg(long)]
    pub duration: Option<f64>,
}

/// One tick: every engine's snapshot at (about) the same instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Wall clock, Unix seconds.
    pub t: f64,
    /// One entry per `--engines` URL, in order.
    pub engines: Vec<EngineSample>,
}

/// One engine in one tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineSample {
    /// Base URL.
    pub url: String,
    /// Why the scrape failed, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The figures, when the scrape worked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<EngineSnapshot>,
}

/// Polls until the duration elapses or the process is asked to stop.
pub async fn run(args: &SampleArgs) -> anyhow::Result<()> {
    let file = std::fs::File::create(&args.out)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", args.out.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let client = LoadClient::new();
    let engines: Vec<String> = args
        .engines
        .iter()
        .map(|u| u.trim_end_matches('/').to_owned())
        .collect();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(args.interval.max(0.01)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let deadline = args
        .duration
        .map(|d| Instant::now() + Duration::from_secs_f64(d.max(0.0)));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let sample = sample_once(&client, &engines).await;
        serde_json::to_writer(&mut out, &sample)?;
        out.write_all(b"\n")?;
        out.flush()?;
    }
    Ok(())
}

/// Scrapes every engine concurrently.
async fn sample_once(client: &LoadClient, engines: &[String]) -> Sample {
    let t = unix_now();
    let scrapes = engines.iter().map(|url| async move {
        let got = client.get_text(&format!("{url}/metrics")).await;
        match got {
            Ok((status, text)) if status.is_success() => EngineSample {
                url: url.clone(),
                error: None,
                metrics: Some(snapshot::parse(&text)),
            },
            Ok((status, _)) => EngineSample {
                url: url.clone(),
                error: Some(format!("HTTP {status}")),
                metrics: None,
            },
            Err(e) => EngineSample {
                url: url.clone(),
                error: Some(e),
                metrics: None,
            },
        }
    });
    Sample {
        t,
        engines: futures::future::join_all(scrapes).await,
    }
}

/// Reads a samples file, skipping lines that do not parse (a torn last line).
pub fn read(path: &Path) -> anyhow::Result<Vec<Sample>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_last_line_is_skipped() {
        let dir = std::env::temp_dir().join(format!("kvmesh-sample-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.jsonl");
        let s = Sample {
            t: 1.5,
            engines: vec![EngineSample {
                url: "http://e".into(),
                error: None,
                metrics: Some(EngineSnapshot {
                    running: 2.0,
                    ..Default::default()
                }),
            }],
        };
        let line = serde_json::to_string(&s).unwrap();
        std::fs::write(&path, format!("{line}\n{}", &line[..line.len() / 2])).unwrap();
        assert_eq!(read(&path).unwrap(), vec![s]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
