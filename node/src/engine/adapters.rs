//! Loading a LoRA adapter into this node's engine before a request for it is served.
//!
//! An entry node sends a request for an adapter no engine serves to the engine
//! `kvmesh_protocol::route::place_adapter` chose; this node, serving it, sees that its
//! engine lacks the adapter and loads it through vLLM's `POST /v1/load_lora_adapter`, with
//! the path `[lora] path_template` gives, when its own `[lora]` rules allow that name onto a
//! base model its engine serves. One load per name at a time: concurrent requests for it wait
//! on the same load, bounded by `load_timeout`. Each load is counted by outcome in
//! `kvmesh_lora_loads_total`.

use super::client::{EngineClient, EngineError};
use super::poller::EngineState;
use crate::metrics::NodeMetrics;
use crate::serve::config::LoraConfig;
use crate::serve::state::lock;
use bytes::Bytes;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use http::Method;
use http_body_util::BodyExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How a load ended (the `outcome` label of `kvmesh_lora_loads_total`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LoadOutcome {
    /// The engine loaded it.
    Loaded,
    /// The engine had it already (loaded by someone else since it was last polled).
    AlreadyLoaded,
    /// The engine refused it or could not be reached.
    Failed,
    /// It took longer than the load timeout.
    Timeout,
}

impl LoadOutcome {
    pub const ALL: [LoadOutcome; 4] = [
        LoadOutcome::Loaded,
        LoadOutcome::AlreadyLoaded,
        LoadOutcome::Failed,
        LoadOutcome::Timeout,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            LoadOutcome::Loaded => "loaded",
            LoadOutcome::AlreadyLoaded => "already_loaded",
            LoadOutcome::Failed => "failed",
            LoadOutcome::Timeout => "timeout",
        }
    }
}

type Load = Shared<BoxFuture<'static, Result<(), String>>>;

/// The loads in flight, by adapter name, and the names loaded lately.
#[derive(Debug)]
pub struct AdapterLoader {
    loading: Arc<Mutex<HashMap<String, Load>>>,
    loaded: Arc<Mutex<HashMap<String, Instant>>>,
    /// How long a name loaded here counts as loaded though the engine's `/v1/models`, read
    /// every few polls, does not list it yet.
    remember: Duration,
}

impl AdapterLoader {
    /// `models_period`: how often the poller reads the engine's `/v1/models`.
    pub fn new(models_period: Duration) -> Self {
        Self {
            loading: Default::default(),
            loaded: Default::default(),
            remember: models_period * 2 + Duration::from_secs(1),
        }
    }
}

/// The base model `model` has to be loaded onto before this node's engine can serve it, if it
/// must be and may be: the engine lacks it, a `[lora]` rule allows it onto a base model, and
/// the engine serves that model. `None`: nothing to load (the engine answers for itself).
pub fn base_to_load<'a>(
    engine: &EngineState,
    config: &'a LoraConfig,
    model: &str,
) -> Option<&'a str> {
    let serves = |name: &str| engine.models.iter().chain(&engine.loras).any(|m| m == name);
    if serves(model) {
        return None;
    }
    config
        .loadable
        .base_of(model)
        .filter(|base| engine.models.iter().any(|m| m == base))
}

impl AdapterLoader {
    /// Makes sure this node's engine has `model` when it is an adapter it may load (see
    /// [`base_to_load`]); returns at once otherwise. `Err`: why it could not be loaded.
    pub async fn ensure(
        &self,
        engine: &EngineState,
        client: &EngineClient,
        config: &LoraConfig,
        metrics: &NodeMetrics,
        model: &str,
    ) -> Result<(), String> {
        let Some(base) = base_to_load(engine, config, model) else {
            return Ok(());
        };
        if lock(&self.loaded)
            .get(model)
            .is_some_and(|at| at.elapsed() < self.remember)
        {
            return Ok(());
        }
        let load = {
            let mut loading = lock(&self.loading);
            match loading.get(model) {
                Some(load) => load.clone(),
                None => {
                    let load = self.start(client, config, metrics, model, base);
                    loading.insert(model.to_owned(), load.clone());
                    load
                }
            }
        };
        load.await
    }

    /// Starts loading `adapter` in a task of its own: it finishes even if every request
    /// waiting on it goes away.
    fn start(
        &self,
        client: &EngineClient,
        config: &LoraConfig,
        metrics: &NodeMetrics,
        adapter: &str,
        base: &str,
    ) -> Load {
        let (client, metrics) = (client.clone(), metrics.clone());
        let (loading, loaded, remember) =
            (self.loading.clone(), self.loaded.clone(), self.remember);
        let (name, path, timeout) = (
            adapter.to_owned(),
            config.path_of(adapter, base),
            config.load_timeout,
        );
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let (outcome, result) =
                match tokio::time::timeout(timeout, load(&client, &name, &path)).await {
                    Ok(Ok(outcome)) => (outcome, Ok(())),
                    Ok(Err(why)) => (LoadOutcome::Failed, Err(why)),
                    Err(_) => (
                        LoadOutcome::Timeout,
                        Err(format!("not loaded within {} s", timeout.as_secs())),
                    ),
                };
            metrics.lora_load(outcome);
            let ms = started.elapsed().as_millis() as u64;
            match &result {
                Ok(()) => {
                    tracing::info!(adapter = %name, %path, ms, outcome = outcome.as_str(), "LoRA adapter loaded");
                    let mut loaded = lock(&loaded);
                    loaded.retain(|_, at| at.elapsed() < remember);
                    loaded.insert(name.clone(), Instant::now());
                }
                Err(why) => {
                    tracing::warn!(adapter = %name, %path, ms, %why, "loading a LoRA adapter failed")
                }
            }
            lock(&loading).remove(&name);
            result.map_err(|why| format!("loading LoRA adapter `{name}` from `{path}`: {why}"))
        });
        async move {
            task.await
                .unwrap_or_else(|e| Err(format!("the adapter load task ended: {e}")))
        }
        .boxed()
        .shared()
    }
}

/// One call of vLLM's `/v1/load_lora_adapter`.
async fn load(client: &EngineClient, name: &str, path: &str) -> Result<LoadOutcome, String> {
    let body = serde_json::json!({"lora_name": name, "lora_path": path}).to_string();
    let headers = [("content-type".to_owned(), "application/json".to_owned())];
    let response = client
        .send(
            Method::POST,
            "/v1/load_lora_adapter",
            &headers,
            Bytes::from(body),
        )
        .await
        .map_err(|e: EngineError| e.to_string())?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading the engine's answer: {e}"))?
        .to_bytes();
    let message = error_message(&body);
    match status.as_u16() {
        200 => Ok(LoadOutcome::Loaded),
        // vLLM refuses a name it knows, with InvalidUserInput: it is there, which is the point.
        400 if message.contains("has already been loaded") => Ok(LoadOutcome::AlreadyLoaded),
        404 | 405 => Err(format!(
            "the engine answered {status} ({message}): it does not load adapters at run time \
             (vLLM needs VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
        )),
        _ => Err(format!("the engine answered {status}: {message}")),
    }
}

/// The message of an OpenAI-shaped error body, else the body itself (shortened).
fn error_message(body: &[u8]) -> String {
    let parsed = serde_json::from_slice::<serde_json::Value>(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("detail"))
            .and_then(serde_json::Value::as_str)
    });
    match message {
        Some(message) => message.to_owned(),
        None => String::from_utf8_lossy(body).chars().take(300).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvmesh_protocol::route::{AdapterRule, LoadableAdapters};

    #[test]
    fn only_an_adapter_a_rule_allows_onto_a_served_base_is_loaded() {
        let engine = EngineState {
            models: vec!["model-b".into()],
            loras: vec!["sql".into()],
            ..Default::default()
        };
        let config = LoraConfig {
            loadable: LoadableAdapters {
                rules: vec![
                    AdapterRule::parse("chat-*=model-b").unwrap(),
                    AdapterRule::parse("math=model-a").unwrap(),
                    AdapterRule::parse("s*=model-b").unwrap(),
                ],
            },
            ..Default::default()
        };
        assert_eq!(base_to_load(&engine, &config, "chat-1"), Some("model-b"));
        assert_eq!(
            base_to_load(&engine, &config, "sql"),
            None,
            "already served"
        );
        assert_eq!(base_to_load(&engine, &config, "model-b"), None);
        assert_eq!(
            base_to_load(&engine, &config, "math"),
            None,
            "base not served"
        );
        assert_eq!(base_to_load(&engine, &config, "other"), None, "no rule");
    }

    #[test]
    fn error_messages_come_out_of_openai_and_plain_bodies() {
        let body = br#"{"error":{"message":"The lora adapter 'x' has already been loaded.","type":"InvalidUserInput","code":400}}"#;
        assert_eq!(
            error_message(body),
            "The lora adapter 'x' has already been loaded."
        );
        assert_eq!(error_message(br#"{"detail":"Not Found"}"#), "Not Found");
        assert_eq!(
            error_message(b"Internal Server Error"),
            "Internal Server Error"
        );
    }
}
