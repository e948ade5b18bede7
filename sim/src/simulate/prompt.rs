//! Prompts at the token level: segments, their token ids, and the prefix chain.
//!
//! A simulated prompt is a list of [`Segment`]s (a system prompt, a document, a question, a
//! Mooncake 512-token hash block), defined by the workload (`crate::workload`). [`tokens`]
//! gives their token ids, which are the mock engine's ids of the text the load generator sends
//! for the same request, so two prompts that start with the same segments start with the same
//! tokens: the engine model's own prefix cache hits exactly where the chain below says it
//! should, and where a real mock engine's would.
//!
//! The chain is cut into [`BLOCK_TOKENS`]-token blocks like the engine's KV blocks (only full
//! blocks count) and hashed directly from the token ids: `h_0 = H(seed, block_0)`,
//! `h_i = H(h_{i-1}, block_i)`. This is the protocol's token-mode chain in shape (each hash
//! names its whole prefix); the simulator uses a SplitMix-based hash instead of blake3 because
//! it hashes tens of millions of blocks per run and only needs equality, not wire stability.
//!
//! A prompt with pictures (the vision workload) is routed by the chain a kvmesh sidecar
//! computes in text mode for the very body the load generator sends ([`sidecar_chain`]): the
//! protocol keys a picture's blocks by its identity and gives it as many blocks as its
//! estimated tokens fill, which no chain of token ids reproduces. Its engine still sees token
//! ids ([`crate::workload::Request::tokens`]), the picture as a run unique to it.

pub use crate::workload::segment::{Segment, tokens};

use kvmesh_protocol::hashing::{Endpoint, HashConfig, hash_request};
use kvmesh_protocol::mix64;

use super::node::MODEL;
use crate::load::render::{Api, BodySettings};
use crate::workload::Request;

/// Tokens per KV block (vLLM's default, and the engine model's).
pub const BLOCK_TOKENS: usize = 16;

/// The prefix chain of `tokens`: one hash per full block.
pub fn chain(seed: u64, tokens: &[u32]) -> Vec<u64> {
    let mut prev = mix64(seed ^ 0x6368_6169_6e00);
    tokens
        .chunks_exact(BLOCK_TOKENS)
        .map(|block| {
            let mut h = prev;
            for &t in block {
                h = mix64(h ^ u64::from(t)).rotate_left(5);
            }
            prev = mix64(h ^ prev);
            prev
        })
        .collect()
}

/// The chain a kvmesh sidecar hashing in text mode (its default, `HashConfig::default()`)
/// computes for the body the load generator renders for `request`.
pub fn sidecar_chain(request: &Request) -> Vec<u64> {
    let settings = BodySettings {
        model: MODEL.to_owned(),
        stream: false,
        api: Api::Chat,
    };
    let (api, body) = settings.body_value(request);
    let endpoint = match api {
        Api::Completions => Endpoint::Completions,
        Api::Chat => Endpoint::ChatCompletions,
    };
    hash_request(endpoint, &body, &HashConfig::default())
        .expect("a rendered body is a valid request")
        .chain
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_segments_share_tokens_and_chain() {
        let system = Segment { key: 1, tokens: 40 };
        let a = tokens(&[system, Segment { key: 2, tokens: 30 }]);
        let b = tokens(&[system, Segment { key: 3, tokens: 30 }]);
        assert_eq!(a.len(), 70);
        assert_eq!(a[..40], b[..40]);
        assert_ne!(a[40..], b[40..]);
        let (ca, cb) = (chain(0, &a), chain(0, &b));
        assert_eq!(ca.len(), 4, "only full 16-token blocks");
        // Blocks 0 and 1 lie inside the shared 40 tokens; block 2 spans the difference.
        assert_eq!(ca[..2], cb[..2]);
        assert_ne!(ca[2], cb[2]);
        assert_ne!(ca[3], cb[3]);
        assert_ne!(chain(1, &a)[0], ca[0], "the seed names the model");
    }

    mod vision {
        use kvmesh_protocol::hashing::{Endpoint, HashConfig, hash_request};

        use super::super::*;
        use crate::load::render::{Api, BodySettings};
        use crate::workload::vision::{Vision, VisionArgs};
        use crate::workload::{Request, Workload};

        fn vision() -> Vision {
            let args = VisionArgs {
                vision_images: 8,
                vision_zipf: 1.0,
                vision_turns: 3,
                vision_system_len: 100,
                vision_question_len: 20,
                vision_output_len: 10,
                vision_sessions: 6,
            };
            Vision::new(args, 4)
        }

        fn common(a: &[u64], b: &[u64]) -> usize {
            a.iter().zip(b).take_while(|(x, y)| x == y).count()
        }

        /// Requests 0..n grouped as (the first two turns of one session, the first turn of
        /// another session on the same picture, the first turn of a session on another).
        fn three_kinds(v: &Vision) -> (Request, Request, Request, Request) {
            let requests: Vec<Request> = (0..200).map(|i| v.request(i)).collect();
            let turn = |r: &Request| (r.segments.len() - 1) / 2;
            let image = |r: &Request| r.attachments[0].image.index;
            let (first, second) = requests
                .iter()
                .filter(|r| turn(r) == 0)
                .find_map(|r| {
                    let next = requests
                        .iter()
                        .find(|n| n.session == r.session && turn(n) == 1)?;
                    Some((r.clone(), next.clone()))
                })
                .expect("a session with two turns");
            let pick = |same: bool| {
                requests
                    .iter()
                    .find(|r| {
                        turn(r) == 0
                            && r.session != first.session
                            && (image(r) == image(&first)) == same
                    })
                    .expect("sessions on both kinds of picture")
                    .clone()
            };
            (first.clone(), second, pick(true), pick(false))
        }

        #[test]
        fn a_session_shares_its_pictures_blocks_and_another_picture_shares_none() {
            let v = vision();
            let (first, second, same, other) = three_kinds(&v);
            let picture = first.attachments[0].image.tokens as usize;
            assert_ne!(
                first.attachments[0].image.index,
                other.attachments[0].image.index
            );
            // The sidecar's chain, which routes: 64-byte text blocks of the rendered messages
            // (`<|system|>` 100 tokens of 4 bytes `<|end|><|user|>` 8 caption tokens); the
            // picture closes the last one and takes a block per 16 of its tokens.
            let (a, b) = (sidecar_chain(&first), sidecar_chain(&second));
            let (s, o) = (sidecar_chain(&same), sidecar_chain(&other));
            let before = (10 + 4 * 100 + 7 + 8 + 4 * 8usize).div_ceil(64);
            assert_eq!(b[..a.len()], a[..], "the next turn extends the first");
            assert_eq!(
                common(&a, &o),
                before,
                "another picture: the text before it only"
            );
            assert_eq!(
                common(&a, &s),
                before + picture.div_ceil(BLOCK_TOKENS),
                "the same picture in another session: up to its questions"
            );
            // The engine's chain of token ids: the picture's run starts inside the block
            // after the system prompt and the caption (108 tokens).
            let (a, b) = (chain(0, &first.tokens()), chain(0, &second.tokens()));
            let (s, o) = (chain(0, &same.tokens()), chain(0, &other.tokens()));
            assert_eq!(
                b[..a.len()],
                a[..],
                "the engine: the next turn extends the first"
            );
            assert_eq!(
                common(&a, &o),
                108 / BLOCK_TOKENS,
                "the engine: another picture"
            );
            assert!(
                common(&a, &s) >= (108 + picture) / BLOCK_TOKENS,
                "the engine: the same picture"
            );
            assert!(common(&a, &s) < a.len(), "the engine: other questions");
        }

        #[test]
        fn the_sidecars_chain_is_that_of_the_rendered_body() {
            let v = vision();
            let request = v.request(3);
            let settings = BodySettings {
                model: MODEL.to_owned(),
                stream: true,
                api: Api::Completions,
            };
            let spec = settings.render(&request);
            assert_eq!(
                spec.api,
                Api::Chat,
                "a conversation goes to chat completions"
            );
            let body: serde_json::Value = serde_json::from_slice(&spec.body).unwrap();
            let hashes =
                hash_request(Endpoint::ChatCompletions, &body, &HashConfig::default()).unwrap();
            assert_eq!(hashes.chain, sidecar_chain(&request));
            assert_eq!(
                HashConfig::default().tokens_per_block(),
                BLOCK_TOKENS as f32,
                "the simulator's blocks weigh what the sidecar's do"
            );
        }

        #[test]
        fn render_and_simulate_agree_on_prompt_tokens_up_to_the_template() {
            let v = vision();
            let settings = BodySettings {
                model: MODEL.to_owned(),
                stream: false,
                api: Api::Chat,
            };
            for i in 0..60 {
                let request = v.request(i);
                let spec = settings.render(&request);
                let simulated = request.tokens().len() as u64;
                assert_eq!(spec.input_tokens, simulated, "request {i}");
                // The sidecar's estimate from the body: text at 4 bytes a token (with its
                // markup, `<|role|>` and `<|end|>`, about 4 tokens a message) plus the
                // picture's tokens from its PNG header.
                let body: serde_json::Value = serde_json::from_slice(&spec.body).unwrap();
                let messages = body["messages"].as_array().unwrap().len() as u64;
                assert_eq!(body["messages"][1]["content"][1]["type"], "image_url");
                let estimate =
                    hash_request(Endpoint::ChatCompletions, &body, &HashConfig::default())
                        .unwrap()
                        .prompt_tokens;
                let overhead = u64::from(estimate) - simulated;
                assert!(
                    (2 * messages..=5 * messages).contains(&overhead),
                    "request {i}: {estimate} estimated, {simulated} simulated, {messages} messages"
                );
            }
        }
    }
}
