//! `hot`: one system prompt in a given share of the traffic (a hot prefix), the rest on
//! prefixes of their own.
//!
//! Every request is a system prompt of `system_len` tokens, then a question of `question_len`
//! tokens of its own, and asks for `output_len` tokens. A seeded coin with probability
//! `fraction` decides whether request `i` belongs to the shared share; a shared request's
//! system prompt is one of `prefixes` shared prompts (one: a single hot prefix), any other
//! request's system prompt is its own. The same seed with a different `prefixes` sends the
//! same arrivals, questions and own prefixes, with the shared share spread over that many
//! system prompts instead of one: the control "the same load over distinct prefixes".
//! `fraction` 0 gives every request a distinct prefix.

use super::{Form, Request, Segment, Workload, key};

/// Key labels of the workload's text streams (distinct from the other workloads').
const TAG: u64 = 0x686f_7400;

/// Parameters of the `hot` workload.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct HotArgs {
    /// Share of requests whose system prompt is a shared one.
    #[arg(long, default_value_t = 0.8)]
    pub hot_fraction: f64,
    /// Shared system prompts the shared share is spread over (1: one hot prefix).
    #[arg(long, default_value_t = 1)]
    pub hot_prefixes: u32,
    /// System prompt length, tokens.
    #[arg(long, default_value_t = 2048)]
    pub hot_system_len: u32,
    /// Question length (each request's own suffix), tokens.
    #[arg(long, default_value_t = 256)]
    pub hot_question_len: u32,
    /// Output length, tokens.
    #[arg(long, default_value_t = 16)]
    pub hot_output_len: u32,
}

/// Which system prompt a request starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SystemPrompt {
    /// Shared prompt number `n` (of `hot_prefixes`).
    Shared(u32),
    /// The request's own prompt.
    Own,
}

impl HotArgs {
    /// The system prompt of request `index` under `seed`.
    pub fn system_prompt(&self, seed: u64, index: u64) -> SystemPrompt {
        let coin = unit(key(seed, &[TAG, index]));
        if coin >= self.hot_fraction {
            return SystemPrompt::Own;
        }
        match self.hot_prefixes {
            0 | 1 => SystemPrompt::Shared(0),
            n => SystemPrompt::Shared((key(seed, &[TAG + 1, index]) % u64::from(n)) as u32),
        }
    }

    /// Request `index`'s two segments under `seed`: system prompt, then question.
    pub fn segments(&self, seed: u64, index: u64) -> [Segment; 2] {
        let system = match self.system_prompt(seed, index) {
            SystemPrompt::Shared(n) => key(seed, &[TAG + 2, u64::from(n)]),
            SystemPrompt::Own => key(seed, &[TAG + 3, index]),
        };
        [
            Segment {
                key: system,
                tokens: self.hot_system_len,
            },
            Segment {
                key: key(seed, &[TAG + 4, index]),
                tokens: self.hot_question_len.max(1),
            },
        ]
    }
}

/// A uniform float in `[0, 1)` from 64 random bits.
fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// The `hot` workload.
pub struct Hot {
    args: HotArgs,
    seed: u64,
}

impl Hot {
    /// Builds the workload.
    pub fn new(args: HotArgs, seed: u64) -> Self {
        Self { args, seed }
    }
}

impl Workload for Hot {
    fn natural_size(&self) -> Option<u64> {
        None
    }

    fn request(&self, index: u64) -> Request {
        Request {
            segments: self.args.segments(self.seed, index).to_vec(),
            form: Form::Prompt,
            output_tokens: self.args.hot_output_len.max(1),
            session: None,
            attachments: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn args(fraction: f64, prefixes: u32) -> HotArgs {
        HotArgs {
            hot_fraction: fraction,
            hot_prefixes: prefixes,
            hot_system_len: 16,
            hot_question_len: 4,
            hot_output_len: 2,
        }
    }

    fn hot(fraction: f64, prefixes: u32) -> Hot {
        Hot::new(args(fraction, prefixes), 5)
    }

    /// Occurrences of each system prompt over `n` requests.
    fn system_counts(workload: &Hot, n: u64) -> HashMap<Segment, u32> {
        let mut counts = HashMap::new();
        for i in 0..n {
            *counts.entry(workload.request(i).segments[0]).or_default() += 1;
        }
        counts
    }

    #[test]
    fn one_system_prompt_carries_the_hot_share_and_the_rest_are_distinct() {
        let workload = hot(0.8, 1);
        let counts = system_counts(&workload, 2_000);
        let top = *counts.values().max().unwrap();
        assert!((1_520..=1_680).contains(&top), "hot share {top} of 2000");
        assert_eq!(
            counts.values().filter(|&&c| c > 1).count(),
            1,
            "only the hot prompt repeats"
        );
        assert_eq!(counts.len() as u32, 2_000 - top + 1);
        let request = workload.request(3);
        assert_eq!(request.prompt_tokens(), 20);
        assert_eq!(request, workload.request(3), "deterministic");
    }

    #[test]
    fn the_control_spreads_the_same_share_over_many_prefixes_with_the_same_questions() {
        let (one, many) = (hot(0.8, 1), hot(0.8, 16));
        let counts = system_counts(&many, 2_000);
        let shared: Vec<u32> = counts.values().copied().filter(|&c| c > 1).collect();
        assert_eq!(shared.len(), 16, "{shared:?}");
        assert!(
            shared.iter().all(|&c| (60..=140).contains(&c)),
            "{shared:?}"
        );
        for i in 0..200 {
            let (a, b) = (one.request(i).segments, many.request(i).segments);
            assert_eq!(a[1], b[1], "request {i} keeps its question");
            let shared_a = one.args.system_prompt(5, i) != SystemPrompt::Own;
            let shared_b = many.args.system_prompt(5, i) != SystemPrompt::Own;
            assert_eq!(shared_a, shared_b, "request {i} keeps its share");
            if !shared_a {
                assert_eq!(a, b, "request {i} keeps its own prefix");
            }
        }
    }

    #[test]
    fn fraction_zero_gives_every_request_its_own_prefix() {
        let counts = system_counts(&hot(0.0, 1), 500);
        assert_eq!(counts.len(), 500);
    }
}
