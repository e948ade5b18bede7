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

use super::{BodySettings, RequestSpec, Workload, key};
use crate::text;

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

    /// The text keys and lengths (tokens) of request `index`'s two segments: system prompt,
    /// then question.
    pub fn segments(&self, seed: u64, index: u64) -> [(u64, u32); 2] {
        let system = match self.system_prompt(seed, index) {
            SystemPrompt::Shared(n) => key(seed, &[TAG + 2, u64::from(n)]),
            SystemPrompt::Own => key(seed, &[TAG + 3, index]),
        };
        [
            (system, self.hot_system_len),
            (key(seed, &[TAG + 4, index]), self.hot_question_len.max(1)),
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
    body: BodySettings,
}

impl Hot {
    /// Builds the workload.
    pub fn new(args: HotArgs, body: BodySettings) -> Self {
        Self { args, body }
    }
}

impl Workload for Hot {
    fn name(&self) -> &'static str {
        "hot"
    }

    fn natural_size(&self) -> Option<u64> {
        None
    }

    fn request(&self, index: u64) -> RequestSpec {
        let mut prompt = String::new();
        let mut tokens = 0u64;
        for (key, len) in self.args.segments(self.body.seed, index) {
            text::push_text(&mut prompt, key, len as usize);
            tokens += u64::from(len);
        }
        RequestSpec {
            api: self.body.api,
            body: self.body.prompt_body(&prompt, self.args.hot_output_len),
            session: None,
            input_tokens: tokens,
            output_tokens: self.args.hot_output_len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::workload::Api;
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
        Hot::new(
            args(fraction, prefixes),
            BodySettings {
                model: "m".into(),
                stream: false,
                api: Api::Completions,
                seed: 5,
            },
        )
    }

    fn prompt(workload: &Hot, index: u64) -> String {
        let v: serde_json::Value = serde_json::from_slice(&workload.request(index).body).unwrap();
        v["prompt"].as_str().unwrap().to_owned()
    }

    /// Occurrences of each 16-token system prompt (the first 64 bytes) over `n` requests.
    fn system_counts(workload: &Hot, n: u64) -> HashMap<String, u32> {
        let mut counts = HashMap::new();
        for i in 0..n {
            *counts
                .entry(prompt(workload, i)[..64].to_owned())
                .or_default() += 1;
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
        let spec = workload.request(3);
        assert_eq!(spec.input_tokens, 20);
        assert_eq!(prompt(&workload, 3).len(), 20 * 4);
        assert_eq!(spec.body, workload.request(3).body, "deterministic");
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
            let (a, b) = (prompt(&one, i), prompt(&many, i));
            assert_eq!(a[64..], b[64..], "request {i} keeps its question");
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
