//! `gsp`: generated shared prefix (SGLang's `generated-shared-prefix` benchmark).
//!
//! `groups` system prompts of `system_len` tokens, each followed by `prompts_per_group`
//! different questions of `question_len` tokens; every request asks for `output_len` tokens.
//! One pass sends every (group, question) pair once, in a seeded random order.

use super::{BodySettings, RequestSpec, Workload, key, permutation};
use crate::text;

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
    body: BodySettings,
    order: Vec<u32>,
}

impl Gsp {
    /// Builds the workload.
    pub fn new(args: GspArgs, body: BodySettings) -> Self {
        let n = (args.gsp_groups.max(1) * args.gsp_prompts_per_group.max(1)) as usize;
        let order = permutation(n, body.seed ^ 0x0067_7370);
        Self { args, body, order }
    }
}

impl Workload for Gsp {
    fn name(&self) -> &'static str {
        "gsp"
    }

    fn natural_size(&self) -> Option<u64> {
        Some(self.order.len() as u64)
    }

    fn request(&self, index: u64) -> RequestSpec {
        let pair = self.order[(index % self.order.len() as u64) as usize];
        let ppg = self.args.gsp_prompts_per_group.max(1);
        let (group, question) = (u64::from(pair / ppg), u64::from(pair % ppg));
        let seed = self.body.seed;
        let mut prompt = text::text(key(seed, &[1, group]), self.args.gsp_system_len as usize);
        text::push_text(
            &mut prompt,
            key(seed, &[2, group, question]),
            self.args.gsp_question_len as usize,
        );
        RequestSpec {
            api: self.body.api,
            body: self.body.prompt_body(&prompt, self.args.gsp_output_len),
            session: None,
            input_tokens: u64::from(self.args.gsp_system_len + self.args.gsp_question_len),
            output_tokens: self.args.gsp_output_len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::workload::Api;

    #[test]
    fn one_pass_covers_every_pair_and_groups_share_their_system_prompt() {
        let args = GspArgs {
            gsp_groups: 3,
            gsp_prompts_per_group: 4,
            gsp_system_len: 16,
            gsp_question_len: 4,
            gsp_output_len: 2,
        };
        let g = Gsp::new(
            args,
            BodySettings {
                model: "m".into(),
                stream: false,
                api: Api::Completions,
                seed: 2,
            },
        );
        assert_eq!(g.natural_size(), Some(12));
        let prompts: Vec<String> = (0..12)
            .map(|i| {
                let v: serde_json::Value = serde_json::from_slice(&g.request(i).body).unwrap();
                v["prompt"].as_str().unwrap().to_owned()
            })
            .collect();
        let mut unique = prompts.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), 12, "every (group, question) once");
        let mut systems: Vec<&str> = prompts.iter().map(|p| &p[..64]).collect();
        systems.sort();
        systems.dedup();
        assert_eq!(systems.len(), 3, "three shared 16-token system prompts");
        assert!(prompts.iter().all(|p| p.len() == 20 * 4));
    }
}
