//! The pooling endpoints: `/v1/embeddings`, `/pooling`, `/classify`, `/score` and
//! `/rerank`, parsed into the prompts the engine runs, with deterministic answers.
//!
//! Shapes follow vLLM's pooling entrypoints: requests and responses as in
//! `vllm/entrypoints/pooling/{embed,pooling,classify,scoring}/protocol.py` (moved to
//! `vllm/frontend/entrypoints/pooling/` upstream), ids and result ordering as in
//! `vllm/entrypoints/pooling/scoring/serving.py`. Unknown fields are accepted, as vLLM's
//! models accept them (so Cohere's `return_documents` is ignored: vLLM always returns the
//! documents).
//! The vectors and scores themselves come from [`super::vectors`].

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};

use super::errors::ApiError;
use super::openai::{self, MessageBody, Models, PromptInput, ResolvedModel};
use super::responses::Usage;
use super::vectors::{EMBEDDING_DIM, LABELS, class_probs, embedding_with, relevance};
use crate::engine::model::media::{MediaConfig, MediaItem};
use crate::engine::model::tokenizer::tokenize;

/// What a pooling request asks the engine to compute for each prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// An embedding (`/v1/embeddings`, or `/pooling` with `task: "embed"` or none).
    Embed,
    /// Class probabilities (`/classify`, or `/pooling` with `task: "classify"`).
    Classify,
}

/// How vectors are written: a JSON list, or base64 of little-endian `float32`s (vLLM's
/// `encoding_format: "base64"` with its defaults `embed_dtype: float32`, `endianness: native`
/// on a little-endian host).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// `"float"` (the default).
    Float,
    /// `"base64"`.
    Base64,
}

/// Which endpoint a pooling request came in on, which decides the response's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingEndpoint {
    /// `/v1/embeddings`: `EmbeddingResponse`.
    Embeddings,
    /// `/pooling`: `PoolingResponse`.
    Pooling,
    /// `/classify`: `ClassificationResponse`.
    Classify,
}

/// A parsed `/v1/embeddings`, `/pooling` or `/classify` request.
#[derive(Debug, Clone)]
pub struct PoolingRequest {
    /// Endpoint it came in on.
    pub endpoint: PoolingEndpoint,
    /// Model and adapter.
    pub model: ResolvedModel,
    /// One prompt per input.
    pub prompts: Vec<Vec<u32>>,
    /// The media items of a chat's prompt (`messages` make one prompt); empty for `input`.
    pub media: Vec<MediaItem>,
    /// What to compute.
    pub task: Task,
    /// Vector encoding.
    pub encoding: Encoding,
    /// `dimensions`: embeddings cut to this length and renormalised.
    pub dimensions: Option<usize>,
    /// `cache_salt`.
    pub cache_salt: Option<String>,
}

/// The token ids of a query and a document.
pub type Pair = (Vec<u32>, Vec<u32>);

/// A parsed `/score` or `/rerank` request: one prompt per (query, document) pair.
#[derive(Debug, Clone)]
pub struct ScoreRequest {
    /// Model and adapter.
    pub model: ResolvedModel,
    /// Token ids of each pair's query and document.
    pub pairs: Vec<Pair>,
    /// `/rerank`: the documents, echoed in the results; `None` for `/score`.
    pub rerank_documents: Option<Vec<String>>,
    /// `top_n` (0 = all).
    pub top_n: usize,
    /// `cache_salt`.
    pub cache_salt: Option<String>,
}

impl ScoreRequest {
    /// The prompt the engine runs for pair `i`: query then document, as a cross-encoder
    /// reads them.
    pub fn prompt(&self, i: usize) -> Vec<u32> {
        let (q, d) = &self.pairs[i];
        let mut p = Vec::with_capacity(q.len() + d.len());
        p.extend_from_slice(q);
        p.extend_from_slice(d);
        p
    }
}

#[derive(Deserialize)]
struct PoolingBody {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    input: Option<PromptInput>,
    #[serde(default)]
    messages: Option<Vec<MessageBody>>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    encoding_format: Option<Encoding>,
    #[serde(default)]
    dimensions: Option<i64>,
    #[serde(default)]
    task: Option<String>,
    #[serde(default)]
    cache_salt: Option<String>,
}

/// Parses a `/v1/embeddings`, `/pooling` or `/classify` body: `input` in the completions
/// forms, or a chat in `messages` (vLLM's `*ChatRequest`, whose `add_generation_prompt`
/// defaults to false).
pub fn parse_pooling(
    body: &[u8],
    models: &Models,
    endpoint: PoolingEndpoint,
    media: &MediaConfig,
) -> Result<PoolingRequest, ApiError> {
    let b: PoolingBody = serde_json::from_slice(body)?;
    let model = models.resolve(b.model.as_deref())?;
    let (prompts, media) = match (b.input, b.messages) {
        (Some(input), None) => (openai::prompt_tokens(input, "input")?, Vec::new()),
        (None, Some(messages)) if !messages.is_empty() => {
            let add_generation_prompt = b.add_generation_prompt.unwrap_or(false);
            let prompt = openai::render_messages(&messages, add_generation_prompt, models, media)?;
            (vec![prompt.tokens], prompt.media)
        }
        (None, Some(_)) => {
            return Err(ApiError::bad_param(
                "messages",
                "messages must not be empty",
            ));
        }
        _ => {
            return Err(ApiError::bad_request(
                "exactly one of `input` and `messages` is required",
            ));
        }
    };
    let task = match (endpoint, b.task.as_deref()) {
        (PoolingEndpoint::Embeddings, _) => Task::Embed,
        (PoolingEndpoint::Classify, _) => Task::Classify,
        (PoolingEndpoint::Pooling, None | Some("embed")) => Task::Embed,
        (PoolingEndpoint::Pooling, Some("classify")) => Task::Classify,
        (PoolingEndpoint::Pooling, Some(other)) => {
            return Err(ApiError::bad_param(
                "task",
                format!("Unsupported task: {other:?} Supported tasks: ['embed', 'classify']"),
            ));
        }
    };
    // vLLM's `PoolingParams.verify`: a non-positive size is refused; the mock's embeddings
    // are matryoshka-like (a prefix renormalised), so any size up to the full one works.
    let dimensions = match b.dimensions {
        None => None,
        Some(d) if d < 1 => {
            return Err(ApiError::bad_param(
                "dimensions",
                "Dimensions must be greater than 0",
            ));
        }
        Some(d) if d as usize > EMBEDDING_DIM => {
            return Err(ApiError::bad_param(
                "dimensions",
                format!(
                    "Dimensions {d} is not supported; the model's embedding size is {EMBEDDING_DIM}"
                ),
            ));
        }
        Some(d) => Some(d as usize),
    };
    Ok(PoolingRequest {
        endpoint,
        model,
        prompts,
        media,
        task,
        encoding: b.encoding_format.unwrap_or(Encoding::Float),
        dimensions,
        cache_salt: b.cache_salt,
    })
}

#[derive(Deserialize)]
struct ScoreBody {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    cache_salt: Option<String>,
    // `/score`'s four spellings of the two sides (`ScoreRequest` in vLLM).
    #[serde(default)]
    queries: Option<Value>,
    #[serde(default)]
    documents: Option<Value>,
    #[serde(default)]
    items: Option<Value>,
    #[serde(default)]
    data_1: Option<Value>,
    #[serde(default)]
    data_2: Option<Value>,
    #[serde(default)]
    text_1: Option<Value>,
    #[serde(default)]
    text_2: Option<Value>,
    // `/rerank`.
    #[serde(default)]
    query: Option<Value>,
    #[serde(default)]
    top_n: Option<i64>,
}

/// A score input: a string or a list of strings (the mock has no multimodal inputs).
fn texts(v: Value, param: &str) -> Result<Vec<String>, ApiError> {
    let bad = || {
        ApiError::bad_param(
            param,
            format!("{param} must be a string or a list of strings"),
        )
    };
    match v {
        Value::String(s) => Ok(vec![s]),
        Value::Array(items) => items
            .into_iter()
            .map(|i| match i {
                Value::String(s) => Ok(s),
                _ => Err(bad()),
            })
            .collect(),
        _ => Err(bad()),
    }
}

/// vLLM's pairing rule (`validate_score_input`): 1:1, 1:N or N:N.
fn pair_up(q: Vec<String>, d: &[String]) -> Result<Vec<Pair>, ApiError> {
    if q.is_empty() {
        return Err(ApiError::bad_request(
            "At least one text element must be given",
        ));
    }
    if d.is_empty() {
        return Err(ApiError::bad_request(
            "At least one text_pair element must be given",
        ));
    }
    if q.len() > 1 && q.len() != d.len() {
        return Err(ApiError::bad_request(
            "Input lengths must be either 1:1, 1:N or N:N",
        ));
    }
    let qs: Vec<Vec<u32>> = q.iter().map(|s| tokenize(s)).collect();
    let pairs: Vec<_> = d
        .iter()
        .enumerate()
        .map(|(i, doc)| (qs[if qs.len() == 1 { 0 } else { i }].clone(), tokenize(doc)))
        .collect();
    if pairs.iter().any(|(q, d)| q.is_empty() && d.is_empty()) {
        return Err(ApiError::bad_request("Prompt cannot be empty"));
    }
    Ok(pairs)
}

/// Parses a `/score` body (`queries`/`documents`, `queries`/`items`, `data_1`/`data_2` or
/// `text_1`/`text_2`).
pub fn parse_score(body: &[u8], models: &Models) -> Result<ScoreRequest, ApiError> {
    let b: ScoreBody = serde_json::from_slice(body)?;
    let model = models.resolve(b.model.as_deref())?;
    let (left, right) = match (
        b.queries,
        b.documents,
        b.items,
        b.data_1,
        b.data_2,
        b.text_1,
        b.text_2,
    ) {
        (Some(q), Some(d), None, None, None, None, None)
        | (Some(q), None, Some(d), None, None, None, None)
        | (None, None, None, Some(q), Some(d), None, None)
        | (None, None, None, None, None, Some(q), Some(d)) => (q, d),
        _ => {
            return Err(ApiError::bad_request(
                "give the two sides to score as `queries` and `documents` (or `items`), \
                 `data_1` and `data_2`, or `text_1` and `text_2`",
            ));
        }
    };
    let q = texts(left, "queries")?;
    let d = texts(right, "documents")?;
    Ok(ScoreRequest {
        model,
        pairs: pair_up(q, &d)?,
        rerank_documents: None,
        top_n: 0,
        cache_salt: b.cache_salt,
    })
}

/// Parses a `/rerank` body (`query`, `documents`, `top_n`).
pub fn parse_rerank(body: &[u8], models: &Models) -> Result<ScoreRequest, ApiError> {
    let b: ScoreBody = serde_json::from_slice(body)?;
    let model = models.resolve(b.model.as_deref())?;
    let Some(query) = b.query else {
        return Err(ApiError::bad_param("query", "query is required"));
    };
    let Value::String(query) = query else {
        return Err(ApiError::bad_param("query", "query must be a string"));
    };
    let Some(documents) = b.documents else {
        return Err(ApiError::bad_param("documents", "documents is required"));
    };
    let documents = texts(documents, "documents")?;
    // `top_n: int = Field(default=0, ge=0)`.
    let top_n = match b.top_n {
        None => 0,
        Some(n) if n < 0 => {
            return Err(ApiError::bad_param(
                "top_n",
                "top_n must be greater than or equal to 0",
            ));
        }
        Some(n) => n as usize,
    };
    Ok(ScoreRequest {
        model,
        pairs: pair_up(vec![query], &documents)?,
        rerank_documents: Some(documents),
        top_n,
        cache_salt: b.cache_salt,
    })
}

/// A vector as the request's encoding writes it.
fn encode(v: &[f32], encoding: Encoding) -> Value {
    match encoding {
        Encoding::Float => json!(v),
        Encoding::Base64 => {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

/// vLLM's `UsageInfo` for pooling: prompt tokens only.
fn usage(prompt_tokens: u32) -> Usage {
    Usage {
        prompt_tokens,
        total_tokens: prompt_tokens,
        completion_tokens: 0,
        prompt_tokens_details: None,
    }
}

/// The response of a `/v1/embeddings`, `/pooling` or `/classify` request (`id_body` is the
/// request id without its prefix). `prompt_tokens` is what the engine reports.
pub fn pooling_body(
    req: &PoolingRequest,
    id_body: &str,
    created: u64,
    prompt_tokens: u32,
) -> Value {
    let data: Vec<Value> = req
        .prompts
        .iter()
        .enumerate()
        .map(|(index, p)| match (req.endpoint, req.task) {
            (PoolingEndpoint::Embeddings, _) => json!({
                "index": index, "object": "embedding",
                "embedding": encode(&embedding_with(p, req.dimensions), req.encoding),
            }),
            (PoolingEndpoint::Pooling, Task::Embed) => json!({
                "index": index, "object": "pooling",
                "data": encode(&embedding_with(p, req.dimensions), req.encoding),
            }),
            (PoolingEndpoint::Pooling, Task::Classify) => json!({
                "index": index, "object": "pooling",
                "data": encode(&class_probs(p), req.encoding),
            }),
            (PoolingEndpoint::Classify, _) => {
                let probs = class_probs(p);
                let best = probs
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .map_or(0, |(i, _)| i);
                json!({
                    "index": index, "label": LABELS[best], "probs": probs,
                    "num_classes": probs.len(),
                })
            }
        })
        .collect();
    let prefix = match req.endpoint {
        PoolingEndpoint::Embeddings => "embd",
        PoolingEndpoint::Pooling => "pool",
        PoolingEndpoint::Classify => "classify",
    };
    json!({
        "id": format!("{prefix}-{id_body}"), "object": "list", "created": created,
        "model": req.model.name, "data": data, "usage": usage(prompt_tokens),
    })
}

/// The response of a `/score` or `/rerank` request. vLLM's scoring server names both
/// `score-<id>`; rerank results are sorted by relevance and cut to `top_n` when it is set.
pub fn score_body(req: &ScoreRequest, id_body: &str, created: u64, prompt_tokens: u32) -> Value {
    let scores: Vec<f32> = req.pairs.iter().map(|(q, d)| relevance(q, d)).collect();
    let id = format!("score-{id_body}");
    let Some(documents) = &req.rerank_documents else {
        let data: Vec<Value> = scores
            .iter()
            .enumerate()
            .map(|(index, s)| json!({"index": index, "object": "score", "score": s}))
            .collect();
        return json!({
            "id": id, "object": "list", "created": created, "model": req.model.name,
            "data": data, "usage": usage(prompt_tokens),
        });
    };
    let mut order: Vec<usize> = (0..scores.len()).collect();
    // Stable, so equal scores keep the documents' order.
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    if req.top_n > 0 {
        order.truncate(req.top_n);
    }
    let results: Vec<Value> = order
        .into_iter()
        .map(|i| {
            json!({
                "index": i,
                "document": {"text": documents[i], "multi_modal": null},
                "relevance_score": scores[i],
            })
        })
        .collect();
    json!({
        "id": id, "model": req.model.name,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        "results": results,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::tokenizer::render_chat;

    /// The prompt of a chat rendered for pooling.
    fn chat_prompt(messages: &[(&str, &str)], add_generation_prompt: bool) -> Vec<u32> {
        let msgs: Vec<_> = messages
            .iter()
            .map(
                |(role, content)| crate::engine::model::tokenizer::ChatMessage {
                    role: (*role).to_owned(),
                    content: (*content).to_owned(),
                },
            )
            .collect();
        tokenize(&render_chat(&msgs, add_generation_prompt))
    }

    fn models() -> Models {
        Models::new(vec!["m".into()], &["ad".into()])
    }

    #[test]
    fn inputs_in_every_form_and_chat() {
        let r = parse_pooling(
            br#"{"input":"abcd"}"#,
            &models(),
            PoolingEndpoint::Embeddings,
            &MediaConfig::default(),
        )
        .unwrap();
        assert_eq!(r.prompts, vec![tokenize("abcd")]);
        let r = parse_pooling(
            br#"{"input":[[1,2],[3]],"encoding_format":"base64","dimensions":4}"#,
            &models(),
            PoolingEndpoint::Embeddings,
            &MediaConfig::default(),
        )
        .unwrap();
        assert_eq!(r.prompts.len(), 2);
        assert_eq!((r.encoding, r.dimensions), (Encoding::Base64, Some(4)));
        let r = parse_pooling(
            br#"{"messages":[{"role":"user","content":"hi"}]}"#,
            &models(),
            PoolingEndpoint::Classify,
            &MediaConfig::default(),
        )
        .unwrap();
        assert_eq!(r.prompts[0], chat_prompt(&[("user", "hi")], false));
        let r = parse_pooling(
            br#"{"input":["a","b"],"task":"classify"}"#,
            &models(),
            PoolingEndpoint::Pooling,
            &MediaConfig::default(),
        )
        .unwrap();
        assert_eq!(r.task, Task::Classify);
    }

    #[test]
    fn pooling_errors() {
        let e = |b: &[u8]| {
            parse_pooling(
                b,
                &models(),
                PoolingEndpoint::Pooling,
                &MediaConfig::default(),
            )
            .unwrap_err()
        };
        assert_eq!(e(br#"{"input":"a","model":"zz"}"#).status, 404);
        assert_eq!(e(br#"{"input":[]}"#).param.as_deref(), Some("input"));
        assert_eq!(e(br#"{"input":""}"#).status, 400);
        assert_eq!(
            e(br#"{"input":"a","dimensions":0}"#).param.as_deref(),
            Some("dimensions")
        );
        assert_eq!(e(br#"{"input":"a","dimensions":100000}"#).status, 400);
        assert_eq!(e(br#"{"input":"a","encoding_format":"hex"}"#).status, 400);
        assert_eq!(
            e(br#"{"input":"a","task":"plugin"}"#).param.as_deref(),
            Some("task")
        );
        assert_eq!(e(br#"{}"#).status, 400);
        assert_eq!(e(br#"{"input":{"x":1}}"#).status, 400);
    }

    #[test]
    fn base64_is_little_endian_f32() {
        let v = [1.0f32, -0.5];
        let Value::String(s) = encode(&v, Encoding::Base64) else {
            panic!("not a string")
        };
        let bytes = base64::engine::general_purpose::STANDARD.decode(s).unwrap();
        assert_eq!(
            bytes,
            [1.0f32.to_le_bytes(), (-0.5f32).to_le_bytes()].concat()
        );
    }

    #[test]
    fn score_pairs_and_rerank_order() {
        let r = parse_score(br#"{"queries":"q","documents":["a","b","c"]}"#, &models()).unwrap();
        assert_eq!(r.pairs.len(), 3);
        let r = parse_score(br#"{"text_1":["a","b"],"text_2":["c","d"]}"#, &models()).unwrap();
        assert_eq!(r.pairs[1], (tokenize("b"), tokenize("d")));
        let e = parse_score(br#"{"data_1":["a","b"],"data_2":["c","d","e"]}"#, &models());
        assert!(e.unwrap_err().message.contains("1:1, 1:N or N:N"));
        let e = parse_score(br#"{"queries":"a"}"#, &models()).unwrap_err();
        assert_eq!(e.status, 400);
        let r = parse_rerank(
            br#"{"query":"the red fox","documents":["tax law","the red fox runs","red"],"top_n":2,"return_documents":true}"#,
            &models(),
        )
        .unwrap();
        let body = score_body(&r, "x", 0, 10);
        let results = body["results"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!(results[0]["index"], 1);
        assert_eq!(results[0]["document"]["text"], "the red fox runs");
        assert!(results[0]["relevance_score"].as_f64() >= results[1]["relevance_score"].as_f64());
        assert_eq!(
            body["usage"],
            json!({"prompt_tokens": 10, "total_tokens": 10})
        );
        assert_eq!(body["id"], "score-x");
        let e = parse_rerank(br#"{"query":"q","documents":["a"],"top_n":-1}"#, &models());
        assert_eq!(e.unwrap_err().param.as_deref(), Some("top_n"));
        let e = parse_rerank(br#"{"documents":["a"]}"#, &models());
        assert_eq!(e.unwrap_err().param.as_deref(), Some("query"));
    }
}
