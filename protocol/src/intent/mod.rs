//! Intent routing: a request for the virtual model (`model: "auto"`) is given a real model by
//! what it asks.
//!
//! - [`config`]: the intents file, parsed and validated.
//! - [`text`]: what of a request is read (the last user turn, the prompt's size).
//! - [`embed`]: text into unit vectors: hashed character n-grams, or a static embedding model.
//! - [`decide`]: rules first, then the nearest centroid of each intent's examples, above the
//!   intent's threshold; otherwise the default model. Then the body is rewritten.
//!
//! - [`eval`]: accuracy and the confusion matrix over labelled prompts.
//!
//! All of it is pure: the node reads the files and hands the text in.

pub mod config;
pub mod decide;
pub mod embed;
pub mod eval;
pub mod text;

pub use config::{ConfigError, DEFAULT_AUTO_NAME, DEFAULT_INTENT, Intent, IntentsFile};
pub use decide::{Choice, IntentRouter, Via};
pub use embed::{Embedder, NgramEmbedder, StaticEmbedding, TokenIds};
pub use text::{PromptText, prompt_text};
