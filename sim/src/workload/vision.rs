//! `vision`: multi-turn sessions about pictures, each session keeping its picture.
//!
//! A run has `images` pictures ([`super::image`]: real PNG files from the seed, 64 to 1,036
//! tokens each). A session picks one Zipf-wise (popular pictures recur across sessions) and
//! asks several questions about it: turn `t` sends the shared system prompt, then the first
//! user message `[text: caption][picture][text: question 0]`, each earlier question's answer
//! and the next question, up to question `t`. Sessions are scheduled as the `chat` workload
//! schedules them ([`super::chat::Chat::turn`]: `sessions` open at a time, turns a round
//! apart, slots staggered), and as there the answers in the history are fixed text of the
//! output length.
//!
//! So a session's turns share their whole prefix, picture included; two sessions on the same
//! picture share the system prompt, the caption and the picture; two on different pictures
//! share the system prompt and the caption only.

use std::sync::Arc;

use super::chat::{Chat, ChatArgs};
use super::image::{Image, Images};
use super::zipf::Zipf;
use super::{Attachment, Form, Request, Segment, Workload, key};
use crate::rng::SplitMix64;

/// Tokens of the caption ahead of every picture ("Here is a picture:").
pub const CAPTION_LEN: u32 = 8;

/// Parameters of the `vision` workload.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct VisionArgs {
    /// Pictures in the run (sessions pick one Zipf-wise).
    #[arg(long, default_value_t = 24)]
    pub vision_images: u32,
    /// Zipf exponent of picture popularity.
    #[arg(long, default_value_t = 1.0)]
    pub vision_zipf: f64,
    /// Turns (questions about the picture) per session.
    #[arg(long, default_value_t = 4)]
    pub vision_turns: u32,
    /// Shared system prompt length, tokens.
    #[arg(long, default_value_t = 128)]
    pub vision_system_len: u32,
    /// Question length, tokens.
    #[arg(long, default_value_t = 32)]
    pub vision_question_len: u32,
    /// Output length per turn (and length of each answer in the history), tokens.
    #[arg(long, default_value_t = 64)]
    pub vision_output_len: u32,
    /// Sessions open at any time.
    #[arg(long, default_value_t = 64)]
    pub vision_sessions: u32,
}

/// The `vision` workload.
pub struct Vision {
    args: VisionArgs,
    seed: u64,
    /// The session schedule (only its turns and sessions are used).
    schedule: Chat,
    popularity: Zipf,
    images: Images,
}

impl Vision {
    /// Builds the workload (pictures are made on first use).
    pub fn new(args: VisionArgs, seed: u64) -> Self {
        let count = args.vision_images.max(1);
        let schedule = Chat::new(
            ChatArgs {
                chat_turns: args.vision_turns,
                chat_system_len: args.vision_system_len,
                chat_user_len: args.vision_question_len,
                chat_output_len: args.vision_output_len,
                chat_sessions: args.vision_sessions,
            },
            seed,
        );
        Self {
            popularity: Zipf::new(count, args.vision_zipf),
            images: Images::new(seed, count),
            schedule,
            args,
            seed,
        }
    }

    /// The picture session `session` talks about.
    pub fn image_of(&self, session: u64) -> Arc<Image> {
        let mut rng = SplitMix64::new(key(self.seed, &[21, session]));
        self.images.get(self.popularity.pick(rng.next_f64()))
    }
}

impl Workload for Vision {
    fn natural_size(&self) -> Option<u64> {
        None
    }

    fn request(&self, index: u64) -> Request {
        let (session, turn) = self.schedule.turn(index);
        let seed = self.seed;
        let message = |tag: u64, t: u32, tokens: u32| Segment {
            key: key(seed, &[tag, session, u64::from(t)]),
            tokens: tokens.max(1),
        };
        let (question, output) = (self.args.vision_question_len, self.args.vision_output_len);
        let mut segments = Vec::with_capacity(2 * turn as usize + 2);
        segments.push(Segment {
            key: key(seed, &[22]),
            tokens: self.args.vision_system_len.max(1),
        });
        for t in 0..turn {
            segments.push(message(24, t, question));
            segments.push(message(25, t, output));
        }
        segments.push(message(24, turn, question));
        Request {
            segments,
            form: Form::Chat,
            output_tokens: output.max(1),
            session: Some(session),
            attachments: vec![Attachment {
                message: 1,
                caption: Segment {
                    key: key(seed, &[23]),
                    tokens: CAPTION_LEN,
                },
                image: self.image_of(session),
            }],
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn vision() -> Vision {
        let args = VisionArgs {
            vision_images: 6,
            vision_zipf: 1.0,
            vision_turns: 3,
            vision_system_len: 40,
            vision_question_len: 8,
            vision_output_len: 4,
            vision_sessions: 8,
        };
        Vision::new(args, 9)
    }

    #[test]
    fn sessions_keep_their_picture_and_popular_pictures_recur() {
        let v = vision();
        let mut last: HashMap<u64, Request> = HashMap::new();
        let mut sessions_per_image = [0u32; 6];
        for i in 0..300 {
            let request = v.request(i);
            let session = request.session.unwrap();
            assert_eq!(request.attachments.len(), 1);
            let attached = &request.attachments[0];
            assert_eq!(attached.message, 1, "the first user message");
            match last.get(&session) {
                None => sessions_per_image[attached.image.index as usize] += 1,
                Some(prev) => {
                    assert_eq!(prev.attachments, request.attachments, "request {i}");
                    assert_eq!(request.segments[..prev.segments.len()], prev.segments[..]);
                    let tokens = request.tokens();
                    assert_eq!(tokens[..prev.tokens().len()], prev.tokens()[..]);
                }
            }
            assert_eq!(request.tokens().len() as u64, request.prompt_tokens());
            last.insert(session, request);
        }
        assert!(
            sessions_per_image[0] > 2 * sessions_per_image[5],
            "{sessions_per_image:?}"
        );
        assert_eq!(v.request(17), v.request(17), "deterministic");
    }
}
