//! Deterministic synthetic text built from 4-byte pieces.
//!
//! Every piece is exactly [`PIECE_BYTES`] ASCII bytes (a space and a three-letter word), which
//! is also the pseudo-tokenizer's chunk size: a text of `n` pieces is exactly `n` tokens for the
//! mock engine, and cutting such a text at any piece boundary keeps token boundaries aligned.
//! The engine uses the pieces for its output tokens; the load generator builds prompts from them.

use crate::rng::SplitMix64;
use kvmesh_protocol::mix64;

/// Bytes in one piece (equal to the pseudo-tokenizer's bytes per token).
pub const PIECE_BYTES: usize = 4;

/// The piece vocabulary: 64 pieces, so each piece carries 6 bits of entropy.
pub const PIECES: [&str; 64] = [
    " the", " and", " for", " you", " not", " are", " was", " but", " all", " can", " had", " her",
    " one", " our", " out", " day", " get", " has", " him", " his", " how", " man", " new", " now",
    " old", " see", " two", " way", " who", " boy", " did", " its", " let", " put", " say", " she",
    " too", " use", " sun", " sea", " sky", " map", " key", " box", " cup", " pen", " ink", " oak",
    " elm", " fox", " owl", " bee", " ant", " cat", " dog", " car", " bus", " row", " set", " job",
    " art", " law", " war", " age",
];

/// The piece at position `index` of the deterministic text stream named by `key`.
pub fn piece(key: u64, index: u64) -> &'static str {
    PIECES[(mix64(key ^ mix64(index.wrapping_add(0x5851_f42d_4c95_7f2d))) % 64) as usize]
}

/// The pieces of the text stream named by `key`, in order, as indices into [`PIECES`]. The
/// stream is endless; its first `n` pieces do not depend on how many are taken.
pub fn pieces(key: u64) -> impl Iterator<Item = usize> {
    let mut rng = SplitMix64::new(key);
    std::iter::repeat_with(move || (rng.next_u64() % 64) as usize)
}

/// Appends `tokens` pieces of the text stream named by `key` to `out`.
pub fn push_text(out: &mut String, key: u64, tokens: usize) {
    out.reserve(tokens * PIECE_BYTES);
    for p in pieces(key).take(tokens) {
        out.push_str(PIECES[p]);
    }
}

/// A text of exactly `tokens` pieces from the stream named by `key`.
pub fn text(key: u64, tokens: usize) -> String {
    let mut s = String::new();
    push_text(&mut s, key, tokens);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_four_ascii_bytes_and_distinct() {
        let mut seen = std::collections::HashSet::new();
        for p in PIECES {
            assert_eq!(p.len(), PIECE_BYTES, "{p:?}");
            assert!(p.is_ascii());
            assert!(seen.insert(p), "duplicate piece {p:?}");
        }
    }

    /// scripts/lib/vllm/make_tiny_model.py trains the real model's tokenizer so that each of
    /// these pieces is one token; its copy of the list must not drift from this one.
    #[test]
    fn the_tiny_models_tokenizer_is_trained_on_these_pieces() {
        let script = include_str!("../../scripts/lib/vllm/make_tiny_model.py");
        let start = script.find("PIECES = [").expect("the script lists PIECES");
        let list = &script[start..script[start..].find(']').expect("closing bracket") + start];
        let quoted: Vec<&str> = list.split('"').skip(1).step_by(2).collect();
        assert_eq!(
            quoted, PIECES,
            "make_tiny_model.py's PIECES differ from sim/src/text.rs"
        );
    }

    #[test]
    fn text_is_deterministic_and_key_dependent() {
        assert_eq!(text(1, 100), text(1, 100));
        assert_eq!(text(1, 100).len(), 400);
        assert_ne!(text(1, 100), text(2, 100));
        assert!(text(1, 100).starts_with(&text(1, 10)));
        assert_eq!(piece(3, 4), piece(3, 4));
    }
}
