//! OpenAI-shaped request bodies and checks of what comes back.

use serde_json::{Value, json};

use crate::http::Response;

pub const COMPLETIONS: &str = "/v1/completions";
pub const CHAT_COMPLETIONS: &str = "/v1/chat/completions";

/// A `/v1/completions` body.
pub fn completion_body(model: &str, prompt: &str, max_tokens: u32, stream: bool) -> Value {
    json!({ "model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream })
}

/// A `/v1/chat/completions` body with one user message.
pub fn chat_body(model: &str, content: &str, max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": model,
        "messages": [{ "role": "user", "content": content }],
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

/// The node that served a forwarded request (`x-kvmesh-node`); panics if the header is absent.
pub fn served_by(response: &Response) -> String {
    response
        .header("x-kvmesh-node")
        .unwrap_or_else(|| panic!("no x-kvmesh-node header: {}", response.describe()))
        .to_string()
}

/// Checks a successful non-streamed answer of `object` kind (`text_completion` or
/// `chat.completion`) for `model`; returns its JSON.
pub fn assert_completion(response: &Response, object: &str, model: &str) -> Value {
    assert_eq!(
        response.status,
        200,
        "expected a completion: {}",
        response.describe()
    );
    let body = response.json();
    assert_eq!(body["object"], object, "{}", response.describe());
    assert_eq!(body["model"], model, "{}", response.describe());
    let choices = body["choices"].as_array().map(Vec::len).unwrap_or(0);
    assert!(choices > 0, "no choices: {}", response.describe());
    assert!(
        response.header("x-kvmesh-reason").is_some(),
        "no x-kvmesh-reason: {}",
        response.describe()
    );
    body
}

/// Checks an error response: `status`, and OpenAI's error shape
/// `{"error": {"message", "type", "param", "code"}}` with a non-empty message. Returns the
/// `error` object.
pub fn assert_openai_error(response: &Response, status: u16) -> Value {
    assert_eq!(
        response.status,
        status,
        "unexpected status: {}",
        response.describe()
    );
    let body = response.json();
    let error = &body["error"];
    assert!(
        error.is_object(),
        "no error object: {}",
        response.describe()
    );
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        !message.is_empty(),
        "error without a message: {}",
        response.describe()
    );
    assert!(
        error["type"].is_string(),
        "error without a type: {}",
        response.describe()
    );
    for key in ["param", "code"] {
        assert!(
            error
                .as_object()
                .is_some_and(|fields| fields.contains_key(key)),
            "error without {key:?}: {}",
            response.describe()
        );
    }
    error.clone()
}
