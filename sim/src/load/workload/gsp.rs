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
