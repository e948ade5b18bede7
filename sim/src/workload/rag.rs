//! `rag`: retrieval-augmented prompts over a fixed corpus.
//!
//! A corpus of `docs` documents of `doc_len` tokens. Each request takes `k` distinct documents
//! drawn Zipf-wise (popular documents recur, so their text is shared across requests when they
//! come first), in draw order, after a shared instruction, then a fresh question.
//!
//! [`PRESSURE`] is the cache-pressure preset (`--workload rag-pressure`), made for engines of
//! [`PRESSURE_KV_BLOCKS`] KV blocks.

use super::zipf::Zipf;
use super::{Form, Request, Segment, Workload, key};
use crate::rng::SplitMix64;

/// Tokens of the instruction every RAG prompt starts with.
const INSTRUCTION_LEN: u32 = 32;

/// Parameters of the `rag` workload.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct RagArgs {
    /// Documents in the corpus.
    #[arg(long, default_value_t = 1000)]
    pub rag_docs: u32,
    /// Document length, tokens.
    #[arg(long, default_value_t = 512)]
    pub rag_doc_len: u32,
    /// Documents per request.
    #[arg(long, default_value_t = 4)]
    pub rag_k: u32,
    /// Zipf exponent of document popularity.
    #[arg(long, default_value_t = 1.1)]
    pub rag_zipf: f64,
    /// Question length, tokens.
    #[arg(long, default_value_t = 64)]
    pub rag_question_len: u32,
    /// Output length, tokens.
    #[arg(long, default_value_t = 128)]
    pub rag_output_len: u32,
}

/// RAG under cache pressure (`--workload rag-pressure`), for engines of
/// [`PRESSURE_KV_BLOCKS`] blocks.
///
/// Six documents of 2,048 tokens, two per request, drawn Zipf-wise with exponent 1 (the first
/// document is document 0 in 41% of requests, document 5 in 7%), a 64-token question and 32
/// output tokens: a prompt is 4,192 tokens, almost all of it shareable. An engine's 10,240
/// tokens of KV hold two or three of the 30 ordered document pairs (2.4 prompts); the four
/// engines of the demo together hold about half of them. Caching matters, but not
/// trivially: a first document with its five possible seconds (12,288 tokens) does not fit
/// one engine, and the most popular first document draws more traffic than one engine of four
/// should serve, so a router has to keep each engine on a few contexts and still spread the
/// load. Hashing the first blocks does not help (they are the instruction every request
/// shares). `kvmesh-sim simulate --nodes 4 --workload rag-pressure --rate 4` (seeds 1 and 2):
/// round-robin hits 33-35% of prompt tokens, least-loaded the same, the oracle 79-80%, with a
/// mean TTFT 0.36-0.38x round-robin's.
pub const PRESSURE: RagArgs = RagArgs {
    rag_docs: 6,
    rag_doc_len: 2048,
    rag_k: 2,
    rag_zipf: 1.0,
    rag_question_len: 64,
    rag_output_len: 32,
};

/// KV blocks (of 16 tokens) per engine that [`PRESSURE`] is made for: 10,240 tokens.
pub const PRESSURE_KV_BLOCKS: u32 = 640;

/// The `rag` workload.
pub struct Rag {
    args: RagArgs,
    seed: u64,
    popularity: Zipf,
}

impl Rag {
    /// Builds the workload (precomputes the Zipf CDF).
    pub fn new(args: RagArgs, seed: u64) -> Self {
        let popularity = Zipf::new(args.rag_docs, args.rag_zipf);
        Self {
            args,
            seed,
            popularity,
        }
    }

    /// The documents of request `index`, in prompt order.
    pub fn documents(&self, index: u64) -> Vec<u32> {
        let mut rng = SplitMix64::new(key(self.seed, &[3, index]));
        let k = (self.args.rag_k as usize).min(self.popularity.len());
        let mut docs = Vec::with_capacity(k);
        let mut attempts = 0;
        while docs.len() < k && attempts < 64 * k {
            attempts += 1;
            let d = self.popularity.pick(rng.next_f64());
            if !docs.contains(&d) {
                docs.push(d);
            }
        }
        docs
    }
}

impl Workload for Rag {
    fn natural_size(&self) -> Option<u64> {
        None
    }

    fn request(&self, index: u64) -> Request {
        let seed = self.seed;
        let mut segments = vec![Segment {
            key: key(seed, &[4]),
            tokens: INSTRUCTION_LEN,
        }];
        segments.extend(self.documents(index).into_iter().map(|d| Segment {
            key: key(seed, &[5, u64::from(d)]),
            tokens: self.args.rag_doc_len,
        }));
        segments.push(Segment {
            key: key(seed, &[6, index]),
            tokens: self.args.rag_question_len.max(1),
        });
        Request {
            segments,
            form: Form::Prompt,
            output_tokens: self.args.rag_output_len.max(1),
            session: None,
            attachments: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_distinct_and_popular_ones_recur() {
        let args = RagArgs {
            rag_docs: 100,
            rag_doc_len: 8,
            rag_k: 4,
            rag_zipf: 1.1,
            rag_question_len: 4,
            rag_output_len: 2,
        };
        let rag = Rag::new(args, 1);
        let mut counts = vec![0u32; 100];
        for i in 0..2000 {
            let d = rag.documents(i);
            assert_eq!(d.len(), 4);
            let mut s = d.clone();
            s.sort();
            s.dedup();
            assert_eq!(s.len(), 4, "distinct");
            for x in d {
                counts[x as usize] += 1;
            }
        }
        assert!(
            counts[0] > 5 * counts[50].max(1),
            "doc 0 {} vs doc 50 {}",
            counts[0],
            counts[50]
        );
        let request = rag.request(7);
        assert_eq!(request.prompt_tokens(), 32 + 4 * 8 + 4);
        assert_eq!(
            request.segments[0],
            rag.request(8).segments[0],
            "one instruction"
        );
        assert_eq!(request, rag.request(7), "deterministic");
    }

    #[test]
    fn the_demo_starts_rag_pressure_engines_with_the_presets_kv() {
        let demo =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/demo.sh"))
                .expect("scripts/demo.sh");
        let case = demo
            .split("        rag-pressure)\n")
            .nth(1)
            .expect("demo.sh configures rag-pressure");
        let case = &case[..case.find(";;").expect("the case ends")];
        let kv_blocks = case
            .split("--kv-blocks ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<u32>().ok());
        assert_eq!(kv_blocks, Some(PRESSURE_KV_BLOCKS));
    }
}
