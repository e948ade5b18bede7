//! The envelope shared by every archived value kvmesh puts on the network or into gossip:
//! `[format version: u8][kind: u8][rkyv archive]`.
//!
//! The version byte lets a future format be introduced deliberately; the kind byte stops a value
//! of one type from ever being validated as another. Decoding copies the bytes into an aligned
//! buffer and validates the archive (bytecheck) before anything is read: a peer is never trusted
//! to send well-formed bytes.

use rkyv::api::high::{HighDeserializer, HighSerializer, HighValidator};
use rkyv::bytecheck::CheckBytes;
use rkyv::rancor;
use rkyv::ser::allocator::ArenaHandle;
use rkyv::util::AlignedVec;
use rkyv::{Archive, Deserialize, Serialize};

/// The current envelope format. Bump on any incompatible change to an archived type.
/// 2: `RequestHead::new_prefix` and `may_decline`, `WireErrorCode::Busy`.
/// 3: late binding: `RequestHead::decline_above` (for `may_decline`) and `streamed`, load reports
/// in `ResponseHead` and `WireError`, `RouteReason::Declined`.
/// 4: the queue judged in prefill work: `RequestHead::prefill_tokens` and
/// `decline_above_tokens` (for `decline_above`).
/// 5: the adapters an engine uses now, `LoadDigest::lora_use`.
/// 6: the queue in prompt tokens, `LoadDigest::queued_tokens` and `LoadReport::queued_tokens`.
/// 7: what copies of a new prefix share, `RequestHead::prefix_samples`.
pub const FORMAT_VERSION: u8 = 7;

/// What an envelope carries; part of the envelope so a value can only decode as its own type.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    LoadDigest = 1,
    SummaryShard = 2,
    RequestHead = 3,
    ResponseHead = 4,
    WireError = 5,
}

/// Why bytes were rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("envelope too short ({0} bytes)")]
    TooShort(usize),
    #[error("unsupported format version {0} (this build speaks {FORMAT_VERSION})")]
    Version(u8),
    #[error("expected a {expected:?} envelope, found kind {found}")]
    WrongKind { expected: Kind, found: u8 },
    #[error("invalid archive: {0}")]
    Invalid(String),
    #[error("invalid value: {0}")]
    Semantic(String),
}

/// Serializes `value` into an envelope of the given kind.
pub fn encode<T>(kind: Kind, value: &T) -> Vec<u8>
where
    T: for<'a> Serialize<HighSerializer<AlignedVec, ArenaHandle<'a>, rancor::Error>>,
{
    // Serializing plain owned data into a growable buffer cannot fail: no shared pointers, no
    // fixed-capacity writer. A failure here is a programming error in a type definition.
    let archive = rkyv::to_bytes::<rancor::Error>(value).expect("archiving owned data");
    let mut out = Vec::with_capacity(archive.len() + 2);
    out.push(FORMAT_VERSION);
    out.push(kind as u8);
    out.extend_from_slice(&archive);
    out
}

/// Validates and deserializes an envelope of the given kind.
pub fn decode<T>(kind: Kind, bytes: &[u8]) -> Result<T, DecodeError>
where
    T: Archive,
    T::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
        + Deserialize<T, HighDeserializer<rancor::Error>>,
{
    let (header, body) = match bytes {
        [version, kind, body @ ..] => ((*version, *kind), body),
        _ => return Err(DecodeError::TooShort(bytes.len())),
    };
    if header.0 != FORMAT_VERSION {
        return Err(DecodeError::Version(header.0));
    }
    if header.1 != kind as u8 {
        return Err(DecodeError::WrongKind {
            expected: kind,
            found: header.1,
        });
    }
    // Network bytes have no alignment guarantee; rkyv needs one.
    let mut aligned = AlignedVec::<16>::with_capacity(body.len());
    aligned.extend_from_slice(body);
    rkyv::from_bytes::<T, rancor::Error>(&aligned)
        .map_err(|e| DecodeError::Invalid(with_offsets(&e.to_string(), aligned.as_ptr() as usize)))
}

/// rkyv's validation errors name addresses in the buffer they checked ("subtree pointer
/// overran range: ptr 0x00007f56cb0216d0 size 32 in range …"). A serving node sends a head's
/// decode error back to the peer that sent it, which must not learn where this process's heap
/// lies, and the same bytes should fail with the same message every time: each address
/// (`0x` and 16 hex digits) becomes its offset from the start of the archive.
fn with_offsets(message: &str, base: usize) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("0x") {
        out.push_str(&rest[..at]);
        let digits = &rest[at + 2..];
        let len = digits.bytes().take_while(u8::is_ascii_hexdigit).count();
        match usize::from_str_radix(&digits[..len], 16) {
            Ok(address) if len == 16 => {
                let offset = address as i128 - base as i128;
                out.push_str(&format!("archive{offset:+}"));
            }
            _ => out.push_str(&rest[at..at + 2 + len]),
        }
        rest = &digits[len..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LoadDigest;

    /// Found by the `wire_frames` fuzz target: the same bytes failed with a different message
    /// each time, since rkyv's names the heap addresses it checked, and a serving node echoes
    /// the message to the peer (`invalid frame: …`).
    #[test]
    fn invalid_archives_fail_alike_and_without_addresses() {
        let bytes = crate::digest::sample_digest().encode();
        let mut pointer_errors = 0;
        for at in 2..bytes.len() {
            for value in [0x01, 0x7f, 0xff] {
                let mut corrupt = bytes.clone();
                corrupt[at] = value;
                let Err(DecodeError::Invalid(first)) = LoadDigest::decode(&corrupt) else {
                    continue;
                };
                // A second decode copies the bytes to another buffer.
                let _held = LoadDigest::decode(&bytes);
                assert_eq!(
                    LoadDigest::decode(&corrupt),
                    Err(DecodeError::Invalid(first.clone()))
                );
                assert!(!first.contains("0x0000"), "{first}");
                pointer_errors += usize::from(first.contains("archive"));
            }
        }
        assert!(pointer_errors > 0, "no corruption reached a pointer check");
        assert_eq!(
            with_offsets(
                "ptr 0x0000000000001010 size 8 in 0x0000000000001000..0x10",
                0x1000
            ),
            "ptr archive+16 size 8 in archive+0..0x10"
        );
    }
}
