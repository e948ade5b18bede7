//! The mock's "model" for pooling: deterministic embeddings, class probabilities and
//! relevance scores, functions of the token ids alone.
//!
//! The mock has no weights: an embedding is the feature-hashed bag of the input's tokens,
//! normalised, so texts that share tokens point the same way and the same text always gives
//! the same vector.

use kvmesh_protocol::mix64;

/// Length of the mock's embeddings (its "hidden size"); `dimensions` may shorten them.
pub const EMBEDDING_DIM: usize = 256;

/// Positions of the embedding each token adds to (feature hashing): enough that a short
/// text's vector is not mostly zeros, few enough that pooling is cheap on the engine's thread.
const TOUCHES_PER_TOKEN: u64 = 8;

/// The classifier's labels (a Hugging Face config's default `id2label` for two classes).
pub const LABELS: [&str; 2] = ["LABEL_0", "LABEL_1"];

/// The full-length, unit-norm embedding of `tokens`: each token adds ±1 at
/// `TOUCHES_PER_TOKEN` positions chosen by its id, and the sum is normalised.
pub fn embedding(tokens: &[u32]) -> Vec<f32> {
    let mut acc = vec![0f32; EMBEDDING_DIM];
    for &t in tokens {
        let h = mix64(u64::from(t) ^ 0x656d_6265_6464_696e);
        for k in 0..TOUCHES_PER_TOKEN {
            let bits = mix64(h.wrapping_add(k));
            let sign = if bits >> 63 == 1 { 1.0 } else { -1.0 };
            acc[(bits % EMBEDDING_DIM as u64) as usize] += sign;
        }
    }
    normalise(acc)
}

/// `v` scaled to unit length; a zero vector (tokens that cancelled out) becomes the first
/// basis vector, so every answer is a valid unit embedding.
fn normalise(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm == 0.0 {
        v.iter_mut().for_each(|x| *x = 0.0);
        if let Some(first) = v.first_mut() {
            *first = 1.0;
        }
        return v;
    }
    v.iter_mut().for_each(|x| *x /= norm);
    v
}

/// The embedding cut to `dimensions` and renormalised (matryoshka-style).
pub fn embedding_with(tokens: &[u32], dimensions: Option<usize>) -> Vec<f32> {
    let full = embedding(tokens);
    match dimensions {
        Some(d) if d < full.len() => normalise(full[..d].to_vec()),
        _ => full,
    }
}

/// Class probabilities of `tokens`: a softmax over the embedding's projections on one fixed
/// ±1 direction per label, so similar texts get similar labels.
pub fn class_probs(tokens: &[u32]) -> Vec<f32> {
    let e = embedding(tokens);
    let logits: Vec<f32> = (0..LABELS.len() as u64)
        .map(|c| {
            let dot: f32 = e
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    let w = if mix64((c << 32) | i as u64) >> 63 == 1 {
                        1.0
                    } else {
                        -1.0
                    };
                    x * w
                })
                .sum();
            // A unit vector's projection on a ±1 direction has spread ~1: scale it so that
            // labels are decided rather than all near 0.5.
            dot * 4.0
        })
        .collect();
    let max = logits.iter().cloned().fold(f32::MIN, f32::max);
    let exps: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

/// The relevance of `doc` to `query` in `[0, 1]`: their embeddings' cosine mapped linearly,
/// so a document equal to the query scores 1.
pub fn relevance(query: &[u32], doc: &[u32]) -> f32 {
    let (q, d) = (embedding(query), embedding(doc));
    let cos: f32 = q.iter().zip(&d).map(|(a, b)| a * b).sum();
    ((cos + 1.0) / 2.0).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::tokenizer::tokenize;

    #[test]
    fn embeddings_are_unit_deterministic_and_similar_for_similar_texts() {
        let a = embedding(&tokenize("the quick brown fox jumps over the lazy dog"));
        let norm: f32 = a.iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() < 1e-5);
        assert_eq!(
            a,
            embedding(&tokenize("the quick brown fox jumps over the lazy dog"))
        );
        let q = tokenize("the quick brown fox jumps over the lazy dog");
        let near = tokenize("the quick brown fox jumps over the lazy cat");
        let far = tokenize("completely unrelated words about tax law and accounting");
        assert!(relevance(&q, &near) > relevance(&q, &far));
        assert!((relevance(&q, &q) - 1.0).abs() < 1e-5);
        let short = embedding_with(&q, Some(8));
        assert_eq!(short.len(), 8);
        assert!((short.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-5);
        let p = class_probs(&q);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-5);
    }
}
