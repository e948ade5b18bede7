//! `chat`: multi-turn sessions whose history grows (see `load::workload::chat`).
//!
//! A pool of `active` sessions is open at any time; each request takes the next turn of a
//! session drawn at random from the pool, so turns of one session are spread out in time (their
//! history is usually cached by then) while arrivals stay open-loop. A session that did its
//! last turn is replaced by a new one. The assistant's answer in the history is a
//! deterministic segment of the output length: the engine generated other tokens, so a cache
//! hit on a later turn reaches the end of the previous turn's prompt, not further.

use super::Generator;
use crate::load::workload::chat::ChatArgs;
use crate::load::workload::key;
use crate::rng::SplitMix64;
use crate::simulate::prompt::Segment;

struct Session {
    id: u64,
    turn: u32,
    history: Vec<Segment>,
}

pub struct ChatGen {
    args: ChatArgs,
    seed: u64,
    pool: Vec<Session>,
    next_session: u64,
    rng: SplitMix64,
}

impl ChatGen {
    pub fn new(args: ChatArgs, active: usize, seed: u64) -> Self {
        let mut chat = Self {
            args,
            seed,
            pool: Vec::new(),
            next_session: 0,
            rng: SplitMix64::new(seed ^ 0x6368_6174),
        };
        for _ in 0..active.max(1) {
            let session = chat.open();
            chat.pool.push(session);
        }
        chat
    }

    fn open(&mut self) -> Session {
        let id = self.next_session;
        self.next_session += 1;
        Session {
            id,
            turn: 0,
            history: vec![Segment {
                key: key(self.seed, &[7]),
                tokens: self.args.chat_system_len.max(1),
            }],
        }
    }
}

impl Generator for ChatGen {
    fn request(&mut self, _index: u64) -> (Vec<Segment>, u32, Option<u64>) {
        let slot = self.rng.below(self.pool.len() as u64) as usize;
        let (seed, user_len, output) = (
            self.seed,
            self.args.chat_user_len.max(1),
            self.args.chat_output_len,
        );
        let session = &mut self.pool[slot];
        session.history.push(Segment {
            key: key(seed, &[8, session.id, u64::from(session.turn)]),
            tokens: user_len,
        });
        let prompt = session.history.clone();
        session.history.push(Segment {
            key: key(seed, &[9, session.id, u64::from(session.turn)]),
            tokens: output.max(1),
        });
        session.turn += 1;
        let id = session.id;
        if session.turn >= self.args.chat_turns.max(1) {
            self.pool[slot] = self.open();
        }
        (prompt, output, Some(id ^ 0x7365_7373_696f_6e00))
    }
}
