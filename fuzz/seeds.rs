//! The seed corpus, and the targets' properties checked on the stable toolchain.
//!
//! ```sh
//! cargo run --manifest-path fuzz/Cargo.toml --example seeds           # write fuzz/seeds/<target>/
//! cargo run --manifest-path fuzz/Cargo.toml --example seeds -- check  # every target on
//!                                                                     # fuzz/seeds and fuzz/corpus
//! cargo run --manifest-path fuzz/Cargo.toml --example seeds -- check TARGET FILE...
//! ```
//!
//! `check` is how an input is replayed without libFuzzer: the same function the fuzzer calls,
//! so a failing input prints the property it broke.

use kvmesh_fuzz::targets::{ALL, Target};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn main() -> ExitCode {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None | Some("write") => write(root),
        Some("check") if args.len() == 1 => check_all(root),
        Some("check") => match ALL.iter().find(|t| t.name == args[1]) {
            Some(target) => check(target, args[2..].iter().map(PathBuf::from).collect()),
            None => usage(&format!("unknown target {}", args[1])),
        },
        Some(other) => usage(&format!("unknown command {other}")),
    }
}

fn usage(why: &str) -> ExitCode {
    eprintln!("{why}\nusage: seeds [write] | check [TARGET FILE...]");
    ExitCode::from(2)
}

/// Replaces `seeds/<target>/` with the current seeds, each checked first.
fn write(root: &Path) -> ExitCode {
    for target in &ALL {
        let dir = root.join("seeds").join(target.name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).expect("removing old seeds");
        }
        std::fs::create_dir_all(&dir).expect("creating the seed directory");
        let seeds = (target.seeds)();
        for (i, seed) in seeds.iter().enumerate() {
            (target.run)(seed);
            std::fs::write(dir.join(format!("seed-{i:02}")), seed).expect("writing a seed");
        }
        println!("{:<16} {} seeds", target.name, seeds.len());
    }
    ExitCode::SUCCESS
}

/// Every target on every file of its seed and corpus directories.
fn check_all(root: &Path) -> ExitCode {
    let mut failed = false;
    for target in &ALL {
        let files: Vec<PathBuf> = ["seeds", "corpus"]
            .iter()
            .map(|dir| root.join(dir).join(target.name))
            .filter_map(|dir| std::fs::read_dir(dir).ok())
            .flatten()
            .map(|entry| entry.expect("reading a corpus directory").path())
            .collect();
        failed |= check(target, files) != ExitCode::SUCCESS;
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn check(target: &Target, files: Vec<PathBuf>) -> ExitCode {
    let mut failures = 0;
    for file in &files {
        let data = std::fs::read(file).expect("reading an input");
        if std::panic::catch_unwind(|| (target.run)(&data)).is_err() {
            eprintln!("{}: {} fails", target.name, file.display());
            failures += 1;
        }
    }
    println!(
        "{:<16} {} inputs, {failures} failing",
        target.name,
        files.len()
    );
    if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
