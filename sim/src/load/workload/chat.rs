//! `chat`: multi-turn sessions whose history grows turn by turn.
//!
//! Every session starts with the same system prompt; each turn adds a user message and sends
//! the whole history to `/v1/chat/completions`, with the session id in the `x-session-id`
//! header and the `user` field; the
//! answer the engine really gave is appended to the history before the next turn. A request
//! slot takes the next turn of a session whose previous turn has finished, or opens a new
//! session, so arrivals stay open-loop while turns of a session stay ordered. A session ends
//! after `turns` turns or on a failed turn.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use super::{Api, BodySettings, RequestSpec, Workload, key};
use crate::text;

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
    /// Output length per turn, tokens.
    #[arg(long, default_value_t = 128)]
    pub chat_output_len: u32,
}

#[derive(Debug)]
struct Session {
    id: u64,
    turn: u32,
    /// Alternating user / assistant contents after the system prompt.
    history: Vec<String>,
}

#[derive(Default)]
struct State {
    ready: VecDeque<Session>,
    in_flight: HashMap<u64, Session>,
    next_session: u64,
}

/// The `chat` workload.
pub struct Chat {
    args: ChatArgs,
    body: BodySettings,
    system: String,
    state: Mutex<State>,
}

impl Chat {
    /// Builds the workload.
    pub fn new(args: ChatArgs, body: BodySettings) -> Self {
        let system = text::text(key(body.seed, &[7]), args.chat_system_len as usize);
        Self {
            args,
            body,
            system,
            state: Mutex::new(State::default()),
        }
    }
}

impl Workload for Chat {
    fn name(&self) -> &'static str {
        "chat"
    }

    fn natural_size(&self) -> Option<u64> {
        None
    }

    fn wants_text(&self) -> bool {
        true
    }

    fn request(&self, index: u64) -> RequestSpec {
        let mut st = self.state.lock().expect("no panics under this lock");
        let mut session = match st.ready.pop_front() {
            Some(s) => s,
            None => {
                let id = st.next_session;
                st.next_session += 1;
                Session {
                    id,
                    turn: 0,
                    history: Vec::new(),
                }
            }
        };
        let user = text::text(
            key(self.body.seed, &[8, session.id, u64::from(session.turn)]),
            self.args.chat_user_len as usize,
        );
        session.history.push(user);
        let mut messages: Vec<(&str, &str)> = vec![("system", &self.system)];
        for (i, m) in session.history.iter().enumerate() {
            messages.push((if i % 2 == 0 { "user" } else { "assistant" }, m));
        }
        let input_tokens = messages
            .iter()
            .map(|(_, c)| c.len().div_ceil(4) as u64)
            .sum();
        let chat = BodySettings {
            api: Api::Chat,
            ..self.body.clone()
        };
        let session_id = format!("session-{}", session.id);
        let body = chat.chat_body(&messages, self.args.chat_output_len, Some(&session_id));
        let spec = RequestSpec {
            api: Api::Chat,
            body,
            session: Some(session_id),
            input_tokens,
            output_tokens: self.args.chat_output_len,
        };
        st.in_flight.insert(index, session);
        spec
    }

    fn complete(&self, index: u64, text: Option<&str>) {
        let mut st = self.state.lock().expect("no panics under this lock");
        let Some(mut session) = st.in_flight.remove(&index) else {
            return;
        };
        let Some(text) = text else { return }; // a failed turn ends the session
        session.history.push(text.to_owned());
        session.turn += 1;
        if session.turn < self.args.chat_turns {
            st.ready.push_back(session);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(turns: u32) -> Chat {
        let args = ChatArgs {
            chat_turns: turns,
            chat_system_len: 8,
            chat_user_len: 4,
            chat_output_len: 2,
        };
        Chat::new(
            args,
            BodySettings {
                model: "m".into(),
                stream: false,
                api: Api::Completions,
                seed: 5,
            },
        )
    }

    fn body(spec: &RequestSpec) -> serde_json::Value {
        serde_json::from_slice(&spec.body).unwrap()
    }

    #[test]
    fn turns_of_a_session_follow_its_answers() {
        let c = chat(2);
        let a = c.request(0);
        let b = c.request(1);
        assert_eq!(a.session.as_deref(), Some("session-0"));
        assert_eq!(b.session.as_deref(), Some("session-1"), "session 0 is busy");
        assert_eq!(a.api, Api::Chat);
        c.complete(0, Some(" the end"));
        let next = c.request(2);
        assert_eq!(next.session.as_deref(), Some("session-0"));
        let msgs = body(&next)["messages"].as_array().unwrap().clone();
        assert_eq!(msgs.len(), 4, "system, user, assistant, user");
        assert_eq!(msgs[2]["content"], " the end");
        assert_eq!(
            msgs[1],
            body(&a)["messages"][1],
            "history is resent unchanged"
        );
        assert_eq!(body(&next)["user"], "session-0");
        // Two turns done: session 0 ends; a failed turn ends session 1.
        c.complete(2, Some(" ok"));
        c.complete(1, None);
        assert_eq!(c.request(3).session.as_deref(), Some("session-2"));
    }
}
