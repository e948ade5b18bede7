//! `gsp`: groups of requests sharing a long system prompt (see `load::workload::gsp`).

use super::Generator;
use crate::load::workload::gsp::GspArgs;
use crate::load::workload::{key, permutation};
use crate::simulate::prompt::Segment;

pub struct GspGen {
    args: GspArgs,
    seed: u64,
    order: Vec<u32>,
}

impl GspGen {
    pub fn new(args: GspArgs, seed: u64) -> Self {
        let n = (args.gsp_groups.max(1) * args.gsp_prompts_per_group.max(1)) as usize;
        let order = permutation(n, seed ^ 0x0067_7370);
        Self { args, seed, order }
    }
}

impl Generator for GspGen {
    fn request(&mut self, index: u64) -> (Vec<Segment>, u32, Option<u64>) {
        let pair = self.order[(index % self.order.len() as u64) as usize];
        let ppg = self.args.gsp_prompts_per_group.max(1);
        let (group, question) = (u64::from(pair / ppg), u64::from(pair % ppg));
        let segments = vec![
            Segment {
                key: key(self.seed, &[1, group]),
                tokens: self.args.gsp_system_len,
            },
            Segment {
                key: key(self.seed, &[2, group, question]),
                tokens: self.args.gsp_question_len.max(1),
            },
        ];
        (segments, self.args.gsp_output_len, None)
    }
}
