//! Token ids of a completions prompt from the model's own `tokenizer.json`, read in this
//! process, so exact mode can skip the round trip to the engine's `/tokenize`.
//!
//! Only the `tokenizer` cargo feature brings the `tokenizers` crate in. [`LocalTokenizer`]
//! exists in every build, so the request path has no `#[cfg]`: without the feature it simply
//! cannot be loaded, and `--tokenizer` is a startup error.
//!
//! A `tokenizer.json` carries no chat template: chat requests keep asking the engine.

use std::fmt;
use std::path::{Path, PathBuf};

/// Why a `tokenizer.json` could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "this kvmesh was built without the `tokenizer` feature; rebuild with `--features tokenizer` or drop --tokenizer"
    )]
    NotBuilt,
    #[error("loading the tokenizer {}: {why}", path.display())]
    Invalid { path: PathBuf, why: String },
}

/// A model's tokenizer, loaded from its `tokenizer.json`.
pub struct LocalTokenizer {
    path: PathBuf,
    #[cfg(feature = "tokenizer")]
    inner: tokenizers::Tokenizer,
    /// Without the feature there is no value of this type.
    #[cfg(not(feature = "tokenizer"))]
    never: std::convert::Infallible,
}

impl LocalTokenizer {
    /// The file this tokenizer was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(feature = "tokenizer")]
impl LocalTokenizer {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        let invalid = |why: String| LoadError::Invalid {
            path: path.to_owned(),
            why,
        };
        let mut inner =
            tokenizers::Tokenizer::from_file(path).map_err(|e| invalid(e.to_string()))?;
        // The engine's tokenizer neither truncates nor pads a prompt unless the request asks
        // (transformers resets both on every call), whatever the file says.
        inner
            .with_truncation(None)
            .map_err(|e| invalid(e.to_string()))?;
        inner.with_padding(None);
        Ok(Self {
            path: path.to_owned(),
            inner,
        })
    }

    /// The token ids of `text`, with the special tokens the file's post-processor adds (a BOS
    /// token, typically) when `add_special_tokens` is set, as vLLM's `/tokenize` does.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        self.inner
            .encode_fast(text, add_special_tokens)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }
}

#[cfg(not(feature = "tokenizer"))]
impl LocalTokenizer {
    /// Always fails: this build has no tokenizer.
    pub fn load(_path: &Path) -> Result<Self, LoadError> {
        Err(LoadError::NotBuilt)
    }

    pub fn encode(&self, _text: &str, _add_special_tokens: bool) -> Result<Vec<u32>, String> {
        match self.never {}
    }
}

/// The checked-in test tokenizer: a word-level vocabulary (`[UNK]` 0, `<s>` 1, `.` 2, then
/// "the quick brown fox jumps over the lazy dog" from 3), a whitespace pre-tokenizer and a
/// post-processor that prepends `<s>`.
#[cfg(test)]
pub(crate) const TEST_FIXTURE: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tokenizer.json");

impl fmt::Debug for LocalTokenizer {
    // The vocabulary is far too long to print.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalTokenizer")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(not(feature = "tokenizer"))]
    #[test]
    fn without_the_feature_nothing_loads() {
        let error = LocalTokenizer::load(Path::new("tokenizer.json")).unwrap_err();
        assert!(matches!(error, LoadError::NotBuilt));
        assert!(error.to_string().contains("--features tokenizer"));
    }

    #[cfg(feature = "tokenizer")]
    mod with_the_feature {
        use super::*;

        #[test]
        fn the_fixture_encodes_words_and_prepends_bos() {
            let tokenizer = LocalTokenizer::load(Path::new(TEST_FIXTURE)).unwrap();
            assert_eq!(
                tokenizer.encode("the quick brown fox", true).unwrap(),
                vec![1, 3, 4, 5, 6]
            );
            assert_eq!(tokenizer.path(), Path::new(TEST_FIXTURE));
            assert_eq!(
                tokenizer.encode("the quick purple fox", false).unwrap(),
                vec![3, 4, 0, 6]
            );
        }

        #[test]
        fn unreadable_or_invalid_files_name_their_path() {
            let dir = tempfile::tempdir().unwrap();
            let missing = dir.path().join("missing.json");
            let error = LocalTokenizer::load(&missing).unwrap_err().to_string();
            assert!(error.contains("missing.json"), "{error}");
            let invalid = dir.path().join("invalid.json");
            std::fs::write(&invalid, r#"{"model": "not a model"}"#).unwrap();
            let error = LocalTokenizer::load(&invalid).unwrap_err().to_string();
            assert!(error.contains("invalid.json"), "{error}");
        }
    }
}
