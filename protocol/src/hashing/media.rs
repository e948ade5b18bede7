//! The identity of a media item (an image, audio or video part) and its size in tokens.
//!
//! An item whose bytes the sidecar sees (a `data:` URL, `input_audio.data`, or a URL fetched
//! with `--fetch-media`) is identified by the blake3 of its decoded bytes, so the same picture
//! hashes the same whether it arrives as a data URL or as bare base64. A plain URL is
//! identified by its text: a router cannot fetch on the request path by default, so it trusts
//! the URL to name the same content each time (a hint only; the engine hashes what it fetches).
//!
//! A verified identity travels to the engine as the part's `uuid` ([`MediaId::uuid`]); vLLM
//! uses a caller's `uuid` as the item's identifier in its block hashes and KV events, which is
//! how exact mode recognises an image in `BlockStored.extra_keys` (see `pin`).

use base64::Engine as _;
use serde_json::Value;

/// The content identity of one media item: blake3 of its bytes (or of its URL's text).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct MediaId(pub [u8; 32]);

/// What a verified identity looks like as a `uuid`: this prefix, then 64 lowercase hex digits.
/// Client `uuid`s are kept out of this namespace (see `pin`), so an engine identifier of this
/// form always names bytes a sidecar hashed.
pub const VERIFIED_UUID_PREFIX: &str = "kvmesh-b3-";

impl MediaId {
    /// The identity of decoded media bytes.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self(*blake3::hash(bytes).as_bytes())
    }

    /// The identity of a reference: a base64 `data:` URL by its decoded bytes, anything else
    /// (a plain URL, or a data URL that does not decode) by its text.
    pub fn of_reference(reference: &str) -> Self {
        MediaPart::Url(reference)
            .verified_identity()
            .unwrap_or_else(|| Self::of_bytes(reference.as_bytes()))
    }

    /// The identity of bare base64 (`input_audio.data`); undecodable text by its text.
    pub fn of_base64(data: &str) -> Self {
        MediaPart::Base64(data)
            .verified_identity()
            .unwrap_or_else(|| Self::of_bytes(data.as_bytes()))
    }

    /// The `uuid` a sidecar writes into a part whose bytes it hashed.
    pub fn uuid(&self) -> String {
        let mut out = String::with_capacity(VERIFIED_UUID_PREFIX.len() + 64);
        out.push_str(VERIFIED_UUID_PREFIX);
        for byte in self.0 {
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 15)]));
        }
        out
    }

    /// The identity a verified `uuid` names; `None` for any other string.
    pub fn from_uuid(uuid: &str) -> Option<Self> {
        let hex = uuid.strip_prefix(VERIFIED_UUID_PREFIX)?.as_bytes();
        if hex.len() != 64 {
            return None;
        }
        let mut id = [0u8; 32];
        for (byte, pair) in id.iter_mut().zip(hex.chunks_exact(2)) {
            *byte = (hex_value(pair[0])? << 4) | hex_value(pair[1])?;
        }
        Some(Self(id))
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

/// The decoded payload of a base64 `data:` URL; `None` for anything else.
pub fn data_url_bytes(url: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(data_url_payload(url)?.trim())
        .ok()
}

/// The base64 text of a `data:` URL; `None` for anything else.
fn data_url_payload(url: &str) -> Option<&str> {
    let (meta, payload) = url.strip_prefix("data:")?.split_once(',')?;
    meta.ends_with(";base64").then_some(payload)
}

/// [`MediaId::of_bytes`] of `base64`'s decoding, decoded in chunks; `None` when it does not
/// decode. Chunks are whole 4-character groups, so only the last can hold padding, and the
/// result (and any error) is the whole decode's.
fn streamed_identity(base64: &str) -> Option<MediaId> {
    const CHUNK_CHARS: usize = 64 * 1024;
    let mut hasher = blake3::Hasher::new();
    let mut decoded = [0u8; CHUNK_CHARS / 4 * 3];
    for chunk in base64.as_bytes().chunks(CHUNK_CHARS) {
        let n = base64::engine::general_purpose::STANDARD
            .decode_slice(chunk, &mut decoded)
            .ok()?;
        hasher.update(&decoded[..n]);
    }
    Some(MediaId(*hasher.finalize().as_bytes()))
}

/// The content parts of a chat body's messages, in order: the elements of every message's
/// `content` array (a message whose content is a string has none). One definition for
/// hashing, pinning and fetching, since the raw splice (`splice`) places uuids by a part's
/// ordinal in this order.
pub fn content_parts(body: &Value) -> impl Iterator<Item = &Value> {
    body.get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|message| message.get("content")?.as_array())
        .flatten()
}

/// [`content_parts`], mutable.
pub fn content_parts_mut(body: &mut Value) -> impl Iterator<Item = &mut Value> {
    body.get_mut("messages")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(|message| message.get_mut("content")?.as_array_mut())
        .flatten()
}

/// Where a chat content part keeps its media, if it is a media part.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum MediaPart<'a> {
    /// `image_url`, `video_url`, `audio_url` or `input_image`: a URL, possibly a `data:` URL.
    Url(&'a str),
    /// `input_audio.data`: bare base64.
    Base64(&'a str),
}

impl<'a> MediaPart<'a> {
    /// The media of a content part; `None` for text and for parts of unknown shape.
    pub fn of(part: &'a Value) -> Option<Self> {
        let kind = part.get("type")?.as_str()?;
        let url_of = |key: &str| {
            let field = part.get(key)?;
            field
                .as_str()
                .or_else(|| field.get("url").and_then(Value::as_str))
        };
        match kind {
            "image_url" | "video_url" | "audio_url" | "input_image" => {
                url_of(kind).or_else(|| url_of("image_url")).map(Self::Url)
            }
            "input_audio" => part
                .pointer("/input_audio/data")
                .and_then(Value::as_str)
                .map(Self::Base64),
            _ => None,
        }
    }

    /// The identity of the item's bytes, when the part carries them (a base64 `data:` URL or
    /// audio data): decoded 48 KiB at a time into the hash, never whole, since an
    /// image's hundreds of kilobytes would cost an allocation and its page faults per request.
    pub fn verified_identity(self) -> Option<MediaId> {
        let payload = match self {
            Self::Url(url) => data_url_payload(url)?,
            Self::Base64(data) => data,
        };
        streamed_identity(payload.trim())
    }
}

/// [`media_token_estimate`] of a `data:` URL's bytes, decoding no more of it than needed:
/// PNG, GIF and WebP keep their size in the first 30 bytes, so only a JPEG (whose frame header
/// may follow kilobytes of metadata) or an unreadable prefix costs a whole decode.
pub fn data_url_token_estimate(url: &str) -> u32 {
    const HEAD_CHARS: usize = 64;
    // Bytes, not a `str` slice: a client's payload may hold any UTF-8 (it then fails to
    // decode), and a character boundary is not guaranteed at 64.
    let payload = data_url_payload(url).map(|payload| payload.trim_start().as_bytes());
    if let Some(payload) = payload.filter(|p| p.len() > HEAD_CHARS)
        && let Ok(head) = base64::engine::general_purpose::STANDARD.decode(&payload[..HEAD_CHARS])
    {
        if let Some(tokens) = media_token_estimate(&head) {
            return tokens;
        }
        if !head.starts_with(b"\xff\xd8") {
            return DEFAULT_MEDIA_TOKENS;
        }
    }
    data_url_bytes(url)
        .and_then(|bytes| media_token_estimate(&bytes))
        .unwrap_or(DEFAULT_MEDIA_TOKENS)
}

/// Tokens assumed for an item whose size cannot be read from its bytes (a URL, audio, an
/// image format not parsed here): a mid-sized picture's worth.
pub const DEFAULT_MEDIA_TOKENS: u32 = 256;

/// Pixels per token side: Qwen2-VL and most of its successors cut 14-pixel patches and merge
/// 2×2 of them into one token.
const PIXELS_PER_TOKEN_SIDE: u32 = 28;

/// Vision encoders resize anything larger down to about this many tokens (Qwen2-VL's
/// `max_pixels` of 12,845,056 is 16,384 tokens).
const MAX_MEDIA_TOKENS: u32 = 16_384;

/// Estimated tokens an image takes in the prompt, from the dimensions in its header (PNG,
/// JPEG, GIF, WebP); `None` when the bytes are not an image of these formats. One token per
/// 28×28 pixels, as Qwen2-VL-style processors place them; the engine's own count may differ
/// by model, so this is an estimate for scoring and for the mock engine, never a contract.
pub fn media_token_estimate(bytes: &[u8]) -> Option<u32> {
    let (width, height) = image_dimensions(bytes)?;
    let tokens = u64::from(width.div_ceil(PIXELS_PER_TOKEN_SIDE))
        * u64::from(height.div_ceil(PIXELS_PER_TOKEN_SIDE));
    Some(tokens.clamp(1, u64::from(MAX_MEDIA_TOKENS)) as u32)
}

/// Width and height from an image header.
pub fn image_dimensions(bytes: &[u8]) -> Option<(u32, u32)> {
    let be32 = |at: usize| Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
    let le16 = |at: usize| {
        Some(u32::from(u16::from_le_bytes(
            bytes.get(at..at + 2)?.try_into().ok()?,
        )))
    };
    let dims = if bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.get(12..16) == Some(b"IHDR") {
        (be32(16)?, be32(20)?)
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        (le16(6)?, le16(8)?)
    } else if bytes.starts_with(b"\xff\xd8") {
        jpeg_dimensions(bytes)?
    } else if bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WEBP") {
        webp_dimensions(bytes)?
    } else {
        return None;
    };
    (dims.0 > 0 && dims.1 > 0).then_some(dims)
}

/// Walks JPEG segments to the first start-of-frame marker, which holds the dimensions.
fn jpeg_dimensions(bytes: &[u8]) -> Option<(u32, u32)> {
    let mut at = 2;
    loop {
        while bytes.get(at)? == &0xff && bytes.get(at + 1)? == &0xff {
            at += 1; // fill bytes
        }
        if bytes.get(at)? != &0xff {
            return None;
        }
        let marker = *bytes.get(at + 1)?;
        let length = usize::from(u16::from_be_bytes([
            *bytes.get(at + 2)?,
            *bytes.get(at + 3)?,
        ]));
        let is_frame = matches!(marker, 0xc0..=0xcf) && !matches!(marker, 0xc4 | 0xc8 | 0xcc);
        if is_frame {
            let height = u16::from_be_bytes([*bytes.get(at + 5)?, *bytes.get(at + 6)?]);
            let width = u16::from_be_bytes([*bytes.get(at + 7)?, *bytes.get(at + 8)?]);
            return Some((u32::from(width), u32::from(height)));
        }
        if length < 2 {
            return None;
        }
        at += 2 + length;
    }
}

fn webp_dimensions(bytes: &[u8]) -> Option<(u32, u32)> {
    let le24 = |at: usize| {
        let b = bytes.get(at..at + 3)?;
        Some(u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16)
    };
    match bytes.get(12..16)? {
        b"VP8X" => Some((le24(24)? + 1, le24(27)? + 1)),
        b"VP8 " => {
            let w = u16::from_le_bytes([*bytes.get(26)?, *bytes.get(27)?]) & 0x3fff;
            let h = u16::from_le_bytes([*bytes.get(28)?, *bytes.get(29)?]) & 0x3fff;
            Some((u32::from(w), u32::from(h)))
        }
        b"VP8L" => {
            let b = bytes.get(21..25)?;
            let bits = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            Some(((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png_header(width: u32, height: u32) -> Vec<u8> {
        let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        bytes.extend_from_slice(&width.to_be_bytes());
        bytes.extend_from_slice(&height.to_be_bytes());
        bytes.extend_from_slice(&[8, 2, 0, 0, 0]);
        bytes
    }

    #[test]
    fn data_url_and_bare_base64_of_the_same_bytes_agree() {
        let b64 = base64::engine::general_purpose::STANDARD.encode(b"\x89PNG fake image");
        let url = format!("data:image/png;base64,{b64}");
        assert_eq!(MediaId::of_reference(&url), MediaId::of_base64(&b64));
        assert_eq!(
            MediaId::of_reference(&url),
            MediaId::of_bytes(b"\x89PNG fake image")
        );
    }

    #[test]
    fn the_streamed_identity_is_the_whole_decodes() {
        for len in [0, 1, 2, 3, 3071, 3072, 3073, 10_000] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
            let url = format!("data:image/png;base64,{b64}");
            let want = Some(MediaId::of_bytes(&bytes));
            assert_eq!(MediaPart::Url(&url).verified_identity(), want, "{len}");
            assert_eq!(MediaPart::Base64(&b64).verified_identity(), want, "{len}");
        }
        // Padding inside, a bad character, or not base64 at all: not verified.
        for bad in ["QQ==QQ==", "QUJD*", "data:image/png,plain"] {
            assert_eq!(MediaPart::Base64(bad).verified_identity(), None, "{bad}");
            assert_eq!(
                data_url_bytes(&format!("data:x;base64,{bad}")),
                None,
                "{bad}"
            );
        }
        assert_eq!(MediaPart::Url("https://a/b.png").verified_identity(), None);
    }

    #[test]
    fn plain_urls_hash_their_text() {
        assert_eq!(
            MediaId::of_reference("https://example.com/cat.png"),
            MediaId::of_bytes(b"https://example.com/cat.png")
        );
        assert_ne!(
            MediaId::of_reference("https://a/1.png"),
            MediaId::of_reference("https://a/2.png")
        );
    }

    #[test]
    fn a_uuid_round_trips_and_nothing_else_parses() {
        let id = MediaId::of_bytes(b"picture");
        let uuid = id.uuid();
        assert!(uuid.starts_with(VERIFIED_UUID_PREFIX));
        assert_eq!(MediaId::from_uuid(&uuid), Some(id));
        assert_eq!(MediaId::from_uuid(&uuid[..uuid.len() - 1]), None);
        assert_eq!(MediaId::from_uuid(&uuid.to_uppercase()), None);
        assert_eq!(MediaId::from_uuid("client-chosen"), None);
    }

    #[test]
    fn a_data_urls_estimate_from_its_head_equals_the_whole_decodes() {
        let encode = |bytes: &[u8]| {
            let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
            format!("data:image/png;base64,{b64}")
        };
        let mut png = png_header(1024, 1024);
        png.extend(std::iter::repeat_n(9u8, 500));
        let mut jpeg = vec![0xff, 0xd8, 0xff, 0xe1, 0x01, 0x02];
        jpeg.extend(std::iter::repeat_n(0u8, 0x0100));
        jpeg.extend([0xff, 0xc0, 0x00, 0x11, 8, 0x01, 0xe0, 0x02, 0x80]);
        let unknown = vec![1u8; 400];
        for bytes in [png, jpeg, unknown, png_header(56, 56)] {
            let whole = media_token_estimate(&bytes).unwrap_or(DEFAULT_MEDIA_TOKENS);
            assert_eq!(data_url_token_estimate(&encode(&bytes)), whole);
        }
        assert_eq!(
            data_url_token_estimate("https://x/a.png"),
            DEFAULT_MEDIA_TOKENS
        );
    }

    #[test]
    fn image_sizes_come_from_their_headers() {
        assert_eq!(image_dimensions(&png_header(1024, 768)), Some((1024, 768)));
        assert_eq!(media_token_estimate(&png_header(1024, 1024)), Some(37 * 37));
        assert_eq!(media_token_estimate(&png_header(28, 28)), Some(1));
        assert_eq!(
            media_token_estimate(&png_header(100_000, 100_000)),
            Some(16_384)
        );
        assert_eq!(media_token_estimate(&png_header(0, 10)), None);
        let gif = [b"GIF89a".as_slice(), &[0x40, 0x01, 0xf0, 0x00]].concat();
        assert_eq!(image_dimensions(&gif), Some((320, 240)));
        // A JPEG with an APP0 segment before its baseline frame header.
        let jpeg = [
            &[0xff, 0xd8, 0xff, 0xe0, 0x00, 0x04, 0, 0][..],
            &[0xff, 0xc0, 0x00, 0x11, 8, 0x01, 0xe0, 0x02, 0x80],
        ]
        .concat();
        assert_eq!(image_dimensions(&jpeg), Some((640, 480)));
        assert_eq!(media_token_estimate(b"RIFF....WAVEfmt "), None);
        assert_eq!(media_token_estimate(&[0xff, 0xd8, 0xff]), None, "truncated");
    }
}
