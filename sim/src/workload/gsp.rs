//! `gsp`: generated shared prefix (SGLang's `generated-shared-prefix` benchmark).
//!
//! `groups` system prompts of `system_len` tokens, each followed by `prompts_per_group`
//! different questions of `question_len` tokens; every request asks for `output_len` tokens.
//! One pass sends every (group, question) pair once, in a seeded random order.

use super::{Form, Request, Segment, Workload, key, permutation};

/// Parameters of the `gsp` workload.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct GspArgs {
    /// Number of groups (distinct system prompts).
    #[arg(long, default_value_t = 64)]
    pub gsp_groups: u32,
    /// Questions per group.
    #[arg(long, default_value_t = 16)]
    pub gsp_prompts_per_group: u32,
    /// System prompt length, tokens.
    #[arg(long, default_value_t = 2048)]
    pub gsp_system_len: u32,
    /// Question length, tokens.
    #[arg(long, default_value_t = 128)]
    pub gsp_question_len: u32,
    /// Output length, tokens.
    #[arg(long, default_value_t = 256)]
    pub gsp_output_len: u32,
}

/// The `gsp` workload.
pub struct Gsp {
    args: GspArgs,
    seed: u64,
    order: Vec<u32>,
}

impl Gsp {
    /// Builds the workload.
    pub fn new(args: GspArgs, seed: u64) -> Self {
        let n = (args.gsp_groups.max(1) * args.gsp_prompts_per_group.max(1)) as usize;
        let order = permutation(n, seed ^ 0x0067_7370);
        Self { args, seed, order }
    }
}

impl Workload for Gsp {
    fn natural_size(&self) -> Option<u64> {
        Some(self.order.len() as u64)
    }

    fn request(&self, index: u64) -> Request {
        let pair = self.order[(index % self.order.len() as u64) as usize];
        let ppg = self.args.gsp_prompts_per_group.max(1);
        let (group, question) = (u64::from(pair / ppg), u64::from(pair % ppg));
        Request {
            segments: vec![
                Segment {
                    key: key(self.seed, &[1, group]),
                    tokens: self.args.gsp_system_len,
                },
                Segment {
                    key: key(self.seed, &[2, group, question]),
                    tokens: self.args.gsp_question_len.max(1),
                },
            ],
            form: Form::Prompt,
            output_tokens: self.args.gsp_output_len.max(1),
            session: None,
            attachments: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pass_covers_every_pair_and_groups_share_their_system_prompt() {
        let args = GspArgs {
            gsp_groups: 3,
            gsp_prompts_per_group: 4,
            gsp_system_len: 16,
            gsp_question_len: 4,
            gsp_output_len: 2,
        };
        let g = Gsp::new(args, 2);
        assert_eq!(g.natural_size(), Some(12));
        let requests: Vec<Request> = (0..12).map(|i| g.request(i)).collect();
        let mut unique = requests.clone();
        unique.sort_by_key(|r| r.segments[1].key);
        unique.dedup();
        assert_eq!(unique.len(), 12, "every (group, question) once");
        let mut systems: Vec<Segment> = requests.iter().map(|r| r.segments[0]).collect();
        systems.sort_by_key(|s| s.key);
        systems.dedup();
        assert_eq!(systems.len(), 3, "three shared 16-token system prompts");
        assert!(requests.iter().all(|r| r.prompt_tokens() == 20));
        assert_eq!(
            g.request(12),
            requests[0],
            "the next pass repeats the first"
        );
    }
}
