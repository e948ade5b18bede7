//! The vision workload's pictures: real PNG files made from the run seed and the image index.
//!
//! Image `i` of a run has a seeded size between [`MIN_SIDE`]² and [`MAX_WIDTH`] ×
//! [`MAX_HEIGHT`] pixels (64 to 1,036 prompt tokens at one token per 28 × 28 pixels) and is
//! 4-bit palette noise ([`super::png`]), stored uncompressed as noise would be anyway: about
//! 25 KB to 390 KB, 155 KB on average. [`Images`] makes each picture once, on first use, and
//! every request that shows it shares the same bytes.
//!
//! Its prompt tokens are the protocol's estimate from the PNG header
//! ([`media_token_estimate`]), the count a sidecar weighs the image's chain blocks by. At the
//! token level (the simulator) an image is a run of that many token ids unique to the picture
//! ([`Image::token_ids`]): vLLM fills an image's placeholder positions with one repeated token
//! and tells images apart by their identity in the blocks' extra keys, and a run of ids drawn
//! from the identity and the position shares KV blocks exactly where those keys would. The
//! vision encoder's cost is not modelled in the simulator (the mock engine models it): an
//! image costs what prefilling its tokens costs.

use std::fmt;
use std::sync::{Arc, OnceLock};

use base64::Engine as _;
use kvmesh_protocol::hashing::{DEFAULT_MEDIA_TOKENS, MediaId, media_token_estimate};
use kvmesh_protocol::mix64;

use super::key;
use super::png::{self, PALETTE_LEN};
use crate::engine::model::tokenizer::VOCAB_SIZE;
use crate::rng::SplitMix64;

/// Smallest width and height, pixels (a 224 × 224 picture is 8 × 8 = 64 tokens).
pub const MIN_SIDE: u32 = 224;
/// Largest width, pixels.
pub const MAX_WIDTH: u32 = 1024;
/// Largest height, pixels (1,024 × 768 is 37 × 28 = 1,036 tokens).
pub const MAX_HEIGHT: u32 = 768;

/// One picture: its PNG bytes and what a router and an engine make of them.
pub struct Image {
    /// Its index among the run's images.
    pub index: u32,
    pub width: u32,
    pub height: u32,
    /// The PNG file.
    pub png: Arc<[u8]>,
    /// The content identity a sidecar computes (blake3 of the bytes).
    pub id: MediaId,
    /// Prompt tokens: the protocol's estimate from the header.
    pub tokens: u32,
    data_url: OnceLock<Arc<str>>,
}

impl Image {
    /// Image `index` of a run under `seed`.
    pub fn generate(seed: u64, index: u32) -> Self {
        let mut rng = SplitMix64::new(key(seed, &[20, u64::from(index)]));
        let width = MIN_SIDE + rng.below(u64::from(MAX_WIDTH - MIN_SIDE + 1)) as u32;
        let height = MIN_SIDE + rng.below(u64::from(MAX_HEIGHT - MIN_SIDE + 1)) as u32;
        let palette: [[u8; 3]; PALETTE_LEN] = std::array::from_fn(|_| {
            let [r, g, b, ..] = rng.next_u64().to_le_bytes();
            [r, g, b]
        });
        let png: Arc<[u8]> = png::encode(width, height, &palette, |_, row| {
            for chunk in row.chunks_mut(8) {
                let bits = rng.next_u64().to_le_bytes();
                chunk.copy_from_slice(&bits[..chunk.len()]);
            }
            if width % 2 == 1 {
                // The unused low nibble of an odd row's last byte.
                *row.last_mut().expect("a row has a byte") &= 0xf0;
            }
        })
        .into();
        Self {
            index,
            width,
            height,
            id: MediaId::of_bytes(&png),
            tokens: media_token_estimate(&png).unwrap_or(DEFAULT_MEDIA_TOKENS),
            png,
            data_url: OnceLock::new(),
        }
    }

    /// The picture as a `data:image/png;base64,…` URL (encoded once).
    pub fn data_url(&self) -> Arc<str> {
        self.data_url
            .get_or_init(|| {
                let b64 = base64::engine::general_purpose::STANDARD.encode(&self.png);
                format!("data:image/png;base64,{b64}").into()
            })
            .clone()
    }

    /// The token ids the simulated engine sees in the image's place: [`Self::tokens`] ids drawn
    /// from its identity and their position, all outside the text vocabulary.
    pub fn token_ids(&self) -> impl Iterator<Item = u32> + '_ {
        let identity = u64::from_le_bytes(self.id.0[..8].try_into().expect("8 bytes"));
        (0..u64::from(self.tokens)).map(move |position| {
            let h = mix64(identity ^ mix64(position ^ 0x696d_6167_6500));
            VOCAB_SIZE + (h % u64::from(u32::MAX - VOCAB_SIZE)) as u32
        })
    }
}

impl fmt::Debug for Image {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Image")
            .field("index", &self.index)
            .field("width", &self.width)
            .field("height", &self.height)
            .field("bytes", &self.png.len())
            .field("tokens", &self.tokens)
            .finish_non_exhaustive()
    }
}

/// Pictures are equal when their bytes are (their identities are).
impl PartialEq for Image {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Image {}

/// A run's pictures, each made on first use and kept.
pub struct Images {
    seed: u64,
    images: Vec<OnceLock<Arc<Image>>>,
}

impl Images {
    /// `count` pictures under `seed` (none made yet).
    pub fn new(seed: u64, count: u32) -> Self {
        Self {
            seed,
            images: (0..count).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Picture `index` (made now if it is its first use). `index` must be below the count.
    pub fn get(&self, index: u32) -> Arc<Image> {
        self.images[index as usize]
            .get_or_init(|| Arc::new(Image::generate(self.seed, index)))
            .clone()
    }

    pub fn len(&self) -> usize {
        self.images.len()
    }

    pub fn is_empty(&self) -> bool {
        self.images.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvmesh_protocol::hashing::{data_url_bytes, image_dimensions};

    #[test]
    fn pictures_decode_to_the_size_they_were_made_at() {
        let images = Images::new(3, 24);
        let mut total_bytes = 0;
        let mut tokens = Vec::new();
        for i in 0..24 {
            let image = images.get(i);
            assert!(Arc::ptr_eq(&image, &images.get(i)), "made once");
            assert!((MIN_SIDE..=MAX_WIDTH).contains(&image.width));
            assert!((MIN_SIDE..=MAX_HEIGHT).contains(&image.height));
            assert_eq!(
                image_dimensions(&image.png),
                Some((image.width, image.height)),
                "the header a sidecar reads"
            );
            assert_eq!(
                image.tokens,
                image.width.div_ceil(28) * image.height.div_ceil(28)
            );
            let mut decoder = ::png::Decoder::new(std::io::Cursor::new(&image.png[..]));
            decoder.set_transformations(::png::Transformations::EXPAND);
            let mut reader = decoder.read_info().expect("a valid header");
            let mut rgb = vec![0; reader.output_buffer_size().expect("a sane size")];
            let frame = reader.next_frame(&mut rgb).expect("valid image data");
            assert_eq!((frame.width, frame.height), (image.width, image.height));
            assert_eq!(frame.color_type, ::png::ColorType::Rgb);
            assert_eq!(
                data_url_bytes(&image.data_url()).as_deref(),
                Some(&image.png[..])
            );
            total_bytes += image.png.len();
            tokens.push(image.tokens);
        }
        let mean_kb = total_bytes / 24 / 1000;
        assert!((50..=300).contains(&mean_kb), "{mean_kb} KB a picture");
        assert!(tokens.iter().any(|&t| t < 300) && tokens.iter().any(|&t| t > 600));
        assert_eq!(Image::generate(3, 5), *images.get(5), "deterministic");
        assert_ne!(Image::generate(4, 5), *images.get(5), "the seed matters");
    }

    #[test]
    fn token_runs_are_unique_to_their_picture() {
        let images = Images::new(1, 2);
        let (a, b) = (images.get(0), images.get(1));
        let ids: Vec<u32> = a.token_ids().collect();
        assert_eq!(ids.len() as u32, a.tokens);
        assert_eq!(ids, a.token_ids().collect::<Vec<_>>());
        assert!(
            ids.iter().all(|&t| t >= VOCAB_SIZE),
            "outside the text vocabulary"
        );
        let other: std::collections::HashSet<u32> = b.token_ids().collect();
        assert!(ids.iter().filter(|t| other.contains(t)).count() <= 1);
    }
}
