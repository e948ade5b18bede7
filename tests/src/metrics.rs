//! Reading samples out of Prometheus text exposition (the sidecar's and the engine's /metrics).

/// The sum of all samples of metric `name` whose labels include every `(label, value)` of
/// `labels`; `None` if no such sample exists.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut sum = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (label_text, value_text) = if let Some(after_brace) = rest.strip_prefix('{') {
            match after_brace.rsplit_once('}') {
                Some((label_text, value_text)) => (label_text, value_text),
                None => continue,
            }
        } else if rest.starts_with(' ') {
            ("", rest)
        } else {
            continue; // a longer name sharing this prefix
        };
        if !labels
            .iter()
            .all(|(label, value)| label_text.contains(&format!("{label}=\"{value}\"")))
        {
            continue;
        }
        // `value [timestamp]`
        let Some(value) = value_text
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        *sum.get_or_insert(0.0) += value;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::metric_sum;

    const TEXT: &str = "# HELP x_total doc\n\
        x_total{reason=\"a\",outcome=\"ok\"} 3\n\
        x_total{reason=\"b\",outcome=\"ok\"} 4.5\n\
        x_total_created 17\n\
        peers 2 1700000000\n";

    #[test]
    fn sums_matching_samples_only() {
        assert_eq!(metric_sum(TEXT, "x_total", &[]), Some(7.5));
        assert_eq!(metric_sum(TEXT, "x_total", &[("reason", "b")]), Some(4.5));
        assert_eq!(metric_sum(TEXT, "x_total", &[("reason", "c")]), None);
        assert_eq!(metric_sum(TEXT, "peers", &[]), Some(2.0));
        assert_eq!(metric_sum(TEXT, "missing", &[]), None);
    }
}
