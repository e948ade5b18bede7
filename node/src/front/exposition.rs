//! `/metrics` in the format the scraper asked for.
//!
//! prometheus-client writes OpenMetrics, which Prometheus asks for first. Everything else
//! (curl, `promtool check metrics`, older scrapers) reads the Prometheus text format 0.0.4,
//! where OpenMetrics' differences make for a wrong reading: a counter family `x` whose samples
//! are `x_total` looks like an untyped `x_total` without help, and `# EOF` is not a comment.
//! So a request that does not accept `application/openmetrics-text` gets the text format,
//! as Prometheus' own Go client does.

/// Content types of the two formats.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether an `Accept` header asks for OpenMetrics.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|accept| {
        accept.split(',').any(|range| {
            let mut params = range.split(';').map(str::trim);
            let media = params.next().unwrap_or_default();
            // `q=0` means "not acceptable"; an unreadable weight counts as not acceptable too.
            let quality = params
                .find_map(|p| p.strip_prefix("q="))
                .map_or(Some(1.0), |q| q.trim().parse::<f32>().ok());
            media.eq_ignore_ascii_case("application/openmetrics-text")
                && quality.is_some_and(|q| q > 0.0)
        })
    })
}

/// Rewrites prometheus-client's OpenMetrics output as text format 0.0.4: counter families
/// take their samples' `_total` name in `# HELP` and `# TYPE`, `unknown` becomes `untyped`,
/// and the `# UNIT` and `# EOF` lines go. The families kvmesh registers (counters, gauges,
/// histograms, no exemplars, no `_created`) need nothing else.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let rewritten = match line
            .strip_prefix("# HELP ")
            .or(line.strip_prefix("# TYPE "))
        {
            Some(rest) => {
                let keyword = &line[..7];
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let name = if counters.contains(name) && !name.ends_with("_total") {
                    format!("{name}_total")
                } else {
                    name.to_string()
                };
                let tail = if keyword == "# TYPE " && tail == "unknown" {
                    "untyped"
                } else {
                    tail
                };
                format!("{keyword}{name} {tail}")
            }
            None => line.to_string(),
        };
        out.push_str(&rewritten);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::registry::Registry;

    #[test]
    fn negotiates_openmetrics_only_when_asked() {
        let prometheus = "application/openmetrics-text;version=1.0.0;q=0.5,\
                          application/openmetrics-text;version=0.0.1;q=0.4,\
                          text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert!(wants_openmetrics(Some(prometheus)));
        assert!(wants_openmetrics(Some("application/openmetrics-text")));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(Some("text/plain")));
        assert!(!wants_openmetrics(Some(
            "application/openmetrics-text; q=0"
        )));
        assert!(!wants_openmetrics(Some(
            "application/openmetrics-text;q=0.0"
        )));
        assert!(!wants_openmetrics(None));
    }

    #[test]
    fn counters_are_named_by_their_samples_and_openmetrics_markers_go() {
        let mut registry = Registry::default();
        let counter = Counter::<u64>::default();
        counter.inc_by(3);
        registry.register("kvmesh_retries", "Attempts retried", counter);
        let gauge = Gauge::<i64>::default();
        gauge.set(2);
        registry.register("kvmesh_peers", "Peers", gauge);
        let mut openmetrics = String::new();
        prometheus_client::encoding::text::encode(&mut openmetrics, &registry).unwrap();
        assert!(
            openmetrics.contains("# TYPE kvmesh_retries counter\n"),
            "{openmetrics}"
        );

        let text = to_prometheus_text(&openmetrics);
        assert_eq!(
            text,
            "# HELP kvmesh_retries_total Attempts retried.\n\
             # TYPE kvmesh_retries_total counter\n\
             kvmesh_retries_total 3\n\
             # HELP kvmesh_peers Peers.\n\
             # TYPE kvmesh_peers gauge\n\
             kvmesh_peers 2\n"
        );
    }
}
