//! `chat`: multi-turn sessions whose history grows turn by turn.
//!
//! `sessions` conversations are open at any time, each in a slot. Requests go round the slots
//! in rounds of `sessions` requests, in a fresh seeded order each round, so the turns of one
//! session are about `sessions` requests apart (their history is usually cached by then, and
//! no fixed order of targets follows a session). A slot's session ends after `turns` turns
//! and a new one takes the slot; the slots start staggered, so that sessions end a few at a
//! time rather than all in the same round.
//!
//! Every session starts with the same system prompt; turn `t` sends the system prompt, the
//! first `t` user messages each followed by its answer, and a new user message. The answer in
//! the history is fixed text of the output length, not what the engine generated, so that a
//! request does not depend on an earlier response: a cache hit on a later turn reaches the end
//! of the previous turn's prompt, not into its answer.

use super::{Form, Request, Segment, Workload, key, permutation};

/// Parameters of the `chat` workload.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct ChatArgs {
    /// Turns per session.
    #[arg(long, default_value_t = 5)]
    pub chat_turns: u32,
    /// Shared system prompt length, tokens.
    #[arg(long, default_value_t = 256)]
    pub chat_system_len: u32,
    /// User message length, tokens.
    #[arg(long, default_value_t = 64)]
    pub chat_user_len: u32,
    /// Output length per turn (and length of each answer in the history), tokens.
    #[arg(long, default_value_t = 128)]
    pub chat_output_len: u32,
    /// Sessions open at any time.
    #[arg(long, default_value_t = 256)]
    pub chat_sessions: u32,
}

/// The `chat` workload.
pub struct Chat {
    args: ChatArgs,
    seed: u64,
}

impl Chat {
    /// Builds the workload.
    pub fn new(args: ChatArgs, seed: u64) -> Self {
        Self { args, seed }
    }

    /// The session and turn of request `index`.
    pub fn turn(&self, index: u64) -> (u64, u32) {
        let slots = u64::from(self.args.chat_sessions.max(1));
        let turns = u64::from(self.args.chat_turns.max(1));
        let (round, position) = (index / slots, index % slots);
        let order = permutation(slots as usize, key(self.seed, &[12, round]));
        let slot = u64::from(order[position as usize]);
        // Slot `slot` runs `offset` rounds ahead, so its first session is `offset` turns short.
        let offset = slot % turns;
        let generation = (round + offset) / turns;
        let first_round = (generation * turns).saturating_sub(offset);
        (generation * slots + slot, (round - first_round) as u32)
    }
}

impl Workload for Chat {
    fn natural_size(&self) -> Option<u64> {
        None
    }

    fn request(&self, index: u64) -> Request {
        let (session, turn) = self.turn(index);
        let seed = self.seed;
        let message = |tag: u64, t: u32, tokens: u32| Segment {
            key: key(seed, &[tag, session, u64::from(t)]),
            tokens: tokens.max(1),
        };
        let output = self.args.chat_output_len.max(1);
        let mut segments = Vec::with_capacity(2 * turn as usize + 2);
        segments.push(Segment {
            key: key(seed, &[7]),
            tokens: self.args.chat_system_len.max(1),
        });
        for t in 0..turn {
            segments.push(message(8, t, self.args.chat_user_len));
            segments.push(message(9, t, output));
        }
        segments.push(message(8, turn, self.args.chat_user_len));
        Request {
            segments,
            form: Form::Chat,
            output_tokens: output,
            session: Some(session),
            attachments: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn chat(sessions: u32, turns: u32) -> Chat {
        let args = ChatArgs {
            chat_turns: turns,
            chat_system_len: 8,
            chat_user_len: 4,
            chat_output_len: 2,
            chat_sessions: sessions,
        };
        Chat::new(args, 5)
    }

    #[test]
    fn each_turn_extends_the_previous_turn_of_its_session() {
        let c = chat(8, 3);
        let mut last: HashMap<u64, (u64, Request)> = HashMap::new();
        for i in 0..400 {
            let request = c.request(i);
            let session = request.session.unwrap();
            let turn = (request.segments.len() - 1) / 2;
            assert_eq!(request.form, Form::Chat);
            assert_eq!(
                request.segments.len() % 2,
                0,
                "system, (user, answer)*, user"
            );
            assert!(turn < 3);
            match last.get(&session) {
                None => assert_eq!(turn, 0, "request {i}: session {session} starts at turn 0"),
                Some((at, prev)) => {
                    assert_eq!(turn, (prev.segments.len() - 1) / 2 + 1, "request {i}");
                    assert_eq!(request.segments[..prev.segments.len()], prev.segments[..]);
                    assert_eq!(
                        request.segments[prev.segments.len()].tokens,
                        2,
                        "the answer"
                    );
                    assert!((1..16).contains(&(i - at)), "turns one round apart");
                }
            }
            last.insert(session, (i, request));
        }
        // 8 slots x 50 rounds of 3 turns, staggered: every slot's sessions hold 1-3 turns.
        assert!(last.len() > 8 * 50 / 3, "{} sessions", last.len());
    }

    #[test]
    fn sessions_end_a_few_at_a_time() {
        let c = chat(64, 4);
        let starts_per_round: Vec<usize> = (0..10u64)
            .map(|round| {
                (round * 64..(round + 1) * 64)
                    .filter(|&i| c.turn(i).1 == 0)
                    .count()
            })
            .collect();
        assert_eq!(starts_per_round[0], 64, "every slot opens a session");
        assert!(
            starts_per_round[1..].iter().all(|&n| n == 16),
            "{starts_per_round:?}"
        );
    }
}
