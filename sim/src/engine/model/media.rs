//! Media items of a multimodal prompt (images, audio, video), as vLLM ≥ 0.17 places them.
//!
//! In the prompt an item is a run of placeholder tokens (see
//! [`tokenizer`](super::tokenizer) for the ids) between a start and an end marker. The item's
//! *identifier* is what the engine folds into the hashes of the blocks its placeholders
//! overlap (see [`block_hash`](super::block_hash)) and reports in `BlockStored.extra_keys`:
//! the part's `uuid` when the caller gave a non-empty one, as vLLM does, otherwise the engine's
//! own content hash ([`engine_identifier`]).
//!
//! vLLM trusts a caller's `uuid` blindly: two different pictures sent under the same `uuid`
//! share their cache entries. That is why a router that wants exact hits must pin the `uuid`
//! to the content it hashed itself (the sidecar's `kvmesh-b3-…` identities).

use base64::Engine as _;
use kvmesh_protocol::hashing::{DEFAULT_MEDIA_TOKENS, data_url_bytes, media_token_estimate};

use super::tokenizer::{AUDIO_PLACEHOLDER_TOKEN, IMAGE_PLACEHOLDER_TOKEN, VIDEO_PLACEHOLDER_TOKEN};

/// The kind of a media item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Modality {
    /// An `image_url` part.
    Image,
    /// An `input_audio` part.
    Audio,
    /// A `video_url` part.
    Video,
}

impl Modality {
    /// The token id each of the item's placeholder positions holds.
    pub fn placeholder_token(self) -> u32 {
        match self {
            Self::Image => IMAGE_PLACEHOLDER_TOKEN,
            Self::Audio => AUDIO_PLACEHOLDER_TOKEN,
            Self::Video => VIDEO_PLACEHOLDER_TOKEN,
        }
    }

    /// Text just before the placeholders (Qwen2-VL's markers; audio after Qwen2-Audio).
    pub fn start_marker(self) -> &'static str {
        match self {
            Self::Image | Self::Video => "<|vision_start|>",
            Self::Audio => "<|audio_bos|>",
        }
    }

    /// Text just after the placeholders.
    pub fn end_marker(self) -> &'static str {
        match self {
            Self::Image | Self::Video => "<|vision_end|>",
            Self::Audio => "<|audio_eos|>",
        }
    }
}

/// Where a media part's content is, as the request gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaSource {
    /// An `image_url` / `video_url`: a `data:` URL or a remote URL the mock never fetches.
    Url(String),
    /// `input_audio.data`: bare base64.
    Base64(String),
}

impl MediaSource {
    /// The decoded bytes, when the request carries them.
    fn bytes(&self) -> Option<Vec<u8>> {
        match self {
            Self::Url(url) => data_url_bytes(url),
            Self::Base64(data) => base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .ok(),
        }
    }

    fn text(&self) -> &str {
        match self {
            Self::Url(s) | Self::Base64(s) => s,
        }
    }
}

/// One media content part of a chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaPart {
    /// Its kind.
    pub modality: Modality,
    /// Its content.
    pub source: MediaSource,
    /// The part-level `uuid`, as given.
    pub uuid: Option<String>,
}

/// How the engine sizes media items (`--media-tokens-per-item`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MediaConfig {
    /// Placeholders per item regardless of content; `None` sizes images from their header.
    pub tokens_per_item: Option<u32>,
}

/// A media part resolved for the prompt: how many placeholders and under which identifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedMedia {
    /// Its kind.
    pub modality: Modality,
    /// The identifier its blocks are keyed by.
    pub identifier: String,
    /// Its placeholder tokens (at least 1).
    pub tokens: u32,
}

impl MediaPart {
    /// Sizes and names the part. `model` is the base model's name, which vLLM's own hash
    /// covers (`model_config.model`, the same for every adapter).
    pub fn resolve(&self, model: &str, cfg: &MediaConfig) -> ResolvedMedia {
        let bytes = self.source.bytes();
        let tokens = match (cfg.tokens_per_item, self.modality, &bytes) {
            (Some(n), _, _) => n,
            (None, Modality::Image, Some(b)) => {
                media_token_estimate(b).unwrap_or(DEFAULT_MEDIA_TOKENS)
            }
            _ => DEFAULT_MEDIA_TOKENS,
        };
        let identifier = match self.uuid.as_deref() {
            Some(uuid) if !uuid.is_empty() => uuid.to_owned(),
            _ => engine_identifier(
                model,
                bytes.as_deref().unwrap_or(self.source.text().as_bytes()),
            ),
        };
        ResolvedMedia {
            modality: self.modality,
            identifier,
            tokens: tokens.max(1),
        }
    }
}

/// Prefix of the identifiers the engine makes up itself: a router cannot reproduce vLLM's own
/// media hash, and the prefix keeps them apart from anything a router pins.
pub const ENGINE_IDENTIFIER_PREFIX: &str = "mock-mm-";

/// The engine's identifier of content it was not given a `uuid` for: the prefix, then the hex
/// blake3 of the model name, a 0 byte and the content (decoded bytes, or the reference's text
/// when it does not decode).
pub fn engine_identifier(model: &str, content: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(model.as_bytes());
    h.update(&[0]);
    h.update(content);
    format!("{ENGINE_IDENTIFIER_PREFIX}{}", h.finalize().to_hex())
}

/// Where a media item sits in a prompt, and what its blocks are keyed by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MediaItem {
    /// Its kind.
    pub modality: Modality,
    /// Its identifier (see the module docs).
    pub identifier: String,
    /// Position of its first placeholder token.
    pub offset: usize,
    /// Number of placeholder tokens.
    pub length: usize,
}

impl MediaItem {
    /// Whether its placeholders overlap token positions `start..end` (vLLM's
    /// `_gen_mm_extra_hash_keys` test).
    pub fn overlaps(&self, start: usize, end: usize) -> bool {
        self.offset < end && start < self.offset + self.length
    }

    /// One past its last placeholder.
    pub fn end(&self) -> usize {
        self.offset + self.length
    }
}

/// Placeholder tokens of the items the encoder must run over when the first `cached_tokens`
/// prompt tokens come from the prefix cache: every item not wholly inside that prefix.
pub fn uncached_media_tokens(items: &[MediaItem], cached_tokens: usize) -> u64 {
    items
        .iter()
        .filter(|m| m.end() > cached_tokens)
        .map(|m| m.length as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(url: &str, uuid: Option<&str>) -> MediaPart {
        MediaPart {
            modality: Modality::Image,
            source: MediaSource::Url(url.into()),
            uuid: uuid.map(str::to_owned),
        }
    }

    #[test]
    fn uuid_wins_and_content_names_the_rest() {
        let cfg = MediaConfig::default();
        let a = image("data:image/png;base64,AAEC", None).resolve("m", &cfg);
        let same_bytes = MediaPart {
            modality: Modality::Audio,
            source: MediaSource::Base64("AAEC".into()),
            uuid: Some(String::new()),
        }
        .resolve("m", &cfg);
        assert_eq!(
            a.identifier, same_bytes.identifier,
            "decoded bytes, not text"
        );
        assert_eq!(a.identifier, engine_identifier("m", &[0, 1, 2]));
        assert!(a.identifier.starts_with(ENGINE_IDENTIFIER_PREFIX));
        assert_ne!(a.identifier, engine_identifier("other", &[0, 1, 2]));
        let url = image("https://x/cat.png", None).resolve("m", &cfg);
        assert_eq!(url.identifier, engine_identifier("m", b"https://x/cat.png"));
        assert_eq!(url.tokens, DEFAULT_MEDIA_TOKENS);
        let pinned = image("https://x/cat.png", Some("u1")).resolve("m", &cfg);
        assert_eq!(pinned.identifier, "u1");
    }

    #[test]
    fn the_flag_fixes_the_size() {
        let cfg = MediaConfig {
            tokens_per_item: Some(7),
        };
        assert_eq!(
            image("https://x/cat.png", None).resolve("m", &cfg).tokens,
            7
        );
    }

    #[test]
    fn overlap_is_half_open() {
        let item = MediaItem {
            modality: Modality::Image,
            identifier: "i".into(),
            offset: 10,
            length: 6,
        };
        assert!(!item.overlaps(0, 10));
        assert!(item.overlaps(0, 11));
        assert!(item.overlaps(15, 20));
        assert!(!item.overlaps(16, 32));
    }
}
