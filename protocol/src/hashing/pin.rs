//! Pinning media identities into a request before it reaches an engine.
//!
//! vLLM identifies a media item in its block hashes (and so in its KV events) by the part's
//! `uuid` when the caller gives one, and otherwise by a hash of its own that no router can
//! reproduce. The entry sidecar therefore writes the identity it verified, the blake3 of the
//! bytes it can see, as the `uuid` of every part that carries its bytes ([`MediaId::uuid`]).
//! Exact mode then recognises the item in `BlockStored.extra_keys`, and the chain the entry
//! computes for the next request with the same bytes meets the engine's blocks.
//!
//! A `uuid` the client sent on such a part is replaced, not trusted: vLLM takes a `uuid` at its
//! word, so one reused for other bytes (by mistake, or by a tenant who wants another's image
//! to be answered from its own) would make the engine reuse KV computed for other pixels. A
//! part whose bytes the sidecar cannot see (a plain URL) keeps the client's `uuid`, which is
//! the client's business as it is with vLLM alone, except that one posing as a verified
//! identity is moved out of that namespace, so that it can never alias bytes a sidecar hashed;
//! so is one on any other part (image embeddings, a kind this code does not read).

use super::media::{MediaPart, VERIFIED_UUID_PREFIX, content_parts_mut};
use super::splice;
use serde_json::Value;

/// What pinning changed in one request.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PinReport {
    /// Parts whose bytes were hashed and whose `uuid` now names them.
    pub pinned: u32,
    /// Of those, parts that came with a different client `uuid`.
    pub replaced: u32,
    /// Media parts whose bytes the sidecar cannot see (a plain URL): the engine identifies them.
    pub unverified: u32,
    /// Parts not verified here (media or not) whose client `uuid` posed as a verified one.
    pub moved: u32,
    /// Parts whose `uuid` was written: when non-zero, the body must be serialized again.
    pub rewritten: u32,
}

/// Prefix given to a client `uuid` that poses as a verified identity.
pub const MOVED_UUID_PREFIX: &str = "client-";

/// Pins the identity of every media part of a chat body's messages. Bodies of other shapes
/// (no `messages`, content as a string) are left alone.
pub fn pin_media_uuids(body: &mut Value) -> PinReport {
    pin(body).0
}

/// [`pin_media_uuids`] on `body`, the parse of `raw`, and the bytes to forward: `None` when
/// nothing changed; `raw` with each new `uuid` spliced into its part when pinning only added
/// uuids (the common case: re-encoding a body with an image costs more than everything else
/// the sidecar does with it); else `body` encoded again.
pub fn pin_media_uuids_raw(raw: &[u8], body: &mut Value) -> (PinReport, Option<Vec<u8>>) {
    let (report, added) = pin(body);
    if report.rewritten == 0 {
        return (report, None);
    }
    let only_added = report.replaced == 0 && report.moved == 0;
    let spliced = only_added
        .then(|| splice::insert_uuids(raw, &added))
        .flatten();
    let bytes = spliced.or_else(|| serde_json::to_vec(body).ok());
    (report, bytes)
}

/// Pins `body`; also returns, for each part that had no `uuid` and got one, its ordinal among
/// all content parts of the messages (in order) and the uuid.
fn pin(body: &mut Value) -> (PinReport, Vec<(usize, String)>) {
    let mut report = PinReport::default();
    let mut added = Vec::new();
    for (ordinal, part) in content_parts_mut(body).enumerate() {
        // A part of a kind not read here (image embeddings, a newer media type) is never
        // verified: its `uuid` must not pose as a verified one either.
        let media = MediaPart::of(part);
        let is_media = media.is_some();
        let identity = media
            .and_then(MediaPart::verified_identity)
            .map(|id| id.uuid());
        let Some(object) = part.as_object_mut() else {
            continue;
        };
        let client = object.get("uuid");
        match identity {
            Some(uuid) => {
                report.pinned += 1;
                if client.and_then(Value::as_str) == Some(uuid.as_str()) {
                    continue;
                }
                match client {
                    Some(_) => report.replaced += 1,
                    None => added.push((ordinal, uuid.clone())),
                }
                object.insert("uuid".into(), Value::String(uuid));
                report.rewritten += 1;
            }
            None => {
                report.unverified += u32::from(is_media);
                let Some(client) = client
                    .and_then(Value::as_str)
                    .filter(|u| u.starts_with(VERIFIED_UUID_PREFIX))
                else {
                    continue;
                };
                let moved = format!("{MOVED_UUID_PREFIX}{client}");
                object.insert("uuid".into(), Value::String(moved));
                report.moved += 1;
                report.rewritten += 1;
            }
        }
    }
    (report, added)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::MediaId;
    use base64::Engine as _;
    use serde_json::json;

    fn data_url(bytes: &[u8]) -> String {
        let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
        format!("data:image/png;base64,{b64}")
    }

    #[test]
    fn parts_with_bytes_are_pinned_and_client_uuids_on_them_replaced() {
        let verified = MediaId::of_bytes(b"cat").uuid();
        let mut body = json!({"model": "m", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": data_url(b"cat")}},
                {"type": "image_url", "image_url": {"url": data_url(b"cat")}, "uuid": "dog"},
                {"type": "input_audio", "input_audio": {"data": "bWVvdw==", "format": "wav"}},
            ]},
        ]});
        let report = pin_media_uuids(&mut body);
        assert_eq!(
            report,
            PinReport {
                pinned: 3,
                replaced: 1,
                unverified: 0,
                moved: 0,
                rewritten: 3
            }
        );
        let parts = &body["messages"][1]["content"];
        assert_eq!(parts[1]["uuid"], verified);
        assert_eq!(
            parts[2]["uuid"], verified,
            "the client's uuid named other bytes"
        );
        assert_eq!(parts[3]["uuid"], MediaId::of_bytes(b"meow").uuid());
        assert!(parts[0].get("uuid").is_none());
        // Pinning is idempotent: a second pass changes nothing.
        assert_eq!(pin_media_uuids(&mut body.clone()).rewritten, 0);
    }

    #[test]
    fn url_parts_keep_client_uuids_unless_they_pose_as_verified() {
        let forged = MediaId::of_bytes(b"someone else's image").uuid();
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://a/x.png"}, "uuid": "mine"},
            {"type": "image_url", "image_url": {"url": "https://a/y.png"}, "uuid": forged},
            {"type": "image_url", "image_url": {"url": "https://a/z.png"}},
        ]}]});
        let report = pin_media_uuids(&mut body);
        assert_eq!(
            (
                report.pinned,
                report.unverified,
                report.moved,
                report.rewritten
            ),
            (0, 3, 1, 1)
        );
        let parts = &body["messages"][0]["content"];
        assert_eq!(parts[0]["uuid"], "mine");
        assert_eq!(parts[1]["uuid"], format!("{MOVED_UUID_PREFIX}{forged}"));
        assert!(parts[2].get("uuid").is_none());
    }

    #[test]
    fn bodies_without_media_are_untouched() {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let before = body.clone();
        assert_eq!(pin_media_uuids(&mut body), PinReport::default());
        assert_eq!(body, before);
        let mut prompt = json!({"model": "m", "prompt": "hi"});
        assert_eq!(pin_media_uuids(&mut prompt).rewritten, 0);
    }
}
