//! The pseudo-tokenizer and the chat template of the mock engine.
//!
//! **Tokenizer.** The UTF-8 bytes of a text are cut into consecutive chunks of
//! [`BYTES_PER_TOKEN`] (= 4) bytes; the last chunk may be shorter. Each chunk becomes one
//! token whose id is `mix64(le_u32(chunk zero-padded) | len << 32) mod VOCAB_SIZE`, where
//! `mix64` is the SplitMix64 finaliser (see `kvmesh_protocol::mix64`). So a text of `n` bytes has
//! `ceil(n / 4)` tokens, the same text always gives the same ids, and a text that extends
//! another (at a 4-byte boundary) extends its token ids. There is no BOS token.
//!
//! **Media placeholders.** A media item of a chat prompt (see
//! [`chat_prompt`](super::chat_prompt)) occupies a run of placeholder tokens whose ids lie
//! *outside* the pseudo vocabulary, so no text ever produces them:
//!
//! | modality | id | constant |
//! |---|---|---|
//! | image (`image_url`) | 128000 | [`IMAGE_PLACEHOLDER_TOKEN`] |
//! | audio (`input_audio`) | 128001 | [`AUDIO_PLACEHOLDER_TOKEN`] |
//! | video (`video_url`) | 128002 | [`VIDEO_PLACEHOLDER_TOKEN`] |
//!
//! A router that reads the engine's token ids (the kvmesh sidecar's
//! `--media-placeholder-tokens 128000,128001,128002`) recognises media by these ids.
//!
//! **Chat template.** Messages are rendered, in order, as
//! `<|{role}|>\n{content}<|end|>\n`, followed by `<|assistant|>\n` when a generation prompt is
//! added (the default). Content given as a list of parts contributes its `text` parts in order,
//! and each media part as its start marker, its placeholders and its end marker. Text between
//! media items is tokenized run by run: a media item breaks the 4-byte chunking, as special
//! tokens do in a real tokenizer. `/tokenize` with `messages` and the chat endpoint use this
//! same function, so the token ids `/tokenize` returns are the ids the engine caches.

use kvmesh_protocol::mix64;

/// Placeholder token id of an image (see the module docs).
pub const IMAGE_PLACEHOLDER_TOKEN: u32 = VOCAB_SIZE;

/// Placeholder token id of an audio clip.
pub const AUDIO_PLACEHOLDER_TOKEN: u32 = VOCAB_SIZE + 1;

/// Placeholder token id of a video.
pub const VIDEO_PLACEHOLDER_TOKEN: u32 = VOCAB_SIZE + 2;

/// Whether `id` is a token the engine knows: in the vocabulary or a media placeholder.
pub fn is_known_token(id: u32) -> bool {
    id < VOCAB_SIZE || placeholder_text(id).is_some()
}

/// What a placeholder id detokenizes to.
fn placeholder_text(id: u32) -> Option<&'static str> {
    match id {
        IMAGE_PLACEHOLDER_TOKEN => Some("<|image_pad|>"),
        AUDIO_PLACEHOLDER_TOKEN => Some("<|audio_pad|>"),
        VIDEO_PLACEHOLDER_TOKEN => Some("<|video_pad|>"),
        _ => None,
    }
}

/// Bytes per token of the pseudo-tokenizer.
pub const BYTES_PER_TOKEN: usize = 4;

/// Size of the pseudo vocabulary: token ids are in `0..VOCAB_SIZE`.
pub const VOCAB_SIZE: u32 = 128_000;

/// The id of one chunk of at most [`BYTES_PER_TOKEN`] bytes.
pub fn token_id(chunk: &[u8]) -> u32 {
    debug_assert!(!chunk.is_empty() && chunk.len() <= BYTES_PER_TOKEN);
    let mut v: u64 = 0;
    for (i, b) in chunk.iter().enumerate() {
        v |= u64::from(*b) << (8 * i);
    }
    v |= (chunk.len() as u64) << 32;
    (mix64(v) % u64::from(VOCAB_SIZE)) as u32
}

/// Token ids of `text`.
pub fn tokenize(text: &str) -> Vec<u32> {
    text.as_bytes()
        .chunks(BYTES_PER_TOKEN)
        .map(token_id)
        .collect()
}

/// Number of tokens of `text`, without materialising them.
pub fn count_tokens(text: &str) -> usize {
    text.len().div_ceil(BYTES_PER_TOKEN)
}

/// The text of token ids, as far as the pseudo-tokenizer inverts. Ids are hashes, so only a
/// known vocabulary maps back: the engine's output pieces ([`crate::text::PIECES`], so the
/// text of generated tokens and of the load generator's prompts round-trips) and every single
/// printable ASCII byte or newline (a text's short last chunk). Any other id becomes
/// `<|tok{id}|>`, a stable stand-in, as a real tokenizer decodes every id to something.
pub fn detokenize(ids: &[u32]) -> String {
    static KNOWN: std::sync::OnceLock<std::collections::HashMap<u32, String>> =
        std::sync::OnceLock::new();
    let known = KNOWN.get_or_init(|| {
        let mut m = std::collections::HashMap::new();
        let bytes = (0x20u8..0x7f).chain([b'\n']);
        for b in bytes {
            m.entry(token_id(&[b]))
                .or_insert_with(|| char::from(b).to_string());
        }
        // Pieces go last so they win over the rarer single bytes on an id collision.
        for p in crate::text::PIECES {
            m.insert(token_id(p.as_bytes()), p.to_owned());
        }
        m
    });
    let mut out = String::with_capacity(ids.len() * BYTES_PER_TOKEN);
    for id in ids {
        match known.get(id).map(String::as_str).or(placeholder_text(*id)) {
            Some(t) => out.push_str(t),
            None => {
                out.push_str("<|tok");
                out.push_str(&id.to_string());
                out.push_str("|>");
            }
        }
    }
    out
}

/// One chat message, already reduced to its rendered content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The content text (parts already joined, see the module docs).
    pub content: String,
}

/// Renders `messages` with the fixed chat template (see the module docs).
pub fn render_chat(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let mut out = String::with_capacity(
        messages
            .iter()
            .map(|m| m.content.len() + m.role.len() + 12)
            .sum::<usize>()
            + 16,
    );
    for m in messages {
        push_turn_start(&mut out, &m.role);
        out.push_str(&m.content);
        out.push_str(TURN_END);
    }
    if add_generation_prompt {
        out.push_str(GENERATION_PROMPT);
    }
    out
}

/// Opens a message of `role` in the chat template.
pub(crate) fn push_turn_start(out: &mut String, role: &str) {
    out.push_str("<|");
    out.push_str(role);
    out.push_str("|>\n");
}

/// Closes a message in the chat template.
pub(crate) const TURN_END: &str = "<|end|>\n";

/// The generation prompt the chat template ends with.
pub(crate) const GENERATION_PROMPT: &str = "<|assistant|>\n";

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn four_bytes_per_token_and_deterministic() {
        assert_eq!(tokenize("").len(), 0);
        assert_eq!(tokenize("abcd").len(), 1);
        assert_eq!(tokenize("abcde").len(), 2);
        assert_eq!(tokenize("hello world"), tokenize("hello world"));
        assert_ne!(tokenize("abcd"), tokenize("abce"));
        // A short final chunk is distinct from the same bytes padded with NULs.
        assert_ne!(token_id(b"ab"), token_id(b"ab\0\0"));
    }

    #[test]
    fn chat_template_is_the_documented_one() {
        let msgs = vec![
            ChatMessage {
                role: "system".into(),
                content: "Be brief.".into(),
            },
            ChatMessage {
                role: "user".into(),
                content: "Hi".into(),
            },
        ];
        assert_eq!(
            render_chat(&msgs, true),
            "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"
        );
        assert_eq!(
            render_chat(&msgs[..1], false),
            "<|system|>\nBe brief.<|end|>\n"
        );
    }

    #[test]
    fn detokenize_inverts_pieces_and_short_chunks() {
        let text = crate::text::text(7, 20);
        assert_eq!(detokenize(&tokenize(&text)), text);
        assert_eq!(detokenize(&tokenize(" the fox!")), " the fox!");
        let odd = tokenize("wxyz")[0];
        assert_eq!(detokenize(&[odd]), format!("<|tok{odd}|>"));
        assert_eq!(
            detokenize(&[IMAGE_PLACEHOLDER_TOKEN, VIDEO_PLACEHOLDER_TOKEN]),
            "<|image_pad|><|video_pad|>"
        );
    }

    proptest! {
        #[test]
        fn ids_in_vocab_and_count_matches(s in ".{0,200}") {
            let ids = tokenize(&s);
            prop_assert_eq!(ids.len(), count_tokens(&s));
            prop_assert!(ids.iter().all(|&t| t < VOCAB_SIZE));
        }

        #[test]
        fn aligned_extension_extends_ids(a in "[a-z ]{0,40}", b in "[a-z ]{0,40}") {
            // Pad `a` to a 4-byte boundary: then tokens(a + b) starts with tokens(a).
            let mut a = a;
            while a.len() % BYTES_PER_TOKEN != 0 { a.push('x'); }
            let joined = format!("{a}{b}");
            let ta = tokenize(&a);
            let tj = tokenize(&joined);
            prop_assert_eq!(&tj[..ta.len()], &ta[..]);
        }
    }
}
