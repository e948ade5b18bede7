//! `FrameDecoder`: the bytes of a forwarding stream, from the entry (request head and body) or
//! from the serving peer (response head, body, error), as QUIC delivers them.
//!
//! Input: `[n: u8][n chunk sizes][stream]` (n taken modulo 16). The stream is decoded twice:
//! pushed whole, and pushed in chunks of the given sizes (cycled; 0 pushes an empty slice; no
//! sizes, or only zeros, push it whole), draining
//! frames after every push as the node does. Checks:
//! - the decoder is incremental: both ways yield the same frames, the same error, and the same
//!   verdict at the end of the stream;
//! - every frame it yields round-trips (encode, decode alone: the same frame, nothing left).

use crate::samples;
use bytes::BytesMut;
use kvmesh_protocol::wire::{Frame, FrameDecoder, FrameError};

/// What decoding one stream came to.
#[derive(Debug, PartialEq)]
struct Decoded {
    frames: Vec<Frame>,
    /// The error that ended the stream, if one did.
    error: Option<FrameError>,
    /// `finish()` once the stream ended without an error.
    finish: Option<Result<(), FrameError>>,
}

pub fn run(data: &[u8]) {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let (mut sizes, stream) = rest.split_at(usize::from(n % 16).min(rest.len()));
    if sizes.iter().all(|&s| s == 0) {
        // Only empty pushes would never get through the stream.
        sizes = &[];
    }
    let whole = decode(stream, &[]);
    let chunked = decode(stream, sizes);
    assert_eq!(whole, chunked, "chunk sizes {sizes:?} changed the outcome");
    for frame in &whole.frames {
        let mut decoder = FrameDecoder::new();
        decoder.push(&frame.encode());
        assert_eq!(decoder.next_frame().as_ref(), Ok(&Some(frame.clone())));
        assert_eq!(decoder.next_frame(), Ok(None));
        assert_eq!(decoder.finish(), Ok(()));
    }
}

fn decode(stream: &[u8], sizes: &[u8]) -> Decoded {
    let mut decoder = FrameDecoder::new();
    let mut out = Decoded {
        frames: Vec::new(),
        error: None,
        finish: None,
    };
    let mut rest = stream;
    let mut sizes = sizes.iter().cycle();
    // At least one push, so that an empty stream is decoded too.
    loop {
        let take = sizes
            .next()
            .map_or(rest.len(), |&s| usize::from(s))
            .min(rest.len());
        let (chunk, tail) = rest.split_at(take);
        rest = tail;
        decoder.push(chunk);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => out.frames.push(frame),
                Ok(None) => break,
                Err(error) => {
                    out.error = Some(error);
                    return out;
                }
            }
        }
        if rest.is_empty() {
            out.finish = Some(decoder.finish());
            return out;
        }
    }
}

pub fn seeds() -> Vec<Vec<u8>> {
    let encode = |frames: &[Frame]| {
        let mut out = BytesMut::new();
        frames.iter().for_each(|f| f.encode_into(&mut out));
        out.to_vec()
    };
    let mut streams = Vec::new();
    // Entry → server: a head and the body.
    for head in samples::request_heads() {
        let mut frames = vec![Frame::RequestHead(head)];
        frames.extend(Frame::data_frames(samples::CHAT_BODY.into()));
        streams.push(encode(&frames));
    }
    // Server → entry: a streamed answer, a refusal, an answer cut short.
    let responses = samples::response_heads();
    let errors = samples::wire_errors();
    let mut streamed = vec![Frame::ResponseHead(responses[0].clone())];
    streamed.extend(samples::SSE_CHUNKS.map(|c| Frame::Data(c.into())));
    streams.push(encode(&streamed));
    streams.push(encode(&[Frame::Error(errors[0].clone())]));
    streams.push(encode(&[
        Frame::ResponseHead(responses[1].clone()),
        Frame::Data(samples::SSE_CHUNKS[0].into()),
        Frame::Error(errors[1].clone()),
    ]));
    // Pushed whole, then in small uneven chunks (a QUIC read may split a frame anywhere).
    let chunkings: [&[u8]; 2] = [&[], &[3, 1, 7, 0]];
    streams
        .iter()
        .zip(chunkings.iter().cycle())
        .map(|(stream, sizes)| {
            let mut input = vec![sizes.len() as u8];
            input.extend_from_slice(sizes);
            input.extend_from_slice(stream);
            input
        })
        .collect()
}
