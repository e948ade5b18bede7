//! Text into unit vectors, in microseconds and in pure Rust.
//!
//! - [`NgramEmbedder`]: hashed character n-grams and words, with no model file at all.
//! - [`StaticEmbedding`]: a static embedding model (model2vec, WordLlama): a matrix with one
//!   row per token, mean-pooled over a text's tokens. Tokenizing needs the model's tokenizer,
//!   which the node loads (IO, and a heavy crate); it reaches this module through
//!   [`TokenIds`], so the arithmetic stays here.

/// Longest text embedded, in bytes (cut at a character boundary). An intent shows in how a
/// prompt starts; embedding a 100 kB turn in full would only make the request path slower.
pub const MAX_EMBED_BYTES: usize = 4096;

/// Something that turns text into a vector of a fixed dimension.
pub trait Embedder: Send + Sync {
    /// The vector's dimension.
    fn dim(&self) -> usize;
    /// The text's embedding, L2-normalized (all zeros when the text has no features).
    fn embed(&self, text: &str) -> Vec<f32>;
    /// A short, stable name of the embedding, for operators and for the configuration hash
    /// nodes compare (two nodes that embed differently decide differently).
    fn identity(&self) -> String;
}

/// The first [`MAX_EMBED_BYTES`] of `text`, cut at a character boundary.
pub fn head(text: &str) -> &str {
    if text.len() <= MAX_EMBED_BYTES {
        return text;
    }
    let mut end = MAX_EMBED_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Scales `v` to unit length; a zero vector stays zero.
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 && norm.is_finite() {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

/// Dot product (the cosine similarity of unit vectors).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Hashed character n-grams (2 to 5 characters, with word boundaries marked) and whole words,
/// each feature hashed to a signed coordinate of a fixed-size vector (the hashing trick).
///
/// Character n-grams survive misspellings and inflections ("integrate", "integral",
/// "intgral" share most of theirs), and punctuation-heavy text (code, formulas) keeps its
/// symbols as features. The hash is FNV-1a, written out here, so that every node and every
/// version embeds alike (a library's hasher may change between releases).
#[derive(Clone, Debug)]
pub struct NgramEmbedder {
    dim: usize,
}

impl Default for NgramEmbedder {
    fn default() -> Self {
        Self { dim: 1024 }
    }
}

/// Features of one word are weighted by kind: whole words carry more meaning than any one of
/// their n-grams.
const WORD_WEIGHT: f32 = 2.0;

impl NgramEmbedder {
    /// `dim` buckets (at least 16).
    pub fn new(dim: usize) -> Self {
        Self { dim: dim.max(16) }
    }

    fn add(&self, v: &mut [f32], feature: &[u8], weight: f32) {
        let hash = fnv1a(feature);
        // The top bit chooses the sign: collisions then cancel on average instead of
        // piling up, which keeps unrelated texts near zero similarity.
        let sign = if hash >> 63 == 0 { 1.0 } else { -1.0 };
        let bucket = (hash % self.dim as u64) as usize;
        v[bucket] += sign * weight;
    }
}

impl Embedder for NgramEmbedder {
    fn dim(&self) -> usize {
        self.dim
    }

    fn embed(&self, text: &str) -> Vec<f32> {
        let mut v = vec![0.0; self.dim];
        let lower = head(text).to_lowercase();
        let mut word = Vec::with_capacity(64);
        for token in tokens(&lower) {
            self.add(&mut v, token.as_bytes(), WORD_WEIGHT);
            // `<word>`: boundaries make a prefix or a suffix its own feature.
            word.clear();
            word.push('<');
            word.extend(token.chars());
            word.push('>');
            for n in 2..=5 {
                if word.len() < n {
                    break;
                }
                for gram in word.windows(n) {
                    let mut bytes = [0u8; 5 * 4];
                    let mut len = 0;
                    for c in gram {
                        len += c.encode_utf8(&mut bytes[len..]).len();
                    }
                    self.add(&mut v, &bytes[..len], 1.0);
                }
            }
        }
        normalize(&mut v);
        v
    }

    fn identity(&self) -> String {
        format!("ngram-fnv1a-2to5-{}", self.dim)
    }
}

/// Words (runs of letters, digits and `_`) and single symbols (`{`, `=`, `^`, ...):
/// whitespace separates, but is not a feature.
fn tokens(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        rest = rest.trim_start();
        let first = rest.chars().next()?;
        let end = if first.is_alphanumeric() || first == '_' {
            rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len())
        } else {
            first.len_utf8()
        };
        let (token, tail) = rest.split_at(end);
        rest = tail;
        Some(token)
    })
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// A text's token ids, as the static model's own tokenizer gives them (without special
/// tokens: the models are trained on plain token rows).
pub trait TokenIds: Send + Sync {
    fn token_ids(&self, text: &str) -> Vec<u32>;
}

/// Why a static embedding matrix was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MatrixError {
    #[error("the embedding matrix must have two dimensions, not {0}")]
    NotAMatrix(usize),
    #[error("the embedding matrix is empty")]
    Empty,
    #[error("the embedding matrix has dtype {0}; F32, F16 and BF16 are supported")]
    Dtype(String),
    #[error("the embedding matrix holds {got} bytes, but its shape needs {expected}")]
    Length { expected: usize, got: usize },
    #[error("the embedding matrix holds a value that is not finite")]
    NotFinite,
}

/// The element types static models are stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    Bf16,
}

impl Dtype {
    /// Safetensors' name of a dtype, or the reason it cannot be read.
    pub fn from_name(name: &str) -> Result<Self, MatrixError> {
        match name {
            "F32" => Ok(Self::F32),
            "F16" => Ok(Self::F16),
            "BF16" => Ok(Self::Bf16),
            other => Err(MatrixError::Dtype(other.into())),
        }
    }

    fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
        }
    }
}

/// A static embedding model: one row per token id, mean-pooled over a text's tokens.
pub struct StaticEmbedding {
    rows: usize,
    dim: usize,
    /// Row-major, `rows × dim`, widened to f32 once at load.
    matrix: Vec<f32>,
    tokenizer: Box<dyn TokenIds>,
    identity: String,
}

impl StaticEmbedding {
    /// A model from its matrix, as stored (`shape`, little-endian `bytes` of `dtype`), and its
    /// tokenizer. `identity` names the model for the configuration hash (e.g. a digest of its
    /// files).
    pub fn from_le_bytes(
        shape: &[usize],
        dtype: Dtype,
        bytes: &[u8],
        tokenizer: Box<dyn TokenIds>,
        identity: String,
    ) -> Result<Self, MatrixError> {
        let &[rows, dim] = shape else {
            return Err(MatrixError::NotAMatrix(shape.len()));
        };
        if rows == 0 || dim == 0 {
            return Err(MatrixError::Empty);
        }
        let expected = rows
            .checked_mul(dim)
            .and_then(|n| n.checked_mul(dtype.size()))
            .unwrap_or(usize::MAX);
        if bytes.len() != expected {
            return Err(MatrixError::Length {
                expected,
                got: bytes.len(),
            });
        }
        let matrix: Vec<f32> = match dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
            // bf16 is the top half of an f32.
            Dtype::Bf16 => bytes
                .chunks_exact(2)
                .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
                .collect(),
        };
        if matrix.iter().any(|x| !x.is_finite()) {
            return Err(MatrixError::NotFinite);
        }
        Ok(Self {
            rows,
            dim,
            matrix,
            tokenizer,
            identity,
        })
    }

    /// The mean of the rows of `ids`, normalized; ids past the matrix are skipped (a
    /// tokenizer with added tokens the matrix has no row for).
    pub fn pool(&self, ids: &[u32]) -> Vec<f32> {
        let mut v = vec![0.0; self.dim];
        let mut n = 0usize;
        for &id in ids {
            let id = id as usize;
            if id >= self.rows {
                continue;
            }
            let row = &self.matrix[id * self.dim..(id + 1) * self.dim];
            v.iter_mut().zip(row).for_each(|(acc, x)| *acc += x);
            n += 1;
        }
        if n > 0 {
            v.iter_mut().for_each(|x| *x /= n as f32);
        }
        normalize(&mut v);
        v
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
}

impl std::fmt::Debug for StaticEmbedding {
    // The matrix is millions of numbers.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticEmbedding")
            .field("rows", &self.rows)
            .field("dim", &self.dim)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl Embedder for StaticEmbedding {
    fn dim(&self) -> usize {
        self.dim
    }

    fn embed(&self, text: &str) -> Vec<f32> {
        self.pool(&self.tokenizer.token_ids(head(text)))
    }

    fn identity(&self) -> String {
        self.identity.clone()
    }
}

/// IEEE 754 half to single precision, exactly (every half is representable as an f32).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exponent = u32::from((h >> 10) & 0x1f);
    let mantissa = u32::from(h & 0x3ff);
    let bits = match (exponent, mantissa) {
        (0, 0) => sign,
        // Subnormal: normalize the mantissa into an f32 exponent.
        (0, m) => {
            let shift = m.leading_zeros() - 21;
            let m = (m << shift) & 0x3ff;
            sign | ((127 - 15 + 1 - shift) << 23) | (m << 13)
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cosine(e: &dyn Embedder, a: &str, b: &str) -> f32 {
        dot(&e.embed(a), &e.embed(b))
    }

    #[test]
    fn related_texts_are_closer_than_unrelated_ones() {
        let e = NgramEmbedder::default();
        let near = cosine(
            &e,
            "write a python function that sorts a list",
            "a python function to sort this list",
        );
        let far = cosine(
            &e,
            "write a python function that sorts a list",
            "compose a haiku about autumn leaves",
        );
        assert!(near > far + 0.2, "near {near}, far {far}");
    }

    #[test]
    fn misspellings_stay_close() {
        let e = NgramEmbedder::default();
        let s = cosine(&e, "integrate this polynomial", "intgrate this polynomail");
        assert!(s > 0.5, "{s}");
    }

    #[test]
    fn tokens_split_words_and_symbols() {
        let got: Vec<&str> = tokens("fn main() { x^2 }  héllo_1").collect();
        assert_eq!(
            got,
            ["fn", "main", "(", ")", "{", "x", "^", "2", "}", "héllo_1"]
        );
    }

    #[test]
    fn fnv1a_is_the_published_function() {
        // Test vectors of the FNV reference implementation.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn f16_conversion_matches_known_values() {
        for (bits, value) in [
            (0x0000u16, 0.0f32),
            (0x3c00, 1.0),
            (0xc000, -2.0),
            (0x3555, 0.333_251_95),
            (0x7bff, 65504.0),
            (0x0001, 5.960_464_5e-8),
            (0x0200, 3.051_757_8e-5),
        ] {
            assert_eq!(f16_to_f32(bits), value, "{bits:#06x}");
        }
        assert!(f16_to_f32(0x7c00).is_infinite());
        assert!(f16_to_f32(0x7e00).is_nan());
    }

    struct Words;
    impl TokenIds for Words {
        fn token_ids(&self, text: &str) -> Vec<u32> {
            text.split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect()
        }
    }

    fn matrix_3x2() -> StaticEmbedding {
        let values = [1.0f32, 0.0, 0.0, 1.0, 3.0, 4.0];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        StaticEmbedding::from_le_bytes(&[3, 2], Dtype::F32, &bytes, Box::new(Words), "t".into())
            .unwrap()
    }

    #[test]
    fn static_embedding_mean_pools_the_rows_of_the_tokens() {
        let model = matrix_3x2();
        let v = model.embed("0 1");
        let half = std::f32::consts::FRAC_1_SQRT_2;
        assert!(
            (v[0] - half).abs() < 1e-6 && (v[1] - half).abs() < 1e-6,
            "{v:?}"
        );
        assert_eq!(model.embed("2"), vec![0.6, 0.8]);
        // Unknown ids are skipped; no id at all is the zero vector.
        assert_eq!(model.embed("2 99"), vec![0.6, 0.8]);
        assert_eq!(model.embed("99"), vec![0.0, 0.0]);
    }

    #[test]
    fn bad_matrices_are_refused() {
        let tok = || Box::new(Words) as Box<dyn TokenIds>;
        let err = |shape: &[usize], dtype, bytes: &[u8]| {
            StaticEmbedding::from_le_bytes(shape, dtype, bytes, tok(), String::new())
                .err()
                .unwrap()
        };
        assert_eq!(err(&[4], Dtype::F32, &[0; 16]), MatrixError::NotAMatrix(1));
        assert_eq!(err(&[0, 4], Dtype::F32, &[]), MatrixError::Empty);
        assert_eq!(
            err(&[2, 2], Dtype::F16, &[0; 6]),
            MatrixError::Length {
                expected: 8,
                got: 6
            }
        );
        assert_eq!(
            err(&[usize::MAX, 2], Dtype::F32, &[0; 6]),
            MatrixError::Length {
                expected: usize::MAX,
                got: 6
            }
        );
        assert_eq!(
            err(&[1, 2], Dtype::F16, &[0, 0, 0, 0x7c]),
            MatrixError::NotFinite
        );
        assert_eq!(Dtype::from_name("I8"), Err(MatrixError::Dtype("I8".into())));
        let bf16 = StaticEmbedding::from_le_bytes(
            &[1, 2],
            Dtype::Bf16,
            &[0x80, 0x3f, 0x00, 0x40],
            tok(),
            String::new(),
        )
        .unwrap();
        assert_eq!(bf16.pool(&[0]), {
            let mut v = vec![1.0, 2.0];
            normalize(&mut v);
            v
        });
    }

    proptest! {
        #[test]
        fn ngram_embeddings_are_unit_or_zero_and_deterministic(text in "\\PC{0,300}") {
            let e = NgramEmbedder::new(256);
            let v = e.embed(&text);
            prop_assert_eq!(v.len(), 256);
            let norm = dot(&v, &v);
            prop_assert!(norm == 0.0 || (norm - 1.0).abs() < 1e-4, "{}", norm);
            prop_assert_eq!(v, e.embed(&text));
        }

        #[test]
        fn case_does_not_change_an_ngram_embedding(text in "[a-zA-Z ]{0,80}") {
            let e = NgramEmbedder::default();
            prop_assert_eq!(e.embed(&text), e.embed(&text.to_uppercase()));
        }

        #[test]
        fn head_cuts_at_a_char_boundary_within_the_limit(text in "\\PC{0,3000}") {
            let cut = head(&text);
            prop_assert!(cut.len() <= MAX_EMBED_BYTES);
            prop_assert!(text.starts_with(cut));
            prop_assert!(cut.len() == text.len() || text.len() > MAX_EMBED_BYTES);
        }

        #[test]
        fn every_half_widens_exactly(bits in any::<u16>()) {
            let value = f16_to_f32(bits);
            // Exactness: narrowing back by hand (round trip through the bit layout) gives
            // the same bits for every finite half.
            if value.is_finite() {
                let back = f32_to_f16_exact(value);
                prop_assert_eq!(back, bits);
            }
        }
    }

    /// The inverse of [`f16_to_f32`] for values that are exactly halves (test only).
    fn f32_to_f16_exact(value: f32) -> u16 {
        let bits = value.to_bits();
        let sign = ((bits >> 16) & 0x8000) as u16;
        let exponent = ((bits >> 23) & 0xff) as i32;
        let mantissa = bits & 0x7f_ffff;
        if exponent == 0 && mantissa == 0 {
            return sign;
        }
        let e = exponent - 127 + 15;
        if e >= 1 {
            sign | ((e as u16) << 10) | ((mantissa >> 13) as u16)
        } else {
            // Subnormal half: the implicit bit shifts into the mantissa.
            let m = (mantissa | 0x80_0000) >> (14 - e);
            sign | m as u16
        }
    }
}
