//! `rag`: a shared instruction, Zipf-popular documents, a fresh question (see
//! `load::workload::rag`, whose document draw is reused).

use super::Generator;
use crate::load::workload::rag::{Rag, RagArgs};
use crate::load::workload::{Api, BodySettings, key};
use crate::simulate::prompt::Segment;

/// Tokens of the instruction every RAG prompt starts with (as the load generator's).
const INSTRUCTION_LEN: u32 = 32;

pub struct RagGen {
    rag: Rag,
    args: RagArgs,
    seed: u64,
}

impl RagGen {
    pub fn new(args: RagArgs, seed: u64) -> Self {
        let body = BodySettings {
            model: String::new(),
            stream: false,
            api: Api::Completions,
            seed,
        };
        Self {
            rag: Rag::new(args.clone(), body),
            args,
            seed,
        }
    }
}

impl Generator for RagGen {
    fn request(&mut self, index: u64) -> (Vec<Segment>, u32, Option<u64>) {
        let mut segments = vec![Segment {
            key: key(self.seed, &[4]),
            tokens: INSTRUCTION_LEN,
        }];
        segments.extend(self.rag.documents(index).into_iter().map(|d| Segment {
            key: key(self.seed, &[5, u64::from(d)]),
            tokens: self.args.rag_doc_len,
        }));
        segments.push(Segment {
            key: key(self.seed, &[6, index]),
            tokens: self.args.rag_question_len.max(1),
        });
        (segments, self.args.rag_output_len, None)
    }
}
