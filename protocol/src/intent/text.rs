//! What of a request the intent decision reads: the last user turn (what the user asks now),
//! and the size of the whole prompt.

use crate::hashing::Endpoint;
use serde_json::Value;

/// The text an intent is decided on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PromptText {
    /// The last `user` message's text (a completions request: its prompt).
    pub last_user: String,
    /// The whole prompt's estimated token count (every message's text).
    pub prompt_tokens: u64,
}

/// Bytes per token of the estimate. The decision runs before any tokenizer (and must give the
/// same answer at every node, whatever engine it has), so prompt-length rules use the usual
/// rule of thumb for English text with BPE tokenizers: about four bytes a token.
pub const BYTES_PER_TOKEN: u64 = 4;

pub fn estimate_tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(BYTES_PER_TOKEN)
}

/// The text of a request body; fields of the wrong shape count as no text (the engine will
/// refuse the request with its own, better, error).
pub fn prompt_text(endpoint: Endpoint, body: &Value) -> PromptText {
    match endpoint {
        Endpoint::Completions => {
            // A batch or token-id prompt: the first text prompt speaks for the request.
            let prompt = match body.get("prompt") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(items)) => items
                    .iter()
                    .find_map(|item| item.as_str())
                    .unwrap_or_default()
                    .to_owned(),
                _ => String::new(),
            };
            PromptText {
                prompt_tokens: estimate_tokens(prompt.len()),
                last_user: prompt,
            }
        }
        Endpoint::ChatCompletions => {
            let messages = body
                .get("messages")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let mut total = 0usize;
            let mut last_user = None;
            for message in messages {
                let text = message_text(message.get("content"));
                total += text.len();
                if message.get("role").and_then(Value::as_str) == Some("user") {
                    last_user = Some(text);
                }
            }
            PromptText {
                last_user: last_user.unwrap_or_default(),
                prompt_tokens: estimate_tokens(total),
            }
        }
    }
}

/// A message's content as text: a string, or the `text` parts of a list joined by newlines
/// (images and audio parts say nothing the embedding could read).
fn message_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|part| part.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_reads_the_last_user_turn_and_sizes_the_whole_prompt() {
        let body = json!({"messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "write a poem"},
            {"role": "assistant", "content": "Roses..."},
            {"role": "user", "content": [
                {"type": "text", "text": "now prove"},
                {"type": "image_url", "image_url": {"url": "data:..."}},
                {"type": "text", "text": "that 2+2=4"},
            ]},
        ]});
        let text = prompt_text(Endpoint::ChatCompletions, &body);
        assert_eq!(text.last_user, "now prove\nthat 2+2=4");
        let bytes = "You are terse.".len()
            + "write a poem".len()
            + "Roses...".len()
            + "now prove\nthat 2+2=4".len();
        assert_eq!(text.prompt_tokens, (bytes as u64).div_ceil(4));
    }

    #[test]
    fn completions_read_the_prompt() {
        let one = prompt_text(Endpoint::Completions, &json!({"prompt": "abcdefghi"}));
        assert_eq!(one.last_user, "abcdefghi");
        assert_eq!(one.prompt_tokens, 3);
        let batch = prompt_text(Endpoint::Completions, &json!({"prompt": [[1, 2], "x"]}));
        assert_eq!(batch.last_user, "x");
    }

    #[test]
    fn odd_shapes_are_no_text() {
        for body in [
            json!({}),
            json!({"messages": "hi"}),
            json!({"messages": [{"role": "user", "content": 3}]}),
            json!({"messages": [{"role": "assistant", "content": "only me"}]}),
        ] {
            assert_eq!(
                prompt_text(Endpoint::ChatCompletions, &body).last_user,
                "",
                "{body}"
            );
        }
        assert_eq!(
            prompt_text(Endpoint::Completions, &json!({"prompt": [1, 2]})),
            PromptText::default()
        );
    }
}
