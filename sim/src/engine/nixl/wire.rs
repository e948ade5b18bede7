//! The side channel's wire format: one JSON request line, one JSON reply line, per TCP
//! connection.
//!
//! vLLM's NixlConnector uses a ZMQ side channel for the handshake and NIXL notifications for
//! the rest (read completion, abort, heartbeats); the mock folds all of them into this one
//! small protocol. A connection per exchange keeps both ends trivial: a dead peer is a refused
//! connection or an early end of file, never a stale pooled socket.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Longest accepted line (a read names every block of a prompt: 8,192 blocks fit in ~60 kB).
pub const MAX_LINE: u64 = 4 * 1024 * 1024;

/// What a decode engine asks of a prefill engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum SideRequest {
    /// First contact: exchange agent metadata (vLLM's `GET_META_MSG`). `engine_id` is the id
    /// the decode engine expects to reach.
    Handshake {
        /// Expected engine id.
        engine_id: String,
    },
    /// Post a read of leased blocks (the NIXL READ).
    Read {
        /// Expected engine id.
        engine_id: String,
        /// The prefill leg's internal id (`remote_request_id`).
        request_id: String,
        /// The blocks to read, a suffix of the leased ones.
        block_ids: Vec<u32>,
    },
    /// The read completed: the blocks may be freed (vLLM's read notification).
    Done {
        /// Expected engine id.
        engine_id: String,
        /// The prefill leg's internal id.
        request_id: String,
    },
    /// The decode leg ended before reading: free the blocks (vLLM's abort notification).
    Abort {
        /// Expected engine id.
        engine_id: String,
        /// The prefill leg's internal id.
        request_id: String,
    },
    /// Keep these leases alive (vLLM's batched `HB:` notification).
    Heartbeat {
        /// Expected engine id.
        engine_id: String,
        /// Internal ids of the prefill legs.
        request_ids: Vec<String>,
    },
}

/// A prefill engine's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SideReply {
    /// Whether the request was honoured.
    pub ok: bool,
    /// Why not, when `ok` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The prefill engine's id (handshake).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_id: Option<String>,
    /// Tokens per block of the prefill engine (handshake; must match the decode engine's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    /// Leases renewed (heartbeat).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed: Option<usize>,
}

impl SideReply {
    /// A plain success.
    pub fn ok() -> Self {
        Self {
            ok: true,
            ..Self::default()
        }
    }

    /// A refusal saying why.
    pub fn refused(error: impl Into<String>) -> Self {
        Self {
            ok: false,
            error: Some(error.into()),
            ..Self::default()
        }
    }
}

/// Why an exchange with a prefill engine failed.
#[derive(Debug, thiserror::Error)]
pub enum SideError {
    /// Connecting, writing or reading failed (the engine is gone, or hung up).
    #[error("side channel {addr}: {source}")]
    Io {
        /// The peer.
        addr: String,
        /// The failure.
        source: std::io::Error,
    },
    /// No answer in time.
    #[error("side channel {addr}: no answer within {timeout:?}")]
    Timeout {
        /// The peer.
        addr: String,
        /// The bound.
        timeout: Duration,
    },
    /// The answer was not a reply line.
    #[error("side channel {addr}: bad reply: {detail}")]
    BadReply {
        /// The peer.
        addr: String,
        /// What was wrong.
        detail: String,
    },
    /// The prefill engine refused.
    #[error("side channel {addr}: refused: {reason}")]
    Refused {
        /// The peer.
        addr: String,
        /// Its reason.
        reason: String,
    },
}

/// Sends `req` to the side channel at `host:port` and returns the reply, refusals as
/// [`SideError::Refused`]. `timeout` bounds the whole exchange; `None` waits as long as the
/// peer keeps the connection open (a posted read may legitimately take long).
pub async fn exchange(
    host: &str,
    port: u16,
    req: &SideRequest,
    timeout: Option<Duration>,
) -> Result<SideReply, SideError> {
    let addr = format!("{host}:{port}");
    let run = async {
        let io = |source| SideError::Io {
            addr: addr.clone(),
            source,
        };
        let stream = TcpStream::connect((host, port)).await.map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        let mut stream = BufReader::new(stream);
        let mut line = serde_json::to_vec(req).expect("plain enum serializes");
        line.push(b'\n');
        stream.get_mut().write_all(&line).await.map_err(io)?;
        let text = read_line(&mut stream).await.map_err(io)?;
        let reply: SideReply = serde_json::from_str(&text).map_err(|e| SideError::BadReply {
            addr: addr.clone(),
            detail: e.to_string(),
        })?;
        if reply.ok {
            Ok(reply)
        } else {
            Err(SideError::Refused {
                addr: addr.clone(),
                reason: reply.error.unwrap_or_default(),
            })
        }
    };
    match timeout {
        None => run.await,
        Some(t) => match tokio::time::timeout(t, run).await {
            Ok(result) => result,
            Err(_) => Err(SideError::Timeout { addr, timeout: t }),
        },
    }
}

/// Reads one line (at most [`MAX_LINE`] bytes); an empty stream is an error.
pub async fn read_line<R: tokio::io::AsyncRead + Unpin>(
    stream: &mut BufReader<R>,
) -> std::io::Result<String> {
    let mut text = String::new();
    let n = (&mut *stream).take(MAX_LINE).read_line(&mut text).await?;
    if n == 0 || !text.ends_with('\n') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the peer closed the connection before a whole line",
        ));
    }
    Ok(text)
}

/// Writes one reply line.
pub async fn write_reply(stream: &mut TcpStream, reply: &SideReply) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(reply).expect("plain struct serializes");
    line.push(b'\n');
    stream.write_all(&line).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_tagged_json_lines() {
        let r = SideRequest::Read {
            engine_id: "e".into(),
            request_id: "r".into(),
            block_ids: vec![1, 2],
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(
            text,
            r#"{"op":"read","engine_id":"e","request_id":"r","block_ids":[1,2]}"#
        );
        assert_eq!(serde_json::from_str::<SideRequest>(&text).unwrap(), r);
        assert!(serde_json::from_str::<SideRequest>(r#"{"op":"launch"}"#).is_err());
        let refused = serde_json::to_string(&SideReply::refused("no")).unwrap();
        assert_eq!(refused, r#"{"ok":false,"error":"no"}"#);
    }
}
