//! `hot`: one system prompt in a share of the traffic (see `load::workload::hot`).

use super::Generator;
use crate::load::workload::hot::HotArgs;
use crate::simulate::prompt::Segment;

pub struct HotGen {
    args: HotArgs,
    seed: u64,
}

impl HotGen {
    pub fn new(args: HotArgs, seed: u64) -> Self {
        Self { args, seed }
    }
}

impl Generator for HotGen {
    fn request(&mut self, index: u64) -> (Vec<Segment>, u32, Option<u64>) {
        let segments = self
            .args
            .segments(self.seed, index)
            .iter()
            .map(|&(key, tokens)| Segment { key, tokens })
            .collect();
        (segments, self.args.hot_output_len, None)
    }
}
