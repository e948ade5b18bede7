//! Reading samples out of a Prometheus text exposition (format 0.0.4, and the sample lines of
//! OpenMetrics): `name{label="value",...} value [timestamp]`, one per line.
//!
//! Lenient by design: comments, blank lines and malformed lines are skipped, never an error,
//! so that a scrape does not fail because an engine added an exotic series. What the series
//! mean is for the caller ([`crate::engine_metrics`] for vLLM's).

/// One sample line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    /// The label set between the braces, unparsed (see [`Sample::label`]); empty without one.
    pub labels: &'a str,
    /// As written: may be infinite or NaN.
    pub value: f64,
}

impl<'a> Sample<'a> {
    /// The value of label `key`, escapes (`\"`, `\\`, `\n`) left as written.
    pub fn label(&self, key: &str) -> Option<&'a str> {
        labels(self.labels).find(|&(k, _)| k == key).map(|(_, v)| v)
    }

    /// Whether the sample carries every `(label, value)` of `wanted`.
    pub fn has_labels(&self, wanted: &[(&str, &str)]) -> bool {
        wanted
            .iter()
            .all(|&(key, value)| self.label(key) == Some(value))
    }
}

/// Every well-formed sample of `text`, in order.
pub fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines().filter_map(|line| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        sample(line)
    })
}

/// The sum of the samples of metric `name` that carry every label of `wanted`; `None` when
/// there is none.
pub fn sum(text: &str, name: &str, wanted: &[(&str, &str)]) -> Option<f64> {
    samples(text)
        .filter(|s| s.name == name && s.has_labels(wanted))
        .fold(None, |total, s| Some(total.unwrap_or(0.0) + s.value))
}

/// `name{labels} value [timestamp]` → its parts.
fn sample(line: &str) -> Option<Sample<'_>> {
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let (labels, rest) = match line[name_end..].strip_prefix('{') {
        // Label values may hold spaces and braces; the value and timestamp hold neither.
        Some(after) => {
            let close = after.rfind('}')?;
            (&after[..close], &after[close + 1..])
        }
        None => ("", &line[name_end..]),
    };
    let value = rest.split_whitespace().next()?.parse().ok()?;
    (!name.is_empty()).then_some(Sample {
        name,
        labels,
        value,
    })
}

/// The `(key, value)` pairs of a label set like `a="1", b="x,\"y\""`; stops at the first
/// malformed pair.
fn labels(mut rest: &str) -> impl Iterator<Item = (&str, &str)> {
    std::iter::from_fn(move || {
        let (key, after) = rest.split_once('=')?;
        let key = key.trim_start_matches([',', ' ']).trim();
        let after = after.trim_start().strip_prefix('"')?;
        // The closing quote is the first one not escaped by a backslash.
        let mut escaped = false;
        let end = after.char_indices().find_map(|(i, c)| match (c, escaped) {
            ('\\', false) => {
                escaped = true;
                None
            }
            ('"', false) => Some(i),
            _ => {
                escaped = false;
                None
            }
        })?;
        rest = &after[end + 1..];
        Some((key, &after[..end]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP x_total doc\n\
        x_total{reason=\"a\",outcome=\"ok\"} 3\n\
        x_total{reason=\"b\",outcome=\"ok\"} 4.5\n\
        x_total_created 17\n\
        \n\
        peers 2 1700000000\n\
        q{model_name=\"a \\\"b\\\" {c}\",le=\"+Inf\"} 5\n";

    #[test]
    fn sums_matching_samples_only() {
        assert_eq!(sum(TEXT, "x_total", &[]), Some(7.5));
        assert_eq!(sum(TEXT, "x_total", &[("reason", "b")]), Some(4.5));
        assert_eq!(sum(TEXT, "x_total", &[("reason", "c")]), None);
        assert_eq!(sum(TEXT, "peers", &[]), Some(2.0));
        assert_eq!(sum(TEXT, "missing", &[]), None);
    }

    #[test]
    fn labels_may_hold_escaped_quotes_commas_and_braces() {
        let q = samples(TEXT).find(|s| s.name == "q").unwrap();
        assert_eq!(q.label("model_name"), Some("a \\\"b\\\" {c}"));
        assert_eq!(q.label("le"), Some("+Inf"));
        assert_eq!(q.value, 5.0);
        let spaced = samples("m{ a = \"x,y\" , b=\"2\"} 1").next().unwrap();
        assert_eq!(
            (spaced.label("a"), spaced.label("b")),
            (Some("x,y"), Some("2"))
        );
    }

    #[test]
    fn malformed_lines_are_skipped() {
        let text = "m{oops 1\nnot a metric\nm x\n{a=\"1\"} 2\nok 3\n";
        let names: Vec<&str> = samples(text).map(|s| s.name).collect();
        assert_eq!(names, ["ok"]);
    }
}
