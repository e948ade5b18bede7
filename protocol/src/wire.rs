//! Messages sidecars exchange on a forwarding stream, and their framing.
//!
//! A forwarded request is one QUIC bidirectional stream. The entry sends a [`RequestHead`]
//! frame, the body as [`Frame::Data`] frames, and finishes its side. The serving peer answers
//! with a [`ResponseHead`], the body as data frames as the engine produces them (SSE chunks are
//! relayed untouched), and either finishes or sends a [`WireError`] first.
//!
//! Frame: `[length: u32 big-endian][tag: u8][payload]`, where `length` counts tag and payload.
//! Head and error payloads are [`crate::codec`] envelopes (format version, kind, rkyv archive)
//! and are validated before use; data payloads are raw bytes. [`FrameDecoder`] is sans-IO:
//! feed it bytes as they arrive and pull whole frames.

use crate::codec::{self, DecodeError, Kind};
use crate::lifecycle::{Admission, Attempt, LoadReport, PrefixSample, validate_samples};
use crate::route::RouteReason;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use rkyv::{Archive, Deserialize, Serialize};

/// Most hops a request may take between sidecars: entry → server, never further.
pub const MAX_HOPS: u8 = 1;
/// Largest head or error frame accepted (headers are bounded; bodies travel as data frames).
pub const MAX_HEAD_FRAME: usize = 64 * 1024;
/// Largest data frame accepted; senders split larger chunks.
pub const MAX_DATA_FRAME: usize = 1024 * 1024;
const MAX_HEADERS: usize = 128;

/// The head of a forwarded request.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct RequestHead {
    pub request_id: String,
    /// Sidecar-to-sidecar hops so far, including this one.
    pub hop_count: u8,
    /// Absolute deadline, milliseconds since the Unix epoch (0 = none).
    pub deadline_unix_ms: u64,
    pub model: String,
    pub method: String,
    /// Path and query, e.g. `/v1/chat/completions`.
    pub path: String,
    /// The client headers the engine should see (content type, request id, ...).
    pub headers: Vec<(String, String)>,
    pub reason: RouteReason,
    /// The entry sidecar's node id, for tracing.
    pub entry_node: String,
    /// The key copies of the prompt's new prefix share
    /// ([`crate::lifecycle::prefix_key`]), if the prompt has a block.
    pub prefix_key: Option<u64>,
    /// No engine held the first block at the entry's decision (a new prefix): the serving node
    /// counts its uncached prefill until the first byte comes back.
    pub new_prefix: bool,
    /// Prompt tokens the entry expects the serving engine to compute (the prompt less what
    /// it believed cached there): what the serving node counts in its queue.
    pub prefill_tokens: u32,
    /// The serving node may decline the request ([`WireErrorCode::Busy`]) when its engine
    /// would prefill more prompt tokens than this up to the request's first token: the
    /// entry's estimate of that work at the next candidate (see [`crate::lifecycle`]). Never
    /// set on a request's last attempt.
    pub decline_above_tokens: Option<u32>,
    /// The answer's first byte ends the request's prefill: the client asked for a streamed
    /// answer, or this is a disaggregated request's one-token prefill leg.
    pub streamed: bool,
    /// A new prefix's sampled block hashes ([`crate::lifecycle::prefix_samples`]), by which
    /// the serving node tells how much of it an earlier copy there covers; empty otherwise.
    pub prefix_samples: Vec<PrefixSample>,
}

impl RequestHead {
    /// Takes what `attempt` tells its serving node: why it goes there and what the node
    /// admits it by (the reason, the new prefix's key, the prefill it counts, the bound).
    pub fn carry(&mut self, attempt: &Attempt) {
        self.reason = attempt.reason;
        self.prefix_key = attempt.prefix_key;
        self.new_prefix = attempt.new_prefix;
        self.prefill_tokens = attempt.prefill_tokens;
        self.decline_above_tokens = attempt.decline_above_tokens;
    }

    /// What the serving side admits the request by: [`Attempt::admission`] as it arrives.
    pub fn admission(&self) -> Admission<'_> {
        Admission {
            prefix_key: self.prefix_key,
            new_prefix: self.new_prefix,
            prefill_tokens: self.prefill_tokens,
            decline_above_tokens: self.decline_above_tokens,
            streamed: self.streamed,
            prefix_samples: &self.prefix_samples,
        }
    }
}

/// The head of a forwarded response.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ResponseHead {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// The node whose engine served the request.
    pub served_by: String,
    /// The serving engine's load as its sidecar saw it when the answer started.
    pub load: Option<LoadReport>,
}

/// Why a forwarded request failed on the serving side.
#[derive(Archive, Serialize, Deserialize, Copy, Clone, Debug, PartialEq, Eq)]
#[rkyv(derive(Debug))]
#[repr(u8)]
pub enum WireErrorCode {
    /// The request head was invalid (e.g. too many hops): never retried elsewhere.
    BadRequest,
    /// The engine could not be reached or failed before answering: retry elsewhere.
    EngineUnavailable,
    /// The node is draining or no longer a target: retry elsewhere.
    NotAccepting,
    DeadlineExceeded,
    /// The engine failed after the response started.
    Interrupted,
    Internal,
    /// The node declined the request: its engine's queue was over the head's
    /// `decline_above` (only when the head allowed it). Try the next candidate.
    Busy,
}

#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct WireError {
    pub code: WireErrorCode,
    pub message: String,
    /// The serving engine's load when it declined or failed, if it knows it.
    pub load: Option<LoadReport>,
}

/// One frame of a forwarding stream.
#[derive(Clone, Debug, PartialEq)]
pub enum Frame {
    RequestHead(RequestHead),
    ResponseHead(ResponseHead),
    Data(Bytes),
    Error(WireError),
}

const TAG_REQUEST_HEAD: u8 = 1;
const TAG_RESPONSE_HEAD: u8 = 2;
const TAG_DATA: u8 = 3;
const TAG_ERROR: u8 = 4;

/// Why a stream's bytes were rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the {max}-byte limit for tag {tag}")]
    TooLarge { tag: u8, len: usize, max: usize },
    #[error("empty frame")]
    Empty,
    #[error("unknown frame tag {0}")]
    UnknownTag(u8),
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error("stream ended inside a frame ({0} bytes left over)")]
    Truncated(usize),
}

impl Frame {
    /// Appends this frame's bytes to `out`.
    pub fn encode_into(&self, out: &mut BytesMut) {
        let (tag, payload) = match self {
            Frame::RequestHead(head) => (TAG_REQUEST_HEAD, codec::encode(Kind::RequestHead, head)),
            Frame::ResponseHead(head) => {
                (TAG_RESPONSE_HEAD, codec::encode(Kind::ResponseHead, head))
            }
            Frame::Error(error) => (TAG_ERROR, codec::encode(Kind::WireError, error)),
            Frame::Data(data) => {
                out.reserve(5 + data.len());
                out.put_slice(&Self::data_header(data.len()));
                out.put_slice(data);
                return;
            }
        };
        out.reserve(5 + payload.len());
        out.put_u32(payload.len() as u32 + 1);
        out.put_u8(tag);
        out.put_slice(&payload);
    }

    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        self.encode_into(&mut out);
        out.freeze()
    }

    /// The bytes that precede a data frame's `len` bytes of payload (a peer's decoder accepts
    /// at most [`MAX_DATA_FRAME`]; like `encode_into`, this encodes whatever it is given).
    pub fn data_header(len: usize) -> [u8; 5] {
        let [a, b, c, d] = (len as u32 + 1).to_be_bytes();
        [a, b, c, d, TAG_DATA]
    }

    /// A body's data frames as the pieces a stream carries, each frame's header then its
    /// payload, the payloads being slices of `body`: a sender that writes the pieces as they
    /// are (QUIC streams keep `Bytes` without copying) never copies the body into a frame.
    /// The bytes are those of [`Frame::data_frames`] encoded one after another.
    pub fn data_pieces(body: Bytes) -> impl Iterator<Item = Bytes> {
        let mut rest = body;
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            let payload = rest.split_to(rest.len().min(MAX_DATA_FRAME));
            let header = Bytes::copy_from_slice(&Self::data_header(payload.len()));
            Some([header, payload])
        })
        .flatten()
    }

    /// Frames for a body, split to the data frame limit.
    pub fn data_frames(body: Bytes) -> impl Iterator<Item = Frame> {
        let mut rest = body;
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            let take = rest.len().min(MAX_DATA_FRAME);
            Some(Frame::Data(rest.split_to(take)))
        })
    }
}

/// Bytes of a frame the decoder buffers before it reserves room for the rest of it.
const RESERVE_AFTER: usize = 64 * 1024;

/// Incremental frame decoder: push bytes as they arrive, pull whole, validated frames.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buffer: BytesMut,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next whole frame, `None` if more bytes are needed, or an error after which the
    /// stream must be abandoned.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buffer.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([
            self.buffer[0],
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
        ]) as usize;
        let tag = self.buffer[4];
        if len == 0 {
            return Err(FrameError::Empty);
        }
        let max = if tag == TAG_DATA {
            MAX_DATA_FRAME
        } else {
            MAX_HEAD_FRAME
        };
        if len - 1 > max {
            return Err(FrameError::TooLarge {
                tag,
                len: len - 1,
                max,
            });
        }
        if self.buffer.len() < 4 + len {
            // Room for the rest of the frame in one step when its first RESERVE_AFTER bytes
            // are in: a large body arriving a packet at a time is then copied once more, not
            // at every doubling of the buffer. Not at the header: a peer could then make this
            // node reserve MAX_DATA_FRAME per stream for five bytes each.
            if self.buffer.len() >= RESERVE_AFTER {
                self.buffer.reserve(4 + len - self.buffer.len());
            }
            return Ok(None);
        }
        self.buffer.advance(5);
        let payload = self.buffer.split_to(len - 1).freeze();
        let frame = match tag {
            TAG_DATA => Frame::Data(payload),
            TAG_REQUEST_HEAD => {
                let head: RequestHead = codec::decode(Kind::RequestHead, &payload)?;
                validate_request_head(&head)?;
                Frame::RequestHead(head)
            }
            TAG_RESPONSE_HEAD => {
                let head: ResponseHead = codec::decode(Kind::ResponseHead, &payload)?;
                if !(100..=599).contains(&head.status) || head.headers.len() > MAX_HEADERS {
                    return Err(DecodeError::Semantic("invalid response head".into()).into());
                }
                validate_load(head.load.as_ref())?;
                Frame::ResponseHead(head)
            }
            TAG_ERROR => {
                let error: WireError = codec::decode(Kind::WireError, &payload)?;
                validate_load(error.load.as_ref())?;
                Frame::Error(error)
            }
            other => return Err(FrameError::UnknownTag(other)),
        };
        Ok(Some(frame))
    }

    /// Call when the stream ended: an error if it ended inside a frame.
    pub fn finish(&self) -> Result<(), FrameError> {
        match self.buffer.len() {
            0 => Ok(()),
            n => Err(FrameError::Truncated(n)),
        }
    }
}

fn validate_load(load: Option<&LoadReport>) -> Result<(), DecodeError> {
    match load.map(LoadReport::validate) {
        Some(Err(why)) => Err(DecodeError::Semantic(format!("load report: {why}"))),
        _ => Ok(()),
    }
}

fn validate_request_head(head: &RequestHead) -> Result<(), DecodeError> {
    let bad = |why: &str| Err(DecodeError::Semantic(why.into()));
    if !head.path.starts_with('/') {
        return bad("path must start with '/'");
    }
    if head.headers.len() > MAX_HEADERS {
        return bad("too many headers");
    }
    if head.method.is_empty() || head.method.len() > 16 {
        return bad("invalid method");
    }
    if let Err(why) = validate_samples(&head.prefix_samples) {
        return bad(&why);
    }
    Ok(())
}

#[cfg(test)]
pub(crate) fn sample_request_head() -> RequestHead {
    RequestHead {
        request_id: "req-1".into(),
        hop_count: 1,
        deadline_unix_ms: 1_790_000_000_000,
        model: "m".into(),
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        headers: vec![("content-type".into(), "application/json".into())],
        reason: RouteReason::PrefixHit,
        entry_node: "a".into(),
        prefix_key: Some(42),
        new_prefix: true,
        prefill_tokens: 2_048,
        decline_above_tokens: Some(300),
        streamed: true,
        prefix_samples: vec![
            PrefixSample {
                tokens: 16,
                hash: 7,
            },
            PrefixSample {
                tokens: 32,
                hash: 8,
            },
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::MAX_PREFIX_SAMPLES;

    #[test]
    fn a_stream_of_frames_decodes_byte_by_byte() {
        let frames = vec![
            Frame::RequestHead(sample_request_head()),
            Frame::Data(Bytes::from_static(b"{\"model\":\"m\"}")),
            Frame::ResponseHead(ResponseHead {
                status: 200,
                headers: vec![("content-type".into(), "text/event-stream".into())],
                served_by: "b".into(),
                load: None,
            }),
            Frame::Error(WireError {
                code: WireErrorCode::Interrupted,
                message: "gone".into(),
                load: None,
            }),
        ];
        let mut bytes = BytesMut::new();
        frames.iter().for_each(|f| f.encode_into(&mut bytes));
        let mut decoder = FrameDecoder::new();
        let mut decoded = Vec::new();
        for byte in bytes.iter() {
            decoder.push(&[*byte]);
            while let Some(frame) = decoder.next_frame().unwrap() {
                decoded.push(frame);
            }
        }
        assert_eq!(decoded, frames);
        assert!(decoder.finish().is_ok());
    }

    #[test]
    fn a_bare_header_reserves_nothing_until_the_frame_has_bytes() {
        let mut decoder = FrameDecoder::new();
        let len = MAX_DATA_FRAME as u32 + 1;
        let mut header = len.to_be_bytes().to_vec();
        header.push(TAG_DATA);
        decoder.push(&header);
        assert_eq!(decoder.next_frame().unwrap(), None);
        assert!(
            decoder.buffer.capacity() < RESERVE_AFTER,
            "reserved at the header"
        );
        decoder.push(&vec![7; RESERVE_AFTER]);
        assert_eq!(decoder.next_frame().unwrap(), None);
        assert!(
            decoder.buffer.capacity() >= 4 + len as usize,
            "the rest is reserved"
        );
        decoder.push(&vec![7; MAX_DATA_FRAME - RESERVE_AFTER]);
        let frame = decoder.next_frame().unwrap().expect("a whole frame");
        assert!(matches!(frame, Frame::Data(body) if body.len() == MAX_DATA_FRAME));
    }

    #[test]
    fn oversized_and_unknown_frames_are_rejected() {
        let mut decoder = FrameDecoder::new();
        decoder.push(&[0, 0x10, 0, 0, TAG_REQUEST_HEAD]);
        assert!(matches!(
            decoder.next_frame(),
            Err(FrameError::TooLarge { .. })
        ));
        let mut decoder = FrameDecoder::new();
        decoder.push(&[0, 0, 0, 1, 9]);
        assert_eq!(decoder.next_frame(), Err(FrameError::UnknownTag(9)));
        let mut decoder = FrameDecoder::new();
        decoder.push(&[0, 0, 0, 9, TAG_DATA, 1]);
        assert_eq!(decoder.next_frame(), Ok(None));
        assert_eq!(decoder.finish(), Err(FrameError::Truncated(6)));
    }

    #[test]
    fn a_head_with_too_many_prefix_samples_is_rejected() {
        let mut head = sample_request_head();
        head.prefix_samples = vec![PrefixSample { tokens: 1, hash: 1 }; MAX_PREFIX_SAMPLES + 1];
        let mut decoder = FrameDecoder::new();
        decoder.push(&Frame::RequestHead(head).encode());
        assert!(matches!(
            decoder.next_frame(),
            Err(FrameError::Decode(DecodeError::Semantic(_)))
        ));
    }

    #[test]
    fn a_serving_node_admits_a_request_by_what_its_attempt_said() {
        // The simulator admits by `Attempt::admission`; the node by the head that crossed
        // the wire. Every carried field differs from the sample head's.
        let attempt = Attempt {
            candidate: 3,
            node_key: 9,
            reason: RouteReason::LoadSpill,
            prefill_tokens: 512,
            decline_above_tokens: None,
            prefix_key: Some(77),
            new_prefix: false,
        };
        let mut head = sample_request_head();
        head.carry(&attempt);
        let mut decoder = FrameDecoder::new();
        decoder.push(&Frame::RequestHead(head.clone()).encode());
        let Ok(Some(Frame::RequestHead(arrived))) = decoder.next_frame() else {
            panic!("the head did not decode");
        };
        assert_eq!(arrived.reason, RouteReason::LoadSpill);
        assert_eq!(
            arrived.admission(),
            attempt.admission(head.streamed, &head.prefix_samples)
        );
    }

    #[test]
    fn a_head_with_a_bad_path_is_rejected() {
        let mut head = sample_request_head();
        head.path = "http://elsewhere/".into();
        let mut decoder = FrameDecoder::new();
        decoder.push(&Frame::RequestHead(head).encode());
        assert!(matches!(
            decoder.next_frame(),
            Err(FrameError::Decode(DecodeError::Semantic(_)))
        ));
    }

    #[test]
    fn large_bodies_split_into_bounded_frames() {
        let body = Bytes::from(vec![7u8; MAX_DATA_FRAME * 2 + 5]);
        let sizes: Vec<usize> = Frame::data_frames(body)
            .map(|f| match f {
                Frame::Data(d) => d.len(),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(sizes, vec![MAX_DATA_FRAME, MAX_DATA_FRAME, 5]);
    }

    #[test]
    fn data_pieces_are_the_encoded_data_frames_and_share_the_body() {
        let body = Bytes::from(
            (0..MAX_DATA_FRAME * 2 + 5)
                .map(|i| i as u8)
                .collect::<Vec<_>>(),
        );
        let pieces: Vec<Bytes> = Frame::data_pieces(body.clone()).collect();
        let mut encoded = BytesMut::new();
        for frame in Frame::data_frames(body.clone()) {
            frame.encode_into(&mut encoded);
        }
        assert_eq!(pieces.concat(), encoded.to_vec());
        assert_eq!(pieces.len(), 6);
        // The payloads point into the body: nothing was copied.
        assert_eq!(pieces[1].as_ptr(), body.as_ptr());
        assert_eq!(Frame::data_pieces(Bytes::new()).count(), 0);
        let mut decoder = FrameDecoder::new();
        for piece in &pieces {
            decoder.push(piece);
        }
        let mut decoded = BytesMut::new();
        while let Some(Frame::Data(data)) = decoder.next_frame().unwrap() {
            decoded.extend_from_slice(&data);
        }
        assert_eq!(decoded.freeze(), body);
        assert!(decoder.finish().is_ok());
    }
}
