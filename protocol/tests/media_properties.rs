//! Properties of media in chains (issue 17): identical bytes hash alike however they are
//! encoded, and any change to an item, to the order of items, or to the text before an item
//! changes every chain hash from that point on.

use base64::Engine as _;
use kvmesh_protocol::HashConfig;
use kvmesh_protocol::hashing::{
    ChainSeed, Endpoint, MediaId, MediaSpan, chain_from_media_tokens, hash_request,
    pin_media_uuids, pin_media_uuids_raw,
};
use proptest::prelude::*;
use serde_json::{Value, json};

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn image_part(bytes: &[u8]) -> Value {
    json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", b64(bytes))}})
}

/// `text[0]`, image 0, `text[1]`, image 1, `text[2]`, in one user message.
fn body(texts: &[String; 3], images: &[Vec<u8>; 2]) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": texts[0]}, image_part(&images[0]),
        {"type": "text", "text": texts[1]}, image_part(&images[1]),
        {"type": "text", "text": texts[2]},
    ]}]})
}

fn chain(body: &Value) -> Vec<u64> {
    hash_request(Endpoint::ChatCompletions, body, &HashConfig::default())
        .unwrap()
        .chain
}

/// Index of the first difference; every hash from there on must differ too.
fn assert_diverges_for_good(a: &[u64], b: &[u64]) -> Result<usize, TestCaseError> {
    let first = a.iter().zip(b).position(|(x, y)| x != y);
    let first = first.ok_or_else(|| TestCaseError::fail("the chains never diverge"))?;
    for (i, (x, y)) in a.iter().zip(b).enumerate().skip(first) {
        prop_assert_ne!(x, y, "hash {} equal again after diverging at {}", i, first);
    }
    Ok(first)
}

fn texts() -> impl Strategy<Value = [String; 3]> {
    ["[a-z ]{0,200}", "[a-z ]{0,200}", "[a-z ]{1,200}"]
}

fn images() -> impl Strategy<Value = [Vec<u8>; 2]> {
    [
        prop::collection::vec(any::<u8>(), 1..300),
        prop::collection::vec(any::<u8>(), 1..300),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn identical_bytes_hash_alike_whatever_their_encoding(bytes in prop::collection::vec(any::<u8>(), 0..2000)) {
        let encoded = b64(&bytes);
        let id = MediaId::of_bytes(&bytes);
        prop_assert_eq!(MediaId::of_base64(&encoded), id);
        prop_assert_eq!(MediaId::of_reference(&format!("data:image/png;base64,{encoded}")), id);
        prop_assert_eq!(MediaId::of_reference(&format!("data:image/jpeg;base64,{encoded}")), id);
        // An image sent as a data URL and the same bytes as audio data pin to the same uuid.
        let mut as_image = json!({"model": "m", "messages": [{"role": "user", "content": [image_part(&bytes)]}]});
        let mut as_audio = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": encoded, "format": "wav"}}]}]});
        pin_media_uuids(&mut as_image);
        pin_media_uuids(&mut as_audio);
        let uuid = |body: &Value| body["messages"][0]["content"][0]["uuid"].clone();
        prop_assert_eq!(uuid(&as_image), json!(id.uuid()));
        prop_assert_eq!(uuid(&as_audio), json!(id.uuid()));
    }

    #[test]
    fn a_changed_byte_changes_every_hash_from_its_item_on(
        texts in texts(), images in images(), which in 0..2usize, at in any::<prop::sample::Index>(), flip in 1..=255u8,
    ) {
        let base = chain(&body(&texts, &images));
        let mut changed = images.clone();
        let i = at.index(changed[which].len());
        changed[which][i] ^= flip;
        let first = assert_diverges_for_good(&base, &chain(&body(&texts, &changed)))?;
        // Nothing before the item changes: its first block is the first difference.
        let text_before = chain(&json!({"model": "m", "messages": [{"role": "user", "content":
            [{"type": "text", "text": texts[0]}]}]})).len();
        prop_assert!(first >= text_before);
    }

    #[test]
    fn pinning_does_not_change_the_chain(texts in texts(), images in images()) {
        let original = body(&texts, &images);
        let mut pinned = original.clone();
        prop_assert_eq!(pin_media_uuids(&mut pinned).pinned, 2);
        prop_assert_eq!(chain(&pinned), chain(&original));
    }

    #[test]
    fn the_forwarded_bytes_are_the_pinned_body(
        texts in texts(), images in images(), pretty in any::<bool>(), client_uuid in any::<bool>(),
    ) {
        let mut original = body(&texts, &images);
        if client_uuid {
            original["messages"][0]["content"][3]["uuid"] = json!("client-chosen");
        }
        let raw = match pretty {
            true => serde_json::to_vec_pretty(&original).unwrap(),
            false => serde_json::to_vec(&original).unwrap(),
        };
        let mut pinned = original.clone();
        let (report, bytes) = pin_media_uuids_raw(&raw, &mut pinned);
        prop_assert_eq!(report.pinned, 2);
        prop_assert_eq!(report.replaced, u32::from(client_uuid));
        let forwarded: Value = serde_json::from_slice(&bytes.expect("changed")).unwrap();
        prop_assert_eq!(&forwarded, &pinned);
        // Pinned already: nothing to forward but the original.
        let again = serde_json::to_vec(&pinned).unwrap();
        prop_assert!(pin_media_uuids_raw(&again, &mut pinned.clone()).1.is_none());
    }

    #[test]
    fn swapped_items_change_every_hash_from_the_first(texts in texts(), images in images()) {
        prop_assume!(images[0] != images[1]);
        let swapped = [images[1].clone(), images[0].clone()];
        assert_diverges_for_good(&chain(&body(&texts, &images)), &chain(&body(&texts, &swapped)))?;
    }

    #[test]
    fn changed_text_before_an_item_changes_every_later_hash(
        texts in texts(), images in images(), at in any::<prop::sample::Index>(), letter in "[a-z]",
    ) {
        let mut changed = texts.clone();
        let mut bytes = changed[1].clone().into_bytes();
        bytes.insert(at.index(bytes.len() + 1), letter.as_bytes()[0]);
        changed[1] = String::from_utf8(bytes).unwrap();
        assert_diverges_for_good(&chain(&body(&texts, &images)), &chain(&body(&changed, &images)))?;
    }

    #[test]
    fn token_chains_diverge_for_good_at_a_changed_item(
        before in 0..40usize, length in 1..40usize, after in 1..40usize, a in any::<[u8; 32]>(), b in any::<[u8; 32]>(),
    ) {
        prop_assume!(a != b);
        let tokens: Vec<u32> = (0..(before + length + after) as u32)
            .map(|i| if (before..before + length).contains(&(i as usize)) { 7 } else { i })
            .collect();
        let seed = ChainSeed::new("m", None);
        let span = |id| [MediaSpan { offset: before, length, id: MediaId(id) }];
        let x = chain_from_media_tokens(seed, &tokens, 4, &span(a));
        let y = chain_from_media_tokens(seed, &tokens, 4, &span(b));
        let first = x.iter().zip(&y).position(|(p, q)| p != q);
        // The first block overlapping the item is the first difference, and it lasts.
        prop_assert_eq!(first, (before / 4 < x.len()).then_some(before / 4));
        if let Some(first) = first {
            prop_assert!(x[first..].iter().zip(&y[first..]).all(|(p, q)| p != q));
        }
    }
}
