//! Reading Server-Sent Events from a streamed response, and checking OpenAI's stream framing.

use std::io::{self, BufRead, BufReader};
use std::time::{Duration, Instant};

use crate::http::OpenResponse;

/// One event: its `data:` lines joined with `\n`, and its `event:` name if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// Events read one at a time from an open response; the raw bytes are kept for framing checks.
pub struct SseReader {
    body: BufReader<OpenResponse>,
    raw: Vec<u8>,
    started: Instant,
    first_event_after: Option<Duration>,
}

impl SseReader {
    pub fn new(response: OpenResponse) -> Self {
        SseReader {
            body: BufReader::new(response),
            raw: Vec::new(),
            started: Instant::now(),
            first_event_after: None,
        }
    }

    /// The next event, `None` at a clean end of stream. A stream that ends inside an event is
    /// an error: the framing was broken.
    pub fn next_event(&mut self) -> io::Result<Option<SseEvent>> {
        let mut event = None;
        let mut data: Option<String> = None;
        let mut line = Vec::new();
        loop {
            line.clear();
            let read = self.body.read_until(b'\n', &mut line)?;
            self.raw.extend_from_slice(&line);
            if read == 0 {
                return match data {
                    None => Ok(None),
                    Some(data) => Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("stream ended inside an event (data {data:?})"),
                    )),
                };
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches(['\r', '\n']);
            if text.is_empty() {
                if let Some(data) = data.take() {
                    self.first_event_after
                        .get_or_insert_with(|| self.started.elapsed());
                    return Ok(Some(SseEvent { event, data }));
                }
                continue;
            }
            if text.starts_with(':') {
                continue; // a comment (keep-alive)
            }
            let (field, value) = text.split_once(':').unwrap_or((text, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "data" => match &mut data {
                    Some(existing) => {
                        existing.push('\n');
                        existing.push_str(value);
                    }
                    None => data = Some(value.to_string()),
                },
                "event" => event = Some(value.to_string()),
                _ => {} // id, retry and unknown fields do not matter here
            }
        }
    }

    /// Reads every remaining event up to the end of the stream.
    pub fn read_to_end(mut self) -> io::Result<SseTranscript> {
        let mut events = Vec::new();
        while let Some(event) = self.next_event()? {
            events.push(event);
        }
        Ok(SseTranscript {
            events,
            raw: String::from_utf8_lossy(&self.raw).into_owned(),
        })
    }

    /// Time from the creation of this reader to the first complete event.
    pub fn first_event_after(&self) -> Option<Duration> {
        self.first_event_after
    }
}

/// A whole stream: its events and its raw text.
#[derive(Debug, Clone)]
pub struct SseTranscript {
    pub events: Vec<SseEvent>,
    pub raw: String,
}

impl SseTranscript {
    /// Checks OpenAI's framing: at least one JSON chunk of `object`, every event but the last a
    /// JSON object with no error, the last exactly `data: [DONE]`, and nothing after it.
    /// Returns the JSON chunks, or what is wrong.
    pub fn check_openai_stream(&self, object: &str) -> Result<Vec<serde_json::Value>, String> {
        let Some((last, chunks)) = self.events.split_last() else {
            return Err(format!("empty event stream; raw: {:?}", self.raw));
        };
        if last.data != "[DONE]" {
            return Err(format!(
                "the stream must end with data: [DONE]; raw: {:?}",
                self.raw
            ));
        }
        if !(self.raw.ends_with("data: [DONE]\n\n") || self.raw.ends_with("data: [DONE]\r\n\r\n")) {
            return Err(format!("bytes after the [DONE] event; raw: {:?}", self.raw));
        }
        if chunks.is_empty() {
            return Err(format!("no chunk before [DONE]; raw: {:?}", self.raw));
        }
        chunks
            .iter()
            .map(|event| {
                let chunk: serde_json::Value = serde_json::from_str(&event.data)
                    .map_err(|error| format!("event is not JSON ({error}): {:?}", event.data))?;
                if chunk.get("error").is_some() {
                    return Err(format!("error event in the stream: {}", event.data));
                }
                if chunk["object"] != object {
                    return Err(format!("expected a chunk of {object}: {}", event.data));
                }
                Ok(chunk)
            })
            .collect()
    }

    /// [`Self::check_openai_stream`], panicking on a broken stream.
    pub fn assert_openai_stream(&self, object: &str) -> Vec<serde_json::Value> {
        self.check_openai_stream(object)
            .unwrap_or_else(|problem| panic!("{problem}"))
    }
}
