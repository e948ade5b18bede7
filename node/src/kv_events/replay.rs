//! Asking vLLM's replay socket for batches the subscription missed.
//!
//! vLLM binds a ROUTER; a DEALER sends `['', start_seq (8 bytes big-endian)]` (the empty
//! delimiter makes it look like a REQ, which both vLLM and the mock accept) and receives, per
//! buffered batch from `start_seq` on, `['', topic, seq, payload]` (older vLLM: no topic), then
//! an end marker whose seq is `u64::MAX`.

use bytes::Bytes;
use std::time::Duration;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// Sequence number of the end-of-replay marker.
const END_SEQ: u64 = u64::MAX;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("replay endpoint {endpoint}: {source}")]
    Socket {
        endpoint: String,
        source: zeromq::ZmqError,
    },
    #[error("replay did not finish within {0:?}")]
    Timeout(Duration),
    #[error("replay answered a malformed message ({0} frames)")]
    Malformed(usize),
}

/// Batches `from..to` as `(seq, payload)`, in order, as far as the publisher still buffers
/// them; the whole exchange is bounded by `within`. What arrived before an error or the
/// deadline is returned with it: a long replay cut short still recovers its first batches.
pub async fn replay(
    endpoint: &str,
    from: u64,
    to: u64,
    within: Duration,
) -> (Vec<(u64, Bytes)>, Result<(), ReplayError>) {
    let mut batches = Vec::new();
    let socket_error = |source| ReplayError::Socket {
        endpoint: endpoint.to_owned(),
        source,
    };
    let exchange = async {
        let mut dealer = DealerSocket::new();
        dealer.connect(endpoint).await.map_err(socket_error)?;
        let mut request = ZmqMessage::from(Bytes::new());
        request.push_back(Bytes::copy_from_slice(&from.to_be_bytes()));
        dealer.send(request).await.map_err(socket_error)?;
        loop {
            let frames = dealer.recv().await.map_err(socket_error)?.into_vec();
            let (seq, payload) = parse_reply(&frames)?;
            if seq == END_SEQ {
                return Ok(());
            }
            if (from..to).contains(&seq) {
                batches.push((seq, payload));
            }
        }
    };
    let outcome = tokio::time::timeout(within, exchange)
        .await
        .unwrap_or(Err(ReplayError::Timeout(within)));
    (batches, outcome)
}

/// `['', topic, seq, payload]` or `['', seq, payload]`, the delimiter optional: the last two
/// frames are what matters (a topic may itself be empty).
fn parse_reply(frames: &[Bytes]) -> Result<(u64, Bytes), ReplayError> {
    let [.., seq, payload] = frames else {
        return Err(ReplayError::Malformed(frames.len()));
    };
    let seq: [u8; 8] = seq[..]
        .try_into()
        .map_err(|_| ReplayError::Malformed(frames.len()))?;
    Ok((u64::from_be_bytes(seq), payload.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(bytes: &[u8]) -> Bytes {
        Bytes::copy_from_slice(bytes)
    }

    /// A publisher that answers batches 3 and 4 of a replay, then hangs without its end marker.
    async fn hanging_publisher() -> (String, tokio::task::JoinHandle<()>) {
        use zeromq::RouterSocket;
        let mut router = RouterSocket::new();
        let endpoint = router.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
        let server = tokio::spawn(async move {
            let mut envelope = router.recv().await.unwrap().into_vec();
            envelope.pop(); // the start seq
            for seq in [3u64, 4] {
                let mut reply = ZmqMessage::from(envelope[0].clone());
                for frame in &envelope[1..] {
                    reply.push_back(frame.clone());
                }
                reply.push_back(b(b"topic"));
                reply.push_back(b(&seq.to_be_bytes()));
                reply.push_back(b(b"payload"));
                router.send(reply).await.unwrap();
            }
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        (endpoint, server)
    }

    #[tokio::test]
    async fn a_replay_cut_short_keeps_the_batches_that_arrived() {
        let (endpoint, server) = hanging_publisher().await;
        let (batches, outcome) = replay(&endpoint, 3, 10, Duration::from_secs(2)).await;
        server.abort();
        let seqs: Vec<u64> = batches.iter().map(|(seq, _)| *seq).collect();
        assert_eq!(seqs, [3, 4]);
        assert!(
            matches!(outcome, Err(ReplayError::Timeout(_))),
            "{outcome:?}"
        );
    }

    #[test]
    fn both_reply_shapes_with_or_without_delimiter() {
        let seq = 5u64.to_be_bytes();
        let new = [b(b""), b(b"kv-events"), b(&seq), b(b"p")];
        let old = [b(b""), b(&seq), b(b"p")];
        let bare = [b(&seq), b(b"p")];
        for frames in [&new[..], &old[..], &bare[..]] {
            assert_eq!(parse_reply(frames).unwrap(), (5, b(b"p")));
        }
        let end = [b(b""), b(b"kv-events"), b(&END_SEQ.to_be_bytes()), b(b"")];
        assert_eq!(parse_reply(&end).unwrap(), (END_SEQ, b(b"")));
        assert!(parse_reply(&[b(b"short"), b(b"p")]).is_err());
        assert!(parse_reply(&[b(b"")]).is_err());
        assert!(parse_reply(&[]).is_err());
    }
}
