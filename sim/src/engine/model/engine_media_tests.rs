//! Multimodal prompts in the engine model: media identifiers key the blocks their
//! placeholders overlap, and the encoder is charged for items the prefix cache does not hold.

use std::time::Duration;

use base64::Engine as _;

use super::chat_prompt::{ChatTurn, ContentPart, render_chat_prompt};
use super::media::{MediaConfig, MediaPart, MediaSource, Modality};
use super::*;

const BS: usize = 16;

fn cfg(encoder_s_per_media_token: f64) -> EngineConfig {
    EngineConfig {
        num_gpu_blocks: 1024,
        block_size: BS as u32,
        seed: 3,
        timing: TimingModel {
            encoder_s_per_media_token,
            ..TimingModel::default()
        },
        ..Default::default()
    }
}

/// The first bytes of a PNG of `width`×`height` (all the size estimate reads), then `salt`
/// so that two pictures of one size differ.
fn png(width: u32, height: u32, salt: &[u8]) -> Vec<u8> {
    let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    b.extend(width.to_be_bytes());
    b.extend(height.to_be_bytes());
    b.extend([8, 6, 0, 0, 0]);
    b.extend(salt);
    b
}

/// An image part sent as a data URL: 280×224 px = 10×8 = 80 placeholder tokens.
fn image(salt: &[u8], uuid: Option<&str>) -> ContentPart {
    let url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(png(280, 224, salt))
    );
    let part = MediaPart {
        modality: Modality::Image,
        source: MediaSource::Url(url),
        uuid: uuid.map(str::to_owned),
    };
    ContentPart::Media(part.resolve("mock-model", &MediaConfig::default()))
}

/// A user turn: some text, the image, a question.
fn chat(id: RequestId, image: ContentPart) -> EngineRequest {
    let turn = ChatTurn {
        role: "user".into(),
        parts: vec![
            ContentPart::Text("Look at this picture, please. ".repeat(3)),
            image,
            ContentPart::Text("What is in it? Answer in one sentence. ".repeat(3)),
        ],
    };
    let prompt = render_chat_prompt(&[turn], true);
    EngineRequest {
        media: prompt.media,
        ..EngineRequest::new(id, prompt.tokens, 2)
    }
}

/// Runs `req` alone from `at` to its end: (time to first token, what finished).
fn run_one(e: &mut Engine, req: EngineRequest, at: Duration) -> (Duration, Finished) {
    e.submit(req, at).unwrap();
    let mut first = None;
    while let Some(t) = e.next_event_time() {
        for o in e.advance(t) {
            first.get_or_insert(t - at);
            if let Some(f) = o.finished {
                return (first.unwrap(), f);
            }
        }
    }
    panic!("the request did not finish");
}

/// Blocks of `req`'s prompt up to the first one its (only) image overlaps, in tokens.
fn tokens_before_image(req: &EngineRequest) -> u32 {
    (req.media[0].offset / BS * BS) as u32
}

#[test]
fn the_same_image_at_the_same_place_hits() {
    let mut e = Engine::new(cfg(0.0));
    let a = chat(1, image(b"cat", None));
    assert_eq!(a.media[0].length, 80, "280x224 px at 28 px per token side");
    let image_end = a.media[0].end() as u32;
    let (_, first) = run_one(&mut e, a, Duration::ZERO);
    assert_eq!(first.cached_tokens, 0);
    let (_, second) = run_one(&mut e, chat(2, image(b"cat", None)), Duration::from_secs(5));
    assert!(
        second.cached_tokens >= image_end,
        "hit {} does not cover the image ending at {image_end}",
        second.cached_tokens
    );
    assert_eq!(
        second.cached_tokens,
        (second.prompt_tokens - 1) / BS as u32 * BS as u32,
        "every full block but the last token's hits"
    );
}

#[test]
fn a_different_image_misses_from_its_first_block() {
    let mut e = Engine::new(cfg(0.0));
    let a = chat(1, image(b"cat", None));
    let b = chat(2, image(b"dog", None));
    assert_eq!(
        a.prompt, b.prompt,
        "same size: the token ids alone are equal"
    );
    assert_ne!(a.media[0].identifier, b.media[0].identifier);
    run_one(&mut e, a, Duration::ZERO);
    let before_image = tokens_before_image(&b);
    assert!(before_image > 0);
    let (_, fin) = run_one(&mut e, b, Duration::from_secs(5));
    assert_eq!(fin.cached_tokens, before_image);
}

#[test]
fn the_same_uuid_hits_even_for_different_bytes() {
    let mut e = Engine::new(cfg(0.0));
    run_one(
        &mut e,
        chat(1, image(b"cat", Some("img-1"))),
        Duration::ZERO,
    );
    let (_, same) = run_one(
        &mut e,
        chat(2, image(b"cat", Some("img-1"))),
        Duration::from_secs(5),
    );
    let full_hit = (same.prompt_tokens - 1) / BS as u32 * BS as u32;
    assert_eq!(same.cached_tokens, full_hit);
    // vLLM trusts the caller's uuid as the item's identity: a different picture under the
    // same uuid reuses the first one's KV. A router therefore must pin uuids to content it
    // hashed itself (the sidecar's `kvmesh-b3-…`), or clients can poison each other's hits.
    let (_, other) = run_one(
        &mut e,
        chat(3, image(b"dog", Some("img-1"))),
        Duration::from_secs(10),
    );
    assert_eq!(other.cached_tokens, full_hit);
    // The uuid replaces the content hash: the same bytes without it are another item.
    let req = chat(4, image(b"cat", None));
    let before_image = tokens_before_image(&req);
    let (_, unpinned) = run_one(&mut e, req, Duration::from_secs(15));
    assert_eq!(unpinned.cached_tokens, before_image);
}

#[test]
fn the_encoder_runs_on_a_miss_and_not_on_a_full_hit() {
    // The same two requests on an engine with a free encoder and one with 1 ms per token.
    let ttfts = |encoder_s: f64| {
        let mut e = Engine::new(cfg(encoder_s));
        let (miss, _) = run_one(&mut e, chat(1, image(b"cat", None)), Duration::ZERO);
        let after_miss = e.stats().media_encoder_tokens;
        let (hit, fin) = run_one(&mut e, chat(2, image(b"cat", None)), Duration::from_secs(5));
        assert!(fin.cached_tokens > 0);
        let after_hit = e.stats().media_encoder_tokens;
        let (partial, _) = run_one(
            &mut e,
            chat(3, image(b"dog", None)),
            Duration::from_secs(10),
        );
        let after_partial = e.stats().media_encoder_tokens;
        (miss, hit, partial, [after_miss, after_hit, after_partial])
    };
    let (miss0, hit0, partial0, counts) = ttfts(0.0);
    let (miss1, hit1, partial1, _) = ttfts(0.001);
    assert_eq!(counts, [80, 80, 160], "encoded tokens after each request");
    let extra = |a: Duration, b: Duration| (a.as_secs_f64() - b.as_secs_f64()) * 1e3;
    assert!(
        (extra(miss1, miss0) - 80.0).abs() < 1e-3,
        "{miss1:?} vs {miss0:?}"
    );
    assert_eq!(hit1, hit0, "a full hit skips the encoder");
    assert!((extra(partial1, partial0) - 80.0).abs() < 1e-3);
}

#[test]
fn stored_blocks_carry_the_identifier_where_the_image_is() {
    let mut e = Engine::new(cfg(0.0));
    let req = chat(1, image(b"cat", Some("img-1")));
    let item = req.media[0].clone();
    let prompt_len = req.prompt.len();
    run_one(&mut e, req, Duration::ZERO);
    let mut per_block = Vec::new();
    for ev in e.take_kv_events() {
        if let KvCacheEvent::BlockStored {
            block_hashes,
            extra_keys,
            ..
        } = ev
        {
            assert_eq!(extra_keys.len(), block_hashes.len());
            per_block.extend(extra_keys);
        }
    }
    assert_eq!(per_block.len(), prompt_len / BS);
    for (i, keys) in per_block.iter().enumerate() {
        let expected = item
            .overlaps(i * BS, (i + 1) * BS)
            .then(|| vec!["img-1".to_owned()]);
        assert_eq!(keys, &expected, "block {i}");
    }
    assert!(per_block.iter().filter(|k| k.is_some()).count() >= 5);
}

#[test]
fn stored_extra_keys_are_lora_then_media_then_salt() {
    let mut e = Engine::new(cfg(0.0));
    let mut req = chat(1, image(b"cat", Some("img-1")));
    req.lora = Some(LoraRef {
        id: 1,
        name: "ad".into(),
    });
    req.cache_salt = Some("s".into());
    let item = req.media[0].clone();
    assert!(item.offset >= BS, "the image starts after block 0");
    run_one(&mut e, req, Duration::ZERO);
    let per_block: Vec<Option<Vec<String>>> = e
        .take_kv_events()
        .into_iter()
        .flat_map(|ev| match ev {
            KvCacheEvent::BlockStored { extra_keys, .. } => extra_keys,
            _ => Vec::new(),
        })
        .collect();
    let keys = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(per_block[0], keys(&["ad", "s"]));
    for (i, k) in per_block.iter().enumerate().skip(1) {
        if item.overlaps(i * BS, (i + 1) * BS) {
            assert_eq!(k, &keys(&["ad", "img-1"]), "block {i}");
        } else {
            assert_eq!(k, &keys(&["ad"]), "block {i}");
        }
    }
}

#[test]
fn a_decode_leg_encodes_only_what_it_did_not_pull() {
    for (outcome, encoded) in [(PullOutcome::Loaded, 0), (PullOutcome::Failed, 80)] {
        let mut e = Engine::new(EngineConfig {
            kv_load_failure_policy: KvLoadFailurePolicy::Recompute,
            ..cfg(0.0)
        });
        let mut req = chat(1, image(b"cat", None));
        req.kv_transfer = KvTransfer::RemotePrefill { remote_blocks: 0 };
        e.submit(req, Duration::ZERO).unwrap();
        e.advance(Duration::ZERO);
        let pulls = e.take_pulls();
        assert_eq!(pulls.len(), 1);
        assert!(e.finish_pull(1, outcome, Duration::from_millis(1)));
        while let Some(t) = e.next_event_time() {
            e.advance(t);
        }
        assert!(e.is_idle());
        assert_eq!(e.stats().media_encoder_tokens, encoded, "{outcome:?}");
    }
}
