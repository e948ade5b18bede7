//! The intents file: virtual models (`model: "auto"`) resolved to real ones by rules and by
//! similarity to example prompts. Parsed from TOML text and validated here, so that every
//! mistake is a startup error naming the intent and the field at fault, never a surprise on
//! the request path.

use regex::Regex;
use serde::Deserialize;
use serde_json::{Map, Value};

/// The name an intents file answers to when it sets no `auto_name`.
pub const DEFAULT_AUTO_NAME: &str = "auto";

/// What `x-kvmesh-intent` and the metric say when no intent claimed a request: reserved, so an
/// intent may not be called that.
pub const DEFAULT_INTENT: &str = "default";

/// The file as written. Unknown keys are refused: a misspelt `treshold` must not silently
/// fall back to the default.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    default_model: String,
    auto_name: Option<String>,
    #[serde(default, rename = "intent")]
    intents: Vec<RawIntent>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIntent {
    name: String,
    model: String,
    #[serde(default)]
    examples: Vec<String>,
    #[serde(default)]
    keywords: Vec<String>,
    regex: Option<String>,
    min_prompt_tokens: Option<u64>,
    max_prompt_tokens: Option<u64>,
    threshold: Option<f32>,
    chat_template_kwargs: Option<toml::Table>,
}

/// A validated intents file.
#[derive(Clone, Debug)]
pub struct IntentsFile {
    /// The model of requests no intent claims.
    pub default_model: String,
    /// The `model` value that asks for intent routing.
    pub auto_name: String,
    /// In file order: rules are tried in this order, the first that matches wins.
    pub intents: Vec<Intent>,
}

/// One intent, validated.
#[derive(Clone, Debug)]
pub struct Intent {
    pub name: String,
    pub model: String,
    /// Utterances typical of the intent; their embeddings' centroid classifies prompts.
    pub examples: Vec<String>,
    /// The rule, if any condition was given.
    pub rule: Option<Rule>,
    /// The prompt-length bounds, which also keep the classifier from choosing this intent for
    /// a prompt outside them.
    pub bounds: Bounds,
    /// Below this cosine similarity to the centroid, the classifier does not choose this
    /// intent (the request goes to the default model).
    pub threshold: f32,
    /// Added to a chat request's `chat_template_kwargs` (the client's own keys win).
    pub chat_template_kwargs: Map<String, Value>,
}

/// Inclusive bounds on a prompt's estimated token count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bounds {
    pub min: Option<u64>,
    pub max: Option<u64>,
}

impl Bounds {
    pub fn admit(&self, tokens: u64) -> bool {
        self.min.is_none_or(|min| tokens >= min) && self.max.is_none_or(|max| tokens <= max)
    }

    pub fn is_set(&self) -> bool {
        self.min.is_some() || self.max.is_some()
    }
}

/// An intent's rule: it matches when every condition given holds (any keyword, the regex,
/// the length bounds). Length bounds alone make a rule only for an intent with no examples.
#[derive(Clone, Debug)]
pub struct Rule {
    /// The keywords as one case-insensitive pattern, whole words where a keyword starts or
    /// ends with a word character (so `sum` does not match "summer", and `c++` still matches).
    pub keywords: Option<Regex>,
    pub regex: Option<Regex>,
    pub bounds: Bounds,
}

/// Why an intents file was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("not a valid intents file: {0}")]
    Syntax(String),
    #[error("`default_model` must not be empty")]
    EmptyDefaultModel,
    #[error("`auto_name` must not be empty")]
    EmptyAutoName,
    #[error("`default_model` is `{0}`, the auto name itself: requests no intent claims would loop")]
    DefaultIsAuto(String),
    #[error("the file defines no `[[intent]]`")]
    NoIntents,
    #[error("intent #{0}: `name` must not be empty")]
    EmptyName(usize),
    #[error("intent `{0}`: the name is used twice")]
    DuplicateName(String),
    #[error("intent `{0}`: the name is reserved for requests no intent claims")]
    ReservedName(String),
    #[error("intent `{0}`: `model` must not be empty")]
    EmptyModel(String),
    #[error("intent `{0}`: `model` is the auto name itself")]
    ModelIsAuto(String),
    #[error("intent `{0}`: it has no `examples` and no rule, so nothing can ever choose it")]
    Unreachable(String),
    #[error("intent `{0}`: example #{1} is empty")]
    EmptyExample(String, usize),
    #[error("intent `{0}`: keyword #{1} is empty")]
    EmptyKeyword(String, usize),
    #[error("intent `{name}`: `regex` is invalid: {why}")]
    BadRegex { name: String, why: String },
    #[error("intent `{0}`: `min_prompt_tokens` is above `max_prompt_tokens`")]
    EmptyBounds(String),
    #[error("intent `{0}`: `threshold` must be a number from -1 to 1 (a cosine similarity)")]
    BadThreshold(String),
    #[error("intent `{name}`: `chat_template_kwargs`: {why}")]
    BadKwargs { name: String, why: String },
}

impl IntentsFile {
    /// Parses and validates the text of an intents file.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let raw: RawFile = toml::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
        let auto_name = raw.auto_name.unwrap_or_else(|| DEFAULT_AUTO_NAME.into());
        if auto_name.is_empty() {
            return Err(ConfigError::EmptyAutoName);
        }
        if raw.default_model.is_empty() {
            return Err(ConfigError::EmptyDefaultModel);
        }
        if raw.default_model == auto_name {
            return Err(ConfigError::DefaultIsAuto(auto_name));
        }
        if raw.intents.is_empty() {
            return Err(ConfigError::NoIntents);
        }
        let mut intents: Vec<Intent> = Vec::with_capacity(raw.intents.len());
        for (index, raw) in raw.intents.into_iter().enumerate() {
            let intent = validate_intent(index + 1, raw, &auto_name)?;
            if intents.iter().any(|other| other.name == intent.name) {
                return Err(ConfigError::DuplicateName(intent.name));
            }
            intents.push(intent);
        }
        Ok(Self {
            default_model: raw.default_model,
            auto_name,
            intents,
        })
    }
}

fn validate_intent(number: usize, raw: RawIntent, auto_name: &str) -> Result<Intent, ConfigError> {
    let name = raw.name;
    if name.is_empty() {
        return Err(ConfigError::EmptyName(number));
    }
    if name == DEFAULT_INTENT {
        return Err(ConfigError::ReservedName(name));
    }
    if raw.model.is_empty() {
        return Err(ConfigError::EmptyModel(name));
    }
    if raw.model == auto_name {
        return Err(ConfigError::ModelIsAuto(name));
    }
    if let Some(i) = raw.examples.iter().position(|e| e.trim().is_empty()) {
        return Err(ConfigError::EmptyExample(name, i + 1));
    }
    let bounds = Bounds {
        min: raw.min_prompt_tokens,
        max: raw.max_prompt_tokens,
    };
    if let (Some(min), Some(max)) = (bounds.min, bounds.max)
        && min > max
    {
        return Err(ConfigError::EmptyBounds(name));
    }
    let threshold = raw.threshold.unwrap_or(0.0);
    if !(-1.0..=1.0).contains(&threshold) {
        return Err(ConfigError::BadThreshold(name));
    }
    let keywords = keyword_pattern(&name, &raw.keywords)?;
    let regex = match raw.regex {
        None => None,
        Some(pattern) => Some(Regex::new(&pattern).map_err(|e| ConfigError::BadRegex {
            name: name.clone(),
            why: e.to_string(),
        })?),
    };
    // Bounds alone are a rule only for an intent without examples (a long-context model for
    // every long prompt); with examples they only keep the classifier within them.
    let bounds_rule = bounds.is_set() && raw.examples.is_empty();
    let rule = (keywords.is_some() || regex.is_some() || bounds_rule).then_some(Rule {
        keywords,
        regex,
        bounds,
    });
    if rule.is_none() && raw.examples.is_empty() {
        return Err(ConfigError::Unreachable(name));
    }
    let chat_template_kwargs = match raw.chat_template_kwargs {
        None => Map::new(),
        Some(table) => match serde_json::to_value(table) {
            Ok(Value::Object(map)) => map,
            // A TOML table always converts to an object; a datetime is the one value that
            // JSON has no form for, and it is refused here rather than sent as a string.
            Ok(_) | Err(_) => {
                return Err(ConfigError::BadKwargs {
                    name,
                    why: "not representable as a JSON object".into(),
                });
            }
        },
    };
    if let Some(why) = datetime_in(&chat_template_kwargs) {
        return Err(ConfigError::BadKwargs { name, why });
    }
    Ok(Intent {
        name,
        model: raw.model,
        examples: raw.examples,
        rule,
        bounds,
        threshold,
        chat_template_kwargs,
    })
}

/// The `toml` crate turns a datetime into a JSON object with one magic key; the engine would
/// receive that. Datetimes are refused instead.
fn datetime_in(map: &Map<String, Value>) -> Option<String> {
    map.iter().find_map(|(key, value)| match value {
        Value::Object(inner) if inner.contains_key("$__toml_private_datetime") => {
            Some(format!("`{key}` is a datetime, which JSON cannot carry"))
        }
        Value::Object(inner) => datetime_in(inner),
        _ => None,
    })
}

fn keyword_pattern(name: &str, keywords: &[String]) -> Result<Option<Regex>, ConfigError> {
    if keywords.is_empty() {
        return Ok(None);
    }
    let mut alternatives = Vec::with_capacity(keywords.len());
    for (i, keyword) in keywords.iter().enumerate() {
        let keyword = keyword.trim();
        if keyword.is_empty() {
            return Err(ConfigError::EmptyKeyword(name.into(), i + 1));
        }
        let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        let start = if word(keyword.chars().next()) {
            r"\b"
        } else {
            ""
        };
        let end = if word(keyword.chars().last()) {
            r"\b"
        } else {
            ""
        };
        alternatives.push(format!("{start}{}{end}", regex::escape(keyword)));
    }
    let pattern = format!("(?i)(?:{})", alternatives.join("|"));
    Regex::new(&pattern)
        .map(Some)
        .map_err(|e| ConfigError::BadRegex {
            name: name.into(),
            why: format!("keywords: {e}"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
default_model = "general"

[[intent]]
name = "code"
model = "coder"
examples = ["write a python function"]
"#;

    fn error(text: &str) -> ConfigError {
        IntentsFile::parse(text).unwrap_err()
    }

    #[test]
    fn a_minimal_file_takes_the_defaults() {
        let file = IntentsFile::parse(MINIMAL).unwrap();
        assert_eq!(file.auto_name, "auto");
        assert_eq!(file.default_model, "general");
        let code = &file.intents[0];
        assert_eq!(code.threshold, 0.0);
        assert!(code.rule.is_none());
        assert!(code.chat_template_kwargs.is_empty());
    }

    #[test]
    fn every_field_is_read() {
        let file = IntentsFile::parse(
            r#"
default_model = "general"
auto_name = "router"

[[intent]]
name = "math"
model = "reasoner"
examples = ["solve x^2 = 4"]
keywords = ["integral", "c++"]
regex = '\d+\s*[+*/-]\s*\d+'
min_prompt_tokens = 2
max_prompt_tokens = 4000
threshold = 0.35
chat_template_kwargs = { enable_thinking = true, budget = { tokens = 512 } }
"#,
        )
        .unwrap();
        assert_eq!(file.auto_name, "router");
        let math = &file.intents[0];
        let rule = math.rule.as_ref().unwrap();
        assert_eq!(
            rule.bounds,
            Bounds {
                min: Some(2),
                max: Some(4000)
            }
        );
        assert!(rule.regex.as_ref().unwrap().is_match("what is 12 * 7"));
        assert_eq!(math.threshold, 0.35);
        assert_eq!(
            Value::Object(math.chat_template_kwargs.clone()),
            serde_json::json!({"enable_thinking": true, "budget": {"tokens": 512}})
        );
    }

    #[test]
    fn keywords_match_whole_words_case_insensitively() {
        let pattern = keyword_pattern("x", &["sum".into(), "C++".into(), "```".into()])
            .unwrap()
            .unwrap();
        assert!(pattern.is_match("What is the SUM of 2 and 3"));
        assert!(!pattern.is_match("a poem about summer"));
        assert!(pattern.is_match("port this c++ class"));
        assert!(pattern.is_match("fix:```rust"));
        assert!(!pattern.is_match("nothing here"));
    }

    #[test]
    fn mistakes_are_named() {
        let intent = |body: &str| format!("default_model = \"g\"\n[[intent]]\n{body}\n");
        let cases: Vec<(String, ConfigError)> = vec![
            (
                "default_model = \"\"\n".into(),
                ConfigError::EmptyDefaultModel,
            ),
            ("default_model = \"g\"\n".into(), ConfigError::NoIntents),
            (
                "default_model = \"auto\"\n".into(),
                ConfigError::DefaultIsAuto("auto".into()),
            ),
            (
                "default_model = \"g\"\nauto_name = \"\"\n".into(),
                ConfigError::EmptyAutoName,
            ),
            (
                intent("name = \"\"\nmodel = \"m\"\nexamples = [\"x\"]"),
                ConfigError::EmptyName(1),
            ),
            (
                intent("name = \"default\"\nmodel = \"m\"\nexamples = [\"x\"]"),
                ConfigError::ReservedName("default".into()),
            ),
            (
                intent("name = \"a\"\nmodel = \"\"\nexamples = [\"x\"]"),
                ConfigError::EmptyModel("a".into()),
            ),
            (
                intent("name = \"a\"\nmodel = \"auto\"\nexamples = [\"x\"]"),
                ConfigError::ModelIsAuto("a".into()),
            ),
            (
                intent("name = \"a\"\nmodel = \"m\""),
                ConfigError::Unreachable("a".into()),
            ),
            (
                intent("name = \"a\"\nmodel = \"m\"\nexamples = [\"x\", \" \"]"),
                ConfigError::EmptyExample("a".into(), 2),
            ),
            (
                intent("name = \"a\"\nmodel = \"m\"\nkeywords = [\"\"]"),
                ConfigError::EmptyKeyword("a".into(), 1),
            ),
            (
                intent("name = \"a\"\nmodel = \"m\"\nmin_prompt_tokens = 9\nmax_prompt_tokens = 3"),
                ConfigError::EmptyBounds("a".into()),
            ),
            (
                intent("name = \"a\"\nmodel = \"m\"\nexamples = [\"x\"]\nthreshold = 1.5"),
                ConfigError::BadThreshold("a".into()),
            ),
            (
                intent(
                    "name = \"a\"\nmodel = \"m\"\nexamples = [\"x\"]\nchat_template_kwargs = { at = 1979-05-27 }",
                ),
                ConfigError::BadKwargs {
                    name: "a".into(),
                    why: "`at` is a datetime, which JSON cannot carry".into(),
                },
            ),
            (
                format!(
                    "{}[[intent]]\nname = \"a\"\nmodel = \"n\"\nexamples = [\"y\"]\n",
                    intent("name = \"a\"\nmodel = \"m\"\nexamples = [\"x\"]")
                ),
                ConfigError::DuplicateName("a".into()),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(error(&text), expected, "{text}");
        }
        match error(&intent("name = \"a\"\nmodel = \"m\"\nregex = \"(\"")) {
            ConfigError::BadRegex { name, .. } => assert_eq!(name, "a"),
            other => panic!("{other:?}"),
        }
        for bad in [
            "default_model = \"g\"\ntreshold = 1\n",
            &intent("name = \"a\"\nmodel = \"m\"\nexamples = [\"x\"]\ntreshold = 0.2"),
            "default_model = 3\n",
            "not toml at all [",
        ] {
            assert!(matches!(error(bad), ConfigError::Syntax(_)), "{bad}");
        }
    }
}
