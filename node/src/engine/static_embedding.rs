//! Loading a static embedding model for intent routing (`--embedding-model DIR`): the
//! model2vec layout, a `tokenizer.json` and a `model.safetensors` whose one matrix has a row
//! per token (WordLlama's weights, renamed, load too: `scripts/fetch-static-embedding.sh`).
//!
//! Reading the files and tokenizing is here; the pooling arithmetic is the protocol's
//! [`StaticEmbedding`]. Like `--tokenizer`, this needs the `tokenizer` cargo feature (the
//! `tokenizers` crate); without it, `--embedding-model` is a startup error.

use kvmesh_protocol::intent::StaticEmbedding;
use std::path::Path;

/// The tensor names the known formats store their matrix under (model2vec, WordLlama); a
/// file with any other single tensor loads too.
#[cfg_attr(not(feature = "tokenizer"), allow(dead_code))]
const MATRIX_NAMES: [&str; 2] = ["embeddings", "embedding.weight"];

/// Why a static embedding model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "this kvmesh was built without the `tokenizer` feature; rebuild with `--features tokenizer` or drop --embedding-model"
    )]
    NotBuilt,
    #[error("loading the embedding model in {dir}: {why}")]
    Invalid { dir: String, why: String },
}

#[cfg(not(feature = "tokenizer"))]
pub fn load(_dir: &Path) -> Result<StaticEmbedding, LoadError> {
    Err(LoadError::NotBuilt)
}

#[cfg(feature = "tokenizer")]
pub fn load(dir: &Path) -> Result<StaticEmbedding, LoadError> {
    use kvmesh_protocol::intent::embed::Dtype;
    let invalid = |why: String| LoadError::Invalid {
        dir: dir.display().to_string(),
        why,
    };
    let tokenizer_path = dir.join("tokenizer.json");
    let model_path = dir.join("model.safetensors");
    let tokenizer_bytes = std::fs::read(&tokenizer_path)
        .map_err(|e| invalid(format!("{}: {e}", tokenizer_path.display())))?;
    let model_bytes = std::fs::read(&model_path)
        .map_err(|e| invalid(format!("{}: {e}", model_path.display())))?;
    let mut tokenizer = tokenizers::Tokenizer::from_bytes(&tokenizer_bytes)
        .map_err(|e| invalid(format!("tokenizer.json: {e}")))?;
    // Static models pool every token of the text: no truncation, no padding.
    tokenizer
        .with_truncation(None)
        .map_err(|e| invalid(e.to_string()))?;
    tokenizer.with_padding(None);
    let tensors = safetensors::SafeTensors::deserialize(&model_bytes)
        .map_err(|e| invalid(format!("model.safetensors: {e}")))?;
    let names = tensors.names();
    let name = MATRIX_NAMES
        .iter()
        .find(|n| names.iter().any(|m| m == *n))
        .map(|n| n.to_string())
        .or_else(|| match names.as_slice() {
            [only] => Some(only.to_string()),
            _ => None,
        })
        .ok_or_else(|| {
            invalid(format!(
                "model.safetensors: no tensor named {} among {names:?}",
                MATRIX_NAMES.join(" or ")
            ))
        })?;
    let view = tensors
        .tensor(&name)
        .map_err(|e| invalid(format!("tensor `{name}`: {e}")))?;
    let dtype = Dtype::from_name(&format!("{:?}", view.dtype()))
        .map_err(|e| invalid(format!("tensor `{name}`: {e}")))?;
    // The model's identity, for the configuration hash nodes compare: its bytes, not its path.
    let mut hasher = blake3::Hasher::new();
    hasher.update(&tokenizer_bytes);
    hasher.update(&model_bytes);
    let identity = format!("static-{}", &hasher.finalize().to_hex()[..16]);
    StaticEmbedding::from_le_bytes(
        view.shape(),
        dtype,
        view.data(),
        Box::new(Tokenizer(tokenizer)),
        identity,
    )
    .map_err(|e| invalid(format!("tensor `{name}`: {e}")))
}

#[cfg(feature = "tokenizer")]
struct Tokenizer(tokenizers::Tokenizer);

#[cfg(feature = "tokenizer")]
impl kvmesh_protocol::intent::TokenIds for Tokenizer {
    fn token_ids(&self, text: &str) -> Vec<u32> {
        // A text the tokenizer cannot encode is no text: the request goes to the default model
        // rather than failing.
        self.0
            .encode_fast(text, false)
            .map(|encoding| encoding.get_ids().to_vec())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(not(feature = "tokenizer"))]
    #[test]
    fn without_the_feature_nothing_loads() {
        let error = load(Path::new("/nowhere")).unwrap_err().to_string();
        assert!(error.contains("--features tokenizer"), "{error}");
    }

    #[cfg(feature = "tokenizer")]
    mod with_the_feature {
        use super::*;
        use kvmesh_protocol::intent::Embedder;
        use std::collections::HashMap;

        /// A model directory with the checked-in word-level tokenizer (ids 0..=11) and a
        /// matrix of `rows` rows of dimension 2 (row i = (i, 1)), stored as `dtype`.
        fn model_dir(rows: usize, tensor: &str) -> tempfile::TempDir {
            let dir = tempfile::tempdir().unwrap();
            std::fs::copy(
                crate::engine::local_tokenizer::TEST_FIXTURE,
                dir.path().join("tokenizer.json"),
            )
            .unwrap();
            let data: Vec<u8> = (0..rows)
                .flat_map(|i| [i as f32, 1.0])
                .flat_map(f32::to_le_bytes)
                .collect();
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![rows, 2], &data)
                    .unwrap();
            let bytes =
                safetensors::serialize(HashMap::from([(tensor.to_string(), view)]), None).unwrap();
            std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
            dir
        }

        #[test]
        fn a_model_dir_loads_and_mean_pools_its_tokens() {
            let dir = model_dir(12, "embeddings");
            let model = load(dir.path()).unwrap();
            assert_eq!(model.rows(), 12);
            // "quick" is id 4, "brown" id 5: mean (4.5, 1), normalized.
            let v = model.embed("quick brown");
            let norm = (4.5f32 * 4.5 + 1.0).sqrt();
            assert!((v[0] - 4.5 / norm).abs() < 1e-6, "{v:?}");
            assert!(model.identity().starts_with("static-"));
            // Any single tensor loads, whatever its name.
            assert!(load(model_dir(12, "emb").path()).is_ok());
        }

        #[test]
        fn broken_dirs_say_what_is_wrong() {
            let dir = model_dir(12, "embeddings");
            std::fs::write(dir.path().join("model.safetensors"), b"garbage").unwrap();
            let error = load(dir.path()).unwrap_err().to_string();
            assert!(error.contains("model.safetensors"), "{error}");
            let dir = tempfile::tempdir().unwrap();
            let error = load(dir.path()).unwrap_err().to_string();
            assert!(error.contains("tokenizer.json"), "{error}");
        }
    }
}
