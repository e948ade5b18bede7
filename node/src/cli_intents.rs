//! `kvmesh intents`: check an intents file, and measure it on labelled prompts (accuracy,
//! confusion matrix, classification time) before a cluster serves it.

use anyhow::Context;
use clap::{Args, Subcommand};
use kvmesh_node::front::intent::IntentRouting;
use kvmesh_protocol::intent::eval::{Labelled, evaluate};
use kvmesh_protocol::intent::text::{PromptText, estimate_tokens};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Subcommand, Debug)]
pub enum IntentsCommand {
    /// Validate an intents file (and load the embedding model) as `kvmesh serve` would, and
    /// print its hash and intents.
    Check(CheckArgs),
    /// Classify labelled prompts (JSON lines `{"intent": ..., "prompt": ...}`) and print the
    /// confusion matrix, the accuracy and the time one classification takes.
    Eval(EvalArgs),
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The intents file.
    #[arg(long)]
    intents: PathBuf,
    /// A static embedding model's directory, as for `kvmesh serve --embedding-model`.
    #[arg(long)]
    embedding_model: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// The intents file.
    #[arg(long)]
    intents: PathBuf,
    /// A static embedding model's directory, as for `kvmesh serve --embedding-model`.
    #[arg(long)]
    embedding_model: Option<PathBuf>,
    /// Labelled prompts, one JSON object a line.
    #[arg(long)]
    prompts: PathBuf,
    /// Times every prompt is classified for the timing figures [default: 20].
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Also list every prompt given another intent than its label, with the nearest centroid's
    /// similarity (what to look at when writing examples and thresholds).
    #[arg(long)]
    misses: bool,
}

pub fn run(command: IntentsCommand) -> anyhow::Result<()> {
    match command {
        IntentsCommand::Check(args) => {
            let routing = IntentRouting::load(&args.intents, args.embedding_model.as_deref())?;
            println!(
                "{}",
                serde_json::to_string_pretty(&routing.describe()).unwrap_or_default()
            );
            Ok(())
        }
        IntentsCommand::Eval(args) => eval(args),
    }
}

fn eval(args: EvalArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let routing = IntentRouting::load(&args.intents, args.embedding_model.as_deref())?;
    let load_ms = started.elapsed().as_secs_f64() * 1e3;
    let text = std::fs::read_to_string(&args.prompts)
        .with_context(|| format!("reading {}", args.prompts.display()))?;
    let prompts = text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str::<Labelled>(line)
                .with_context(|| format!("{} line {}", args.prompts.display(), i + 1))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let router = &routing.router;
    let report = evaluate(router, &prompts);
    if args.misses {
        for labelled in &prompts {
            let choice = router.decide(&PromptText {
                last_user: labelled.prompt.clone(),
                prompt_tokens: estimate_tokens(labelled.prompt.len()),
            });
            if choice.name() != labelled.intent {
                let nearest = choice
                    .nearest
                    .map(|(name, score)| format!("nearest {name} {score:.3}"))
                    .unwrap_or_default();
                println!(
                    "miss: {} -> {} ({}; {nearest}): {}",
                    labelled.intent,
                    choice.name(),
                    choice.via.as_str(),
                    labelled.prompt
                );
            }
        }
    }
    // Time one decision (rules, embedding, centroids) per prompt, the work the request path
    // adds; the JSON rewrite is not included.
    let texts: Vec<PromptText> = prompts
        .iter()
        .map(|p| PromptText {
            last_user: p.prompt.clone(),
            prompt_tokens: estimate_tokens(p.prompt.len()),
        })
        .collect();
    let mut micros = Vec::with_capacity(texts.len() * args.repeat as usize);
    for _ in 0..args.repeat {
        for text in &texts {
            let start = Instant::now();
            std::hint::black_box(router.decide(std::hint::black_box(text)));
            micros.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    micros.sort_by(f64::total_cmp);
    let quantile = |q: f64| kvmesh_protocol::quantile::quantile(&micros, q);
    let mean = micros.iter().sum::<f64>() / micros.len().max(1) as f64;
    println!(
        "intents {} (hash {}), embedding {}, loaded in {load_ms:.1} ms",
        args.intents.display(),
        routing.hash,
        router.embedder().identity(),
    );
    println!("{} prompts from {}", prompts.len(), args.prompts.display());
    print!("{report}");
    println!(
        "classification time per prompt: mean {mean:.1} us, p50 {:.1} us, p99 {:.1} us ({} timed)",
        quantile(0.5),
        quantile(0.99),
        micros.len(),
    );
    Ok(())
}
