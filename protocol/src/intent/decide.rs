//! The intent decision: rules first, then the nearest centroid of the examples' embeddings,
//! then the default model.

use super::config::{DEFAULT_INTENT, Intent, IntentsFile};
use super::embed::{Embedder, dot, normalize};
use super::text::{PromptText, prompt_text};
use crate::hashing::Endpoint;
use serde_json::Value;

/// The intents of a file with their centroids, ready to decide.
pub struct IntentRouter {
    file: IntentsFile,
    embedder: Box<dyn Embedder>,
    /// Per intent (same order as the file): the normalized mean of its examples' embeddings,
    /// `None` for an intent chosen by rule only.
    centroids: Vec<Option<Vec<f32>>>,
}

/// How a request's model was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// The intent's rule matched.
    Rule,
    /// The prompt was nearest this intent's centroid, at or above its threshold.
    Similarity,
    /// No rule matched and no centroid was near enough: the default model.
    Default,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rule => "rule",
            Self::Similarity => "similarity",
            Self::Default => "default",
        }
    }
}

/// The outcome of one decision.
#[derive(Clone, Debug)]
pub struct Choice<'a> {
    /// The intent, or `None` for the default model.
    pub intent: Option<&'a Intent>,
    /// The model the request is rewritten to.
    pub model: &'a str,
    pub via: Via,
    /// The nearest centroid and its similarity, when the classifier ran.
    pub nearest: Option<(&'a str, f32)>,
}

impl Choice<'_> {
    /// The intent's name, or [`DEFAULT_INTENT`].
    pub fn name(&self) -> &str {
        self.intent.map_or(DEFAULT_INTENT, |i| i.name.as_str())
    }
}

impl IntentRouter {
    /// Embeds every example once; the request path then only embeds the prompt.
    pub fn new(file: IntentsFile, embedder: Box<dyn Embedder>) -> Self {
        let centroids = file
            .intents
            .iter()
            .map(|intent| {
                if intent.examples.is_empty() {
                    return None;
                }
                let mut sum = vec![0.0; embedder.dim()];
                for example in &intent.examples {
                    let v = embedder.embed(example);
                    sum.iter_mut().zip(&v).for_each(|(s, x)| *s += x);
                }
                normalize(&mut sum);
                Some(sum)
            })
            .collect();
        Self {
            file,
            embedder,
            centroids,
        }
    }

    pub fn file(&self) -> &IntentsFile {
        &self.file
    }

    pub fn embedder(&self) -> &dyn Embedder {
        self.embedder.as_ref()
    }

    /// Whether a request for `model` asks for intent routing.
    pub fn is_auto(&self, model: &str) -> bool {
        model == self.file.auto_name
    }

    /// Decides the intent of a prompt.
    pub fn decide(&self, text: &PromptText) -> Choice<'_> {
        if let Some(intent) = self.file.intents.iter().find(|intent| {
            intent
                .rule
                .as_ref()
                .is_some_and(|rule| rule_matches(rule, text))
        }) {
            return Choice {
                intent: Some(intent),
                model: &intent.model,
                via: Via::Rule,
                nearest: None,
            };
        }
        let nearest = self.nearest(text);
        match nearest {
            Some((index, score)) if score >= self.file.intents[index].threshold => {
                let intent = &self.file.intents[index];
                Choice {
                    intent: Some(intent),
                    model: &intent.model,
                    via: Via::Similarity,
                    nearest: Some((&intent.name, score)),
                }
            }
            _ => Choice {
                intent: None,
                model: &self.file.default_model,
                via: Via::Default,
                nearest: nearest.map(|(i, score)| (self.file.intents[i].name.as_str(), score)),
            },
        }
    }

    /// The centroid nearest the last user turn among the intents whose length bounds admit
    /// the prompt, with its cosine similarity; `None` when there is no text to embed or no
    /// intent to compare with. Ties go to the intent written first.
    fn nearest(&self, text: &PromptText) -> Option<(usize, f32)> {
        if text.last_user.trim().is_empty() {
            return None;
        }
        let query = self.embedder.embed(&text.last_user);
        let mut best: Option<(usize, f32)> = None;
        for (index, (intent, centroid)) in self.file.intents.iter().zip(&self.centroids).enumerate()
        {
            let Some(centroid) = centroid else { continue };
            if !intent.bounds.admit(text.prompt_tokens) {
                continue;
            }
            let score = dot(&query, centroid);
            if best.is_none_or(|(_, top)| score > top) {
                best = Some((index, score));
            }
        }
        best
    }

    /// For a request whose `model` is the auto name: decides, and rewrites the body to the
    /// chosen model (and, for chat, merges the intent's `chat_template_kwargs`, the client's
    /// own keys winning). Any other request is left alone and gets `None`.
    pub fn route(&self, endpoint: Endpoint, body: &mut Value) -> Option<Choice<'_>> {
        let model = body.get("model").and_then(Value::as_str)?;
        if !self.is_auto(model) {
            return None;
        }
        let choice = self.decide(&prompt_text(endpoint, body));
        apply(&choice, endpoint, body);
        Some(choice)
    }
}

fn rule_matches(rule: &super::config::Rule, text: &PromptText) -> bool {
    rule.bounds.admit(text.prompt_tokens)
        && rule
            .keywords
            .as_ref()
            .is_none_or(|k| k.is_match(&text.last_user))
        && rule
            .regex
            .as_ref()
            .is_none_or(|r| r.is_match(&text.last_user))
}

/// Rewrites `body` for `choice`.
fn apply(choice: &Choice<'_>, endpoint: Endpoint, body: &mut Value) {
    let Some(object) = body.as_object_mut() else {
        return;
    };
    object.insert("model".into(), Value::String(choice.model.to_owned()));
    // Completions have no chat template to pass arguments to.
    let kwargs = choice.intent.map(|i| &i.chat_template_kwargs);
    let Some(kwargs) = kwargs.filter(|k| !k.is_empty() && endpoint == Endpoint::ChatCompletions)
    else {
        return;
    };
    let existing = object
        .entry("chat_template_kwargs")
        .or_insert_with(|| Value::Object(Default::default()));
    // A client's `chat_template_kwargs` of another type is its own error for the engine to
    // report; it is not overwritten.
    if let Some(existing) = existing.as_object_mut() {
        for (key, value) in kwargs {
            existing.entry(key.clone()).or_insert_with(|| value.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intent::embed::NgramEmbedder;
    use proptest::prelude::*;
    use serde_json::json;

    const FILE: &str = r#"
default_model = "general"

[[intent]]
name = "long"
model = "long-context"
min_prompt_tokens = 1000

[[intent]]
name = "code"
model = "coder"
keywords = ["traceback", "segfault"]
examples = [
  "write a python function that reverses a string",
  "fix this rust compile error in my struct",
  "how do I sort a list in javascript",
]
threshold = 0.2

[[intent]]
name = "math"
model = "reasoner"
regex = '^\s*solve\b'
examples = [
  "what is the derivative of x squared",
  "compute the integral of sin x",
  "prove that the square root of two is irrational",
]
threshold = 0.2
chat_template_kwargs = { enable_thinking = true }

[[intent]]
name = "small-talk"
model = "general"
examples = ["hello how are you today", "tell me a fun fact about cats"]
max_prompt_tokens = 50
threshold = 0.2
"#;

    fn router() -> IntentRouter {
        IntentRouter::new(
            IntentsFile::parse(FILE).unwrap(),
            Box::new(NgramEmbedder::default()),
        )
    }

    fn text(s: &str) -> PromptText {
        PromptText {
            last_user: s.into(),
            prompt_tokens: super::super::text::estimate_tokens(s.len()),
        }
    }

    #[test]
    fn rules_come_first_in_file_order() {
        let router = router();
        let choice = router.decide(&text("I got a Traceback when I ran the tests"));
        assert_eq!((choice.name(), choice.via), ("code", Via::Rule));
        let choice = router.decide(&text("solve 3x + 1 = 7"));
        assert_eq!((choice.name(), choice.model), ("math", "reasoner"));
        // A long prompt is `long` whatever it says: that rule is written first.
        let long = PromptText {
            last_user: "segfault".into(),
            prompt_tokens: 5000,
        };
        assert_eq!(router.decide(&long).model, "long-context");
    }

    #[test]
    fn the_nearest_centroid_decides_when_no_rule_matches() {
        let router = router();
        let choice = router.decide(&text("write a python function that sums a list"));
        assert_eq!((choice.name(), choice.via), ("code", Via::Similarity));
        let choice = router.decide(&text("what is the integral of cos x"));
        assert_eq!(choice.name(), "math");
        assert!(choice.nearest.unwrap().1 >= 0.2);
    }

    #[test]
    fn below_the_threshold_the_default_model_serves() {
        let router = router();
        let choice = router.decide(&text("zzz qqq"));
        assert_eq!(choice.via, Via::Default);
        assert_eq!(choice.model, "general");
        assert_eq!(choice.name(), DEFAULT_INTENT);
        assert_eq!(router.decide(&text("")).nearest, None);
    }

    #[test]
    fn bounds_keep_the_classifier_from_an_intent() {
        let router = router();
        let short = router.decide(&text("hello how are you today"));
        assert_eq!(short.name(), "small-talk");
        let long = router.decide(&PromptText {
            last_user: "hello how are you today".into(),
            prompt_tokens: 60,
        });
        assert_ne!(long.nearest.map(|n| n.0), Some("small-talk"));
    }

    #[test]
    fn route_rewrites_only_auto_requests() {
        let router = router();
        let mut body = json!({"model": "auto", "messages": [
            {"role": "user", "content": "solve x^2 = 9"}
        ], "chat_template_kwargs": {"enable_thinking": false, "other": 1}});
        let choice = router.route(Endpoint::ChatCompletions, &mut body).unwrap();
        assert_eq!(choice.name(), "math");
        assert_eq!(body["model"], "reasoner");
        // The client's own value wins; nothing of its own is dropped.
        assert_eq!(
            body["chat_template_kwargs"],
            json!({"enable_thinking": false, "other": 1})
        );
        let mut body = json!({"model": "auto", "messages": [
            {"role": "user", "content": "solve x^2 = 9"}
        ]});
        router.route(Endpoint::ChatCompletions, &mut body).unwrap();
        assert_eq!(
            body["chat_template_kwargs"],
            json!({"enable_thinking": true})
        );
        // Completions get the model but no chat-template arguments.
        let mut body = json!({"model": "auto", "prompt": "solve 2x = 4"});
        router.route(Endpoint::Completions, &mut body).unwrap();
        assert_eq!(body, json!({"model": "reasoner", "prompt": "solve 2x = 4"}));
        for other in [
            json!({"model": "coder", "prompt": "x"}),
            json!({"prompt": "x"}),
        ] {
            let mut body = other.clone();
            assert!(router.route(Endpoint::Completions, &mut body).is_none());
            assert_eq!(body, other);
        }
    }

    proptest! {
        /// Whatever the prompt, the choice is a model of the file (never the auto name) and
        /// agrees with the intent it names.
        #[test]
        fn every_choice_is_a_configured_model(prompt in "\\PC{0,200}", tokens in 0u64..3000) {
            let router = router();
            let choice = router.decide(&PromptText { last_user: prompt, prompt_tokens: tokens });
            match choice.intent {
                Some(intent) => prop_assert_eq!(choice.model, intent.model.as_str()),
                None => {
                    prop_assert_eq!(choice.model, "general");
                    prop_assert_eq!(choice.via, Via::Default);
                }
            }
            if choice.via == Via::Similarity {
                let (name, score) = choice.nearest.unwrap();
                prop_assert_eq!(name, choice.name());
                prop_assert!(score >= choice.intent.unwrap().threshold);
                prop_assert!(choice.intent.unwrap().bounds.admit(tokens));
            }
        }
    }
}
