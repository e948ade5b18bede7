//! Named, ordered stages of one long test: tests that share processes too costly to start per
//! `#[test]` (real vLLM servers) run their checks in sequence, and a failure names its stage.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::time::Instant;

/// Runs one stage, printing when it starts and passes; a panic inside is re-raised as
/// `stage NAME failed: MESSAGE`.
pub fn stage<T>(name: &str, body: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    println!("stage {name}: starting");
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => {
            println!("stage {name}: passed in {:?}", started.elapsed());
            value
        }
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()));
            match message {
                Some(message) => panic!("stage {name} failed: {message}"),
                None => resume_unwind(payload),
            }
        }
    }
}
