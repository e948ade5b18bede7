//! A chat rendered to token ids with its media items in place.
//!
//! The chat template is the tokenizer's ([`tokenizer`](super::tokenizer)); a media part
//! becomes its start marker, its placeholder tokens and its end marker. The text between media
//! items is tokenized run by run, so a text-only chat gives exactly `tokenize(render_chat(..))`
//! and a media item never shifts the 4-byte chunks of the text after it.

use super::media::{MediaItem, ResolvedMedia};
use super::tokenizer::{GENERATION_PROMPT, TURN_END, push_turn_start, tokenize};

/// One part of a message's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentPart {
    /// Text, rendered as is.
    Text(String),
    /// A media item, already sized and named.
    Media(ResolvedMedia),
}

/// One chat message with its content parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTurn {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// Its content, in order.
    pub parts: Vec<ContentPart>,
}

impl ChatTurn {
    /// A message of plain text.
    pub fn text(role: &str, text: impl Into<String>) -> Self {
        Self {
            role: role.to_owned(),
            parts: vec![ContentPart::Text(text.into())],
        }
    }
}

/// A rendered chat: what the engine runs and caches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChatPrompt {
    /// Token ids, placeholders expanded.
    pub tokens: Vec<u32>,
    /// Its media items in prompt order, each with its placeholder range in `tokens`.
    pub media: Vec<MediaItem>,
}

/// Renders `turns` with the chat template (see the module docs).
pub fn render_chat_prompt(turns: &[ChatTurn], add_generation_prompt: bool) -> ChatPrompt {
    let mut b = PromptBuilder::default();
    for turn in turns {
        push_turn_start(&mut b.text, &turn.role);
        for part in &turn.parts {
            match part {
                ContentPart::Text(t) => b.text.push_str(t),
                ContentPart::Media(m) => b.push_media(m),
            }
        }
        b.text.push_str(TURN_END);
    }
    if add_generation_prompt {
        b.text.push_str(GENERATION_PROMPT);
    }
    b.finish()
}

/// Accumulates a prompt: text waits in `text` until a media item (or the end) cuts the run.
#[derive(Default)]
struct PromptBuilder {
    text: String,
    prompt: ChatPrompt,
}

impl PromptBuilder {
    fn flush_text(&mut self) {
        self.prompt.tokens.extend(tokenize(&self.text));
        self.text.clear();
    }

    fn push_media(&mut self, m: &ResolvedMedia) {
        self.text.push_str(m.modality.start_marker());
        self.flush_text();
        let offset = self.prompt.tokens.len();
        let length = m.tokens as usize;
        self.prompt
            .tokens
            .extend(std::iter::repeat_n(m.modality.placeholder_token(), length));
        self.prompt.media.push(MediaItem {
            modality: m.modality,
            identifier: m.identifier.clone(),
            offset,
            length,
        });
        self.text.push_str(m.modality.end_marker());
    }

    fn finish(mut self) -> ChatPrompt {
        self.flush_text();
        self.prompt
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::media::Modality;
    use crate::engine::model::tokenizer::{
        ChatMessage, IMAGE_PLACEHOLDER_TOKEN, VOCAB_SIZE, render_chat,
    };

    fn text(role: &str, t: &str) -> ChatTurn {
        ChatTurn {
            role: role.into(),
            parts: vec![ContentPart::Text(t.into())],
        }
    }

    #[test]
    fn text_only_is_the_text_template() {
        let turns = [text("system", "Be brief."), text("user", "Hi there")];
        let msgs: Vec<ChatMessage> = [("system", "Be brief."), ("user", "Hi there")]
            .map(|(role, content)| ChatMessage {
                role: role.into(),
                content: content.into(),
            })
            .into();
        let p = render_chat_prompt(&turns, true);
        assert_eq!(p.tokens, tokenize(&render_chat(&msgs, true)));
        assert!(p.media.is_empty());
    }

    #[test]
    fn media_is_a_placeholder_run_between_separately_tokenized_text() {
        let image = ResolvedMedia {
            modality: Modality::Image,
            identifier: "img".into(),
            tokens: 5,
        };
        let turns = [ChatTurn {
            role: "user".into(),
            parts: vec![
                ContentPart::Text("abc".into()),
                ContentPart::Media(image),
                ContentPart::Text("what is it?".into()),
            ],
        }];
        let p = render_chat_prompt(&turns, false);
        let before = tokenize("<|user|>\nabc<|vision_start|>");
        let after = tokenize("<|vision_end|>what is it?<|end|>\n");
        assert_eq!(p.tokens.len(), before.len() + 5 + after.len());
        assert_eq!(&p.tokens[..before.len()], &before[..]);
        assert_eq!(
            &p.tokens[before.len()..before.len() + 5],
            &[IMAGE_PLACEHOLDER_TOKEN; 5]
        );
        assert_eq!(&p.tokens[before.len() + 5..], &after[..]);
        assert!(p.tokens.iter().filter(|&&t| t >= VOCAB_SIZE).count() == 5);
        assert_eq!(
            p.media,
            vec![MediaItem {
                modality: Modality::Image,
                identifier: "img".into(),
                offset: before.len(),
                length: 5,
            }]
        );
    }
}
