//! Intent routing in the request path (`--intents FILE`): a request whose `model` is the auto
//! name is rewritten to the model its intent maps to, before it is hashed and routed like any
//! other request. The decision itself is the protocol's [`IntentRouter`]; this module loads
//! the file (and `--embedding-model`), counts decisions and names the intent in the answer's
//! `x-kvmesh-intent` header.

use super::errors::ApiError;
use super::inference::Api;
use crate::serve::state::SharedState;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use kvmesh_protocol::intent::{DEFAULT_INTENT, Embedder, IntentRouter, IntentsFile, NgramEmbedder};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::cell::RefCell;
use std::future::Future;
use std::path::{Path, PathBuf};

/// The response header naming the intent a request was routed by (`default` when none).
pub const INTENT_HEADER: &str = "x-kvmesh-intent";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IntentLabels {
    pub intent: String,
}

/// The loaded intents file, its embedder and its metric.
pub struct IntentRouting {
    pub router: IntentRouter,
    pub path: PathBuf,
    /// A digest of the file's bytes and of the embedding, which every node gossips: nodes
    /// whose hashes differ decide differently (`/debug/cluster` shows it).
    pub hash: String,
    /// `kvmesh_intent_requests_total{intent}`.
    pub requests: Family<IntentLabels, Counter>,
}

impl std::fmt::Debug for IntentRouting {
    // The centroids are long and say nothing to a reader.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntentRouting")
            .field("path", &self.path)
            .field("hash", &self.hash)
            .finish_non_exhaustive()
    }
}

impl IntentRouting {
    /// Reads and validates the intents file, loads the embedding (`model_dir`, else hashed
    /// n-grams) and embeds every example.
    pub fn load(path: &Path, model_dir: Option<&Path>) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the intents file {}", path.display()))?;
        let file = IntentsFile::parse(&text)
            .with_context(|| format!("intents file {}", path.display()))?;
        let embedder: Box<dyn Embedder> = match model_dir {
            Some(dir) => Box::new(crate::engine::static_embedding::load(dir)?),
            None => Box::new(NgramEmbedder::default()),
        };
        let mut hasher = blake3::Hasher::new();
        hasher.update(text.as_bytes());
        hasher.update(&[0]);
        hasher.update(embedder.identity().as_bytes());
        let hash = hasher.finalize().to_hex()[..16].to_owned();
        let router = IntentRouter::new(file, embedder);
        let requests = Family::<IntentLabels, Counter>::default();
        // Every configured intent has its series from the start, so a rate over it is defined
        // before its first request.
        for name in router
            .file()
            .intents
            .iter()
            .map(|i| i.name.as_str())
            .chain([DEFAULT_INTENT])
        {
            let _ = requests.get_or_create(&IntentLabels {
                intent: name.to_owned(),
            });
        }
        Ok(Self {
            router,
            path: path.to_owned(),
            hash,
            requests,
        })
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.sub_registry_with_prefix("kvmesh").register(
            "intent_requests",
            "Requests for the auto model, by the intent that chose their model",
            self.requests.clone(),
        );
    }

    /// What `/debug/cluster` shows of this node's intents.
    pub fn describe(&self) -> serde_json::Value {
        let file = self.router.file();
        serde_json::json!({
            "hash": self.hash,
            "file": self.path.display().to_string(),
            "auto_name": file.auto_name,
            "default_model": file.default_model,
            "embedding": self.router.embedder().identity(),
            "intents": file.intents.iter().map(|i| serde_json::json!({
                "name": i.name,
                "model": i.model,
            })).collect::<Vec<_>>(),
        })
    }
}

tokio::task_local! {
    /// The intent chosen for the request this task serves, for the response header.
    static CHOSEN: RefCell<Option<String>>;
}

/// Runs a request's handler and names the intent its model was chosen by in the response's
/// `x-kvmesh-intent` header. A task-local carries the name out of the handler, so that the
/// request path itself needs no more than the one [`resolve`] call.
pub async fn tagged<B>(handler: impl Future<Output = http::Response<B>>) -> http::Response<B> {
    CHOSEN
        .scope(RefCell::new(None), async move {
            let mut response = handler.await;
            let chosen = CHOSEN.with(|chosen| chosen.borrow_mut().take());
            if let Some(value) = chosen.and_then(|name| HeaderValue::from_str(&name).ok()) {
                response
                    .headers_mut()
                    .insert(HeaderName::from_static(INTENT_HEADER), value);
            }
            response
        })
        .await
}

/// The request path's step: when a completions or chat body asks for the auto model and this
/// node has an intents file, returns the body rewritten to the chosen model (and counts the decision);
/// otherwise the body as it came.
pub fn resolve(
    state: &SharedState,
    api: Api,
    body: Bytes,
    mut json: serde_json::Value,
) -> Result<(Bytes, serde_json::Value), ApiError> {
    // Intents choose between generative models; embeddings, scores and the like name theirs.
    let (Some(routing), Api::Generation(endpoint)) = (state.config.intents.as_deref(), api) else {
        return Ok((body, json));
    };
    let Some(choice) = routing.router.route(endpoint, &mut json) else {
        return Ok((body, json));
    };
    let name = choice.name().to_owned();
    tracing::debug!(
        intent = %name,
        model = choice.model,
        via = choice.via.as_str(),
        nearest = ?choice.nearest,
        "intent decided"
    );
    routing
        .requests
        .get_or_create(&IntentLabels {
            intent: name.clone(),
        })
        .inc();
    // Outside a `tagged` scope (no such caller today) there is just no header.
    let _ = CHOSEN.try_with(|chosen| *chosen.borrow_mut() = Some(name));
    let body = serde_json::to_vec(&json).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("re-encoding the request for its intent's model: {e}"),
        )
    })?;
    Ok((Bytes::from(body), json))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
default_model = "general"
[[intent]]
name = "math"
model = "reasoner"
keywords = ["integral"]
"#;

    #[test]
    fn load_names_the_file_in_its_errors_and_zeroes_every_series() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("intents.toml");
        std::fs::write(&path, FILE).unwrap();
        let routing = IntentRouting::load(&path, None).unwrap();
        assert_eq!(routing.hash.len(), 16);
        let mut registry = Registry::default();
        routing.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for intent in ["math", "default"] {
            let series = format!("kvmesh_intent_requests_total{{intent=\"{intent}\"}} 0");
            assert!(text.contains(&series), "{text}");
        }
        // A different file is a different hash.
        std::fs::write(&path, FILE.replace("reasoner", "other")).unwrap();
        assert_ne!(IntentRouting::load(&path, None).unwrap().hash, routing.hash);

        std::fs::write(&path, "default_model = \"g\"\n").unwrap();
        let error = format!("{:#}", IntentRouting::load(&path, None).unwrap_err());
        assert!(
            error.contains("intents.toml") && error.contains("no `[[intent]]`"),
            "{error}"
        );
        let missing = dir.path().join("missing.toml");
        let error = format!("{:#}", IntentRouting::load(&missing, None).unwrap_err());
        assert!(error.contains("missing.toml"), "{error}");
    }

    #[tokio::test]
    async fn the_header_names_the_intent_set_inside_the_scope() {
        let response = tagged(async {
            let _ = CHOSEN.try_with(|c| *c.borrow_mut() = Some("math".into()));
            http::Response::new(())
        })
        .await;
        assert_eq!(response.headers()[INTENT_HEADER], "math");
        let untouched = tagged(async { http::Response::new(()) }).await;
        assert!(untouched.headers().get(INTENT_HEADER).is_none());
    }
}
