//! Incremental parsing of an OpenAI-style SSE stream into what the load generator measures.
//!
//! Bytes arrive in arbitrary pieces; events end with a blank line (`\n\n` or `\r\n\r\n`).
//! Each `data:` event is a JSON chunk (completions `choices[].text`, chat
//! `choices[].delta.content`, or a usage chunk) or the terminator `[DONE]`.

use std::borrow::Cow;

use serde::Deserialize;

/// What one SSE event carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseEvent {
    /// A chunk with generated text (non-empty).
    Content(String),
    /// A chunk without text (e.g. the chat role chunk, or a finish-only chunk).
    Empty,
    /// A usage chunk.
    Usage(ResponseUsage),
    /// `data: [DONE]`.
    Done,
    /// An error object in the stream (`{"error": ...}`) or unparseable JSON.
    Error(String),
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow, default)]
    choices: Vec<ChoiceChunk<'a>>,
    #[serde(default)]
    usage: Option<ResponseUsage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct ChoiceChunk<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
}

/// `usage` of a response: a stream's last chunk, or a whole non-streamed body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct ResponseUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// `prompt_tokens_details.cached_tokens`, when the engine reports it.
    #[serde(default, deserialize_with = "cached_tokens")]
    #[serde(rename = "prompt_tokens_details")]
    pub cached_tokens: Option<u64>,
}

/// Reads `{"cached_tokens": n}` (or `null`) as `Some(n)` (or `None`).
fn cached_tokens<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    struct Details {
        #[serde(default)]
        cached_tokens: Option<u64>,
    }
    Ok(Option::<Details>::deserialize(d)?.and_then(|d| d.cached_tokens))
}

/// Accumulates bytes and yields complete events.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    /// Bytes of `buf` already scanned for a terminator without finding one.
    scanned: usize,
}

impl SseParser {
    /// A parser with an empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; appends every completed event to `out`. `keep_text` decides whether
    /// content text is copied out (only the chat workload needs it).
    pub fn feed(&mut self, bytes: &[u8], keep_text: bool, out: &mut Vec<SseEvent>) {
        self.buf.extend_from_slice(bytes);
        loop {
            let from = self.scanned.saturating_sub(3);
            let Some((end, sep)) = find_terminator(&self.buf[from..]).map(|(i, l)| (from + i, l))
            else {
                self.scanned = self.buf.len();
                return;
            };
            let event: Vec<u8> = self.buf.drain(..end + sep).collect();
            self.scanned = 0;
            if let Some(ev) = parse_event(&event[..end], keep_text) {
                out.push(ev);
            }
        }
    }

    /// Whether bytes of an unfinished event remain.
    pub fn has_partial(&self) -> bool {
        self.buf.iter().any(|b| !b.is_ascii_whitespace())
    }
}

fn find_terminator(b: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < b.len() {
        if b[i] == b'\n' {
            if b[i + 1] == b'\n' {
                return Some((i, 2));
            }
            if b[i + 1] == b'\r' && b.get(i + 2) == Some(&b'\n') {
                return Some((i, 3));
            }
        }
        i += 1;
    }
    None
}

fn parse_event(raw: &[u8], keep_text: bool) -> Option<SseEvent> {
    // Concatenate the data lines of the event (SSE allows several).
    let mut data: Vec<u8> = Vec::new();
    for line in raw.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(rest) = line.strip_prefix(b"data:") {
            let rest = rest.strip_prefix(b" ").unwrap_or(rest);
            if !data.is_empty() {
                data.push(b'\n');
            }
            data.extend_from_slice(rest);
        }
    }
    if data.is_empty() {
        return None; // comment or keep-alive
    }
    if data == b"[DONE]" {
        return Some(SseEvent::Done);
    }
    let chunk: Chunk<'_> = match serde_json::from_slice(&data) {
        Ok(c) => c,
        Err(e) => return Some(SseEvent::Error(format!("bad SSE chunk: {e}"))),
    };
    if let Some(err) = chunk.error {
        return Some(SseEvent::Error(err.to_string()));
    }
    let mut text: Option<Cow<'_, str>> = None;
    for c in chunk.choices {
        let t = c.text.or(c.delta.and_then(|d| d.content));
        if let Some(t) = t.filter(|t| !t.is_empty()) {
            text = Some(match text {
                None => t,
                Some(prev) => Cow::Owned(format!("{prev}{t}")),
            });
        }
    }
    match (text, chunk.usage) {
        (Some(t), _) => Some(SseEvent::Content(if keep_text {
            t.into_owned()
        } else {
            String::new()
        })),
        (None, Some(u)) => Some(SseEvent::Usage(u)),
        (None, None) => Some(SseEvent::Empty),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere_parse_the_same() {
        let stream = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"text\":\" ab\"}],\"usage\":null}\r\n\r\n",
            ": keep-alive\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"cd\"}}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n",
            "data: [DONE]\n\n"
        );
        let expected = vec![
            SseEvent::Empty,
            SseEvent::Content(" ab".into()),
            SseEvent::Content("cd".into()),
            SseEvent::Usage(ResponseUsage {
                prompt_tokens: 3,
                completion_tokens: 2,
                cached_tokens: None,
            }),
            SseEvent::Done,
        ];
        for step in 1..stream.len() {
            let mut p = SseParser::new();
            let mut out = Vec::new();
            for piece in stream.as_bytes().chunks(step) {
                p.feed(piece, true, &mut out);
            }
            assert_eq!(out, expected, "split every {step} bytes");
            assert!(!p.has_partial());
        }
    }

    #[test]
    fn usage_carries_cached_tokens_when_reported() {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        p.feed(
            concat!(
                "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,",
                "\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n",
                "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,",
                "\"prompt_tokens_details\":null}}\n\n",
            )
            .as_bytes(),
            false,
            &mut out,
        );
        let cached: Vec<_> = out
            .iter()
            .map(|e| match e {
                SseEvent::Usage(u) => u.cached_tokens,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(cached, vec![Some(8), None]);
    }

    #[test]
    fn garbage_is_an_error_event() {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        p.feed(
            b"data: {nope\n\ndata: {\"error\":{\"message\":\"x\"}}\n\n",
            false,
            &mut out,
        );
        assert!(matches!(out[0], SseEvent::Error(_)));
        assert!(matches!(out[1], SseEvent::Error(_)));
    }
}
