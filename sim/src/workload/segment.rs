//! A prompt at the token level: segments of deterministic text, each named by a key.
//!
//! A segment is `tokens` pieces of the [`crate::text`] stream named by its key. The load
//! generator sends the segments' text ([`text`]); the simulator hashes their token ids
//! ([`tokens`]), which are exactly the ids the mock engine's tokenizer gives that text: every
//! piece is one 4-byte token, and a prompt of whole pieces keeps every piece on a token
//! boundary. So two prompts that start with the same segments start with the same bytes and
//! the same tokens, in the simulator and in front of a real engine alike.

use std::sync::LazyLock;

use crate::engine::model::tokenizer;
use crate::text::{self, PIECES};

/// A run of `tokens` tokens of the text stream named by `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Segment {
    pub key: u64,
    pub tokens: u32,
}

impl Segment {
    /// Appends the segment's text to `out`.
    pub fn push_text(&self, out: &mut String) {
        text::push_text(out, self.key, self.tokens as usize);
    }
}

/// The text of `segments`, concatenated.
pub fn text(segments: &[Segment]) -> String {
    let mut out = String::with_capacity(
        segments.iter().map(|s| s.tokens as usize).sum::<usize>() * text::PIECE_BYTES,
    );
    for s in segments {
        s.push_text(&mut out);
    }
    out
}

/// The mock engine's token id of each piece.
static PIECE_TOKENS: LazyLock<[u32; 64]> =
    LazyLock::new(|| PIECES.map(|p| tokenizer::token_id(p.as_bytes())));

/// The token ids of [`text`]`(segments)` under the mock engine's tokenizer, without building
/// the text.
pub fn tokens(segments: &[Segment]) -> Vec<u32> {
    let ids = &*PIECE_TOKENS;
    let total: usize = segments.iter().map(|s| s.tokens as usize).sum();
    let mut out = Vec::with_capacity(total);
    for s in segments {
        out.extend(text::pieces(s.key).take(s.tokens as usize).map(|p| ids[p]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn shared_segments_share_text_and_tokens() {
        let system = Segment { key: 1, tokens: 40 };
        let a = [system, Segment { key: 2, tokens: 30 }];
        let b = [system, Segment { key: 3, tokens: 30 }];
        let (ta, tb) = (text(&a), text(&b));
        assert_eq!(ta.len(), 70 * 4);
        assert_eq!(ta[..160], tb[..160]);
        assert_ne!(ta[160..], tb[160..]);
        assert_eq!(tokens(&a)[..40], tokens(&b)[..40]);
        assert_ne!(tokens(&a)[40..], tokens(&b)[40..]);
    }

    proptest! {
        /// The simulator's tokens are the mock engine's tokens of the load generator's text.
        #[test]
        fn tokens_are_the_engines_tokens_of_the_text(
            parts in proptest::collection::vec((any::<u64>(), 0u32..300), 0..6)
        ) {
            let segments: Vec<Segment> =
                parts.iter().map(|&(key, tokens)| Segment { key, tokens }).collect();
            prop_assert_eq!(tokens(&segments), tokenizer::tokenize(&text(&segments)));
        }
    }
}
