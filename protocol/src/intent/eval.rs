//! Measuring an intents file on labelled prompts: accuracy and the confusion matrix
//! (`kvmesh intents eval`, and the test that keeps the shipped prompt set's accuracy up).

use super::config::DEFAULT_INTENT;
use super::decide::{IntentRouter, Via};
use super::text::{PromptText, estimate_tokens};
use std::fmt;

/// One labelled prompt: the intent it should get (`default` for none) and its text, asked as
/// a single user turn.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct Labelled {
    pub intent: String,
    pub prompt: String,
}

/// Counts of expected × decided intents.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The file's intents, then `default`: rows (expected) and columns (decided).
    pub labels: Vec<String>,
    /// `matrix[expected][decided]`.
    pub matrix: Vec<Vec<usize>>,
    /// Prompts whose label is none of `labels` (a typo in the prompt set), not counted.
    pub unknown_labels: usize,
    /// Decisions made by a rule, by similarity, or by falling to the default.
    pub via_rule: usize,
    pub via_similarity: usize,
    pub via_default: usize,
}

impl Report {
    pub fn total(&self) -> usize {
        self.matrix.iter().flatten().sum()
    }

    pub fn correct(&self) -> usize {
        (0..self.labels.len()).map(|i| self.matrix[i][i]).sum()
    }

    /// Share of prompts given their labelled intent (0 for no prompt).
    pub fn accuracy(&self) -> f64 {
        match self.total() {
            0 => 0.0,
            total => self.correct() as f64 / total as f64,
        }
    }
}

/// Decides every prompt and tallies the outcomes.
pub fn evaluate(router: &IntentRouter, prompts: &[Labelled]) -> Report {
    let labels: Vec<String> = router
        .file()
        .intents
        .iter()
        .map(|i| i.name.clone())
        .chain([DEFAULT_INTENT.to_owned()])
        .collect();
    let index = |name: &str| labels.iter().position(|l| l == name);
    let mut report = Report {
        matrix: vec![vec![0; labels.len()]; labels.len()],
        labels: labels.clone(),
        unknown_labels: 0,
        via_rule: 0,
        via_similarity: 0,
        via_default: 0,
    };
    for labelled in prompts {
        let Some(expected) = index(&labelled.intent) else {
            report.unknown_labels += 1;
            continue;
        };
        let choice = router.decide(&PromptText {
            last_user: labelled.prompt.clone(),
            prompt_tokens: estimate_tokens(labelled.prompt.len()),
        });
        match choice.via {
            Via::Rule => report.via_rule += 1,
            Via::Similarity => report.via_similarity += 1,
            Via::Default => report.via_default += 1,
        }
        // Every decided name is a label: an intent of the file or `default`.
        if let Some(decided) = index(choice.name()) {
            report.matrix[expected][decided] += 1;
        }
    }
    report
}

impl fmt::Display for Report {
    /// The confusion matrix, rows expected and columns decided, then the accuracy.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .labels
            .iter()
            .map(String::len)
            .max()
            .unwrap_or(0)
            .max(8);
        write!(f, "{:width$}", "expected\\got")?;
        for label in &self.labels {
            write!(f, " {label:>width$}")?;
        }
        writeln!(f)?;
        for (label, row) in self.labels.iter().zip(&self.matrix) {
            write!(f, "{label:width$}")?;
            for count in row {
                write!(f, " {count:>width$}")?;
            }
            writeln!(f)?;
        }
        writeln!(
            f,
            "accuracy {}/{} = {:.1}% (by rule {}, by similarity {}, default {})",
            self.correct(),
            self.total(),
            100.0 * self.accuracy(),
            self.via_rule,
            self.via_similarity,
            self.via_default,
        )?;
        if self.unknown_labels > 0 {
            writeln!(f, "{} prompts had an unknown label", self.unknown_labels)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intent::{IntentsFile, NgramEmbedder};

    #[test]
    fn the_matrix_counts_expected_against_decided() {
        let file = IntentsFile::parse(
            "default_model = \"g\"\n[[intent]]\nname = \"math\"\nmodel = \"m\"\nkeywords = [\"integral\"]\n",
        )
        .unwrap();
        let router = IntentRouter::new(file, Box::new(NgramEmbedder::default()));
        let prompt = |intent: &str, prompt: &str| Labelled {
            intent: intent.into(),
            prompt: prompt.into(),
        };
        let report = evaluate(
            &router,
            &[
                prompt("math", "an integral"),
                prompt("math", "a derivative"),
                prompt("default", "hello"),
                prompt("mth", "typo"),
            ],
        );
        assert_eq!(report.labels, ["math", "default"]);
        assert_eq!(report.matrix, vec![vec![1, 1], vec![0, 1]]);
        assert_eq!((report.correct(), report.total()), (2, 3));
        assert_eq!(report.unknown_labels, 1);
        assert_eq!((report.via_rule, report.via_default), (1, 2));
        let shown = report.to_string();
        assert!(shown.contains("accuracy 2/3 = 66.7%"), "{shown}");
    }
}
