//! `rag`: retrieval-augmented prompts over a fixed corpus.
//!
//! A corpus of `docs` documents of `doc_len` tokens. Each request takes `k` distinct documents
//! drawn Zipf-wise (popular documents recur, so their text is shared across requests when they
//! come first), in draw order, after a shared instruction, then a fresh question.

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

/// The `rag` workload.
pub struct Rag {
    args: RagArgs,
    seed: u64,
    cdf: Vec<f64>,
}

impl Rag {
    /// Builds the workload (precomputes the Zipf CDF).
    pub fn new(args: RagArgs, seed: u64) -> Self {
        let n = args.rag_docs.max(1) as usize;
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0;
        for rank in 1..=n {
            acc += 1.0 / (rank as f64).powf(args.rag_zipf);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Self { args, seed, cdf }
    }

    /// The documents of request `index`, in prompt order.
    pub fn documents(&self, index: u64) -> Vec<u32> {
        let mut rng = SplitMix64::new(key(self.seed, &[3, index]));
        let k = (self.args.rag_k as usize).min(self.cdf.len());
        let mut docs = Vec::with_capacity(k);
        let mut attempts = 0;
        while docs.len() < k && attempts < 64 * k {
            attempts += 1;
            let u = rng.next_f64();
            let d = self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1) as u32;
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
}
