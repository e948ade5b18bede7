//! Token ids of a request's prompt from the engine's own `/tokenize` (vLLM's extension), so
//! entry nodes in exact mode hash exactly the tokens the engine caches — chat template
//! included, which no tokenizer file alone reproduces.

use super::client::{EngineClient, EngineError, error_chain};
use bytes::Bytes;
use http::Method;
use http_body_util::BodyExt;
use kvmesh_protocol::hashing::Endpoint;
use serde_json::{Map, Value};
use std::time::Duration;

/// Chat fields that change what the chat template renders; `/tokenize` accepts them all.
const CHAT_TEMPLATE_FIELDS: [&str; 6] = [
    "tools",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template",
    "chat_template_kwargs",
    "add_special_tokens",
];

/// The `/tokenize` body for a request body, or `None` when there is no text prompt to send
/// (token-id prompts need no tokenizing).
pub fn tokenize_body(endpoint: Endpoint, body: &Value) -> Option<Value> {
    let object = body.as_object()?;
    let mut request = Map::new();
    request.insert("model".into(), object.get("model")?.clone());
    match endpoint {
        Endpoint::Completions => {
            let prompt = completion_prompt(body)?;
            request.insert("prompt".into(), Value::String(prompt.to_owned()));
            if let Some(flag) = object.get("add_special_tokens") {
                request.insert("add_special_tokens".into(), flag.clone());
            }
        }
        Endpoint::ChatCompletions => {
            request.insert("messages".into(), object.get("messages")?.clone());
            for field in CHAT_TEMPLATE_FIELDS {
                if let Some(value) = object.get(field).filter(|v| !v.is_null()) {
                    request.insert(field.into(), value.clone());
                }
            }
        }
    }
    Some(Value::Object(request))
}

/// The text a completions request is routed by, or `None` when its prompt is token ids.
pub fn completion_prompt(body: &Value) -> Option<&str> {
    // A batch goes to one engine, routed by its first prompt.
    match body.get("prompt")? {
        Value::String(text) => Some(text),
        Value::Array(items) => items.first()?.as_str(),
        _ => None,
    }
}

/// Asks the engine for the prompt's token ids, within `within`.
pub async fn tokenize(
    client: &EngineClient,
    request: &Value,
    within: Duration,
) -> Result<Vec<u32>, EngineError> {
    let body =
        Bytes::from(serde_json::to_vec(request).map_err(|e| EngineError::Body(e.to_string()))?);
    let headers = [("content-type".to_owned(), "application/json".to_owned())];
    let call = async {
        let response = client
            .send(Method::POST, "/tokenize", &headers, body)
            .await?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| EngineError::Body(error_chain(&e)))?
            .to_bytes();
        if status != http::StatusCode::OK {
            return Err(EngineError::Status {
                status: status.as_u16(),
                body: String::from_utf8_lossy(&bytes).into_owned(),
            });
        }
        parse_tokens(&bytes)
    };
    tokio::time::timeout(within, call)
        .await
        .map_err(|_| EngineError::Timeout(within))?
}

fn parse_tokens(bytes: &[u8]) -> Result<Vec<u32>, EngineError> {
    let bad = |why: &str| EngineError::Body(format!("/tokenize answer {why}"));
    let value: Value = serde_json::from_slice(bytes).map_err(|_| bad("is not JSON"))?;
    value
        .get("tokens")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("has no `tokens` array"))?
        .iter()
        .map(|t| t.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect::<Option<Vec<u32>>>()
        .ok_or_else(|| bad("has a token id that is not a u32"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_bodies_keep_what_the_template_renders_and_drop_the_rest() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function"}], "temperature": 0.2, "stream": true,
            "add_generation_prompt": true, "chat_template_kwargs": null});
        assert_eq!(
            tokenize_body(Endpoint::ChatCompletions, &body),
            Some(
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function"}], "add_generation_prompt": true})
            )
        );
    }

    #[test]
    fn completions_send_the_first_text_prompt() {
        let batch = json!({"model": "m", "prompt": ["first", "second"], "max_tokens": 3});
        assert_eq!(
            tokenize_body(Endpoint::Completions, &batch),
            Some(json!({"model": "m", "prompt": "first"}))
        );
        let tokens = json!({"model": "m", "prompt": [1, 2, 3]});
        assert_eq!(tokenize_body(Endpoint::Completions, &tokens), None);
    }

    #[test]
    fn answers_without_token_ids_are_errors() {
        assert_eq!(
            parse_tokens(br#"{"count": 2, "tokens": [5, 7], "max_model_len": 8}"#).unwrap(),
            vec![5, 7]
        );
        assert!(parse_tokens(br#"{"tokens": [-1]}"#).is_err());
        assert!(parse_tokens(br#"{"count": 2}"#).is_err());
        assert!(parse_tokens(b"<html>").is_err());
    }
}
