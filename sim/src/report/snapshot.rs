//! One engine's `/metrics` at one instant: the gauges and counters the report charts.
//!
//! The load generator's own scrape (`load::scrape`) reads only the three counters its report
//! needs, before and after a run; the report also wants queue depth over time and the
//! engine-side TTFT histogram, so it reads them here from the same Prometheus text.

use serde::{Deserialize, Serialize};

/// What the report keeps of one engine's exposition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineSnapshot {
    /// `vllm:num_requests_running`.
    pub running: f64,
    /// `vllm:num_requests_waiting`.
    pub waiting: f64,
    /// `vllm:kv_cache_usage_perc` (0..1).
    pub kv_usage: f64,
    /// `vllm:request_success_total`, all finish reasons.
    pub requests: f64,
    /// `vllm:prefix_cache_hits_total` (tokens).
    pub hits: f64,
    /// `vllm:prefix_cache_queries_total` (tokens).
    pub queries: f64,
    /// Cumulative `vllm:time_to_first_token_seconds` buckets: (upper bound, count), ascending,
    /// without `+Inf`.
    pub ttft_buckets: Vec<(f64, f64)>,
    /// `vllm:time_to_first_token_seconds_count`.
    pub ttft_count: f64,
}

/// Parses the series the report needs, summing over label sets (engines of a DP group,
/// finish reasons). Falls back to the pre-0.12 `vllm:gpu_prefix_cache_*` names.
pub fn parse(text: &str) -> EngineSnapshot {
    let mut s = EngineSnapshot::default();
    let (mut hits_old, mut queries_old) = (0.0, 0.0);
    let (mut saw_hits, mut saw_queries) = (false, false);
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((name, labels, value)) = split_sample(line) else {
            continue;
        };
        match name {
            "vllm:num_requests_running" => s.running += value,
            "vllm:num_requests_waiting" => s.waiting += value,
            "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" => {
                s.kv_usage = s.kv_usage.max(value);
            }
            "vllm:request_success_total" => s.requests += value,
            "vllm:prefix_cache_hits_total" => {
                saw_hits = true;
                s.hits += value;
            }
            "vllm:prefix_cache_queries_total" => {
                saw_queries = true;
                s.queries += value;
            }
            "vllm:gpu_prefix_cache_hits_total" | "vllm:gpu_prefix_cache_hits" => {
                hits_old += value;
            }
            "vllm:gpu_prefix_cache_queries_total" | "vllm:gpu_prefix_cache_queries" => {
                queries_old += value;
            }
            "vllm:time_to_first_token_seconds_count" => s.ttft_count += value,
            "vllm:time_to_first_token_seconds_bucket" => {
                let Some(le) = label(labels, "le") else {
                    continue;
                };
                let Ok(le) = le.parse::<f64>() else { continue };
                if !le.is_finite() {
                    continue;
                }
                match s.ttft_buckets.iter_mut().find(|(b, _)| *b == le) {
                    Some((_, n)) => *n += value,
                    None => s.ttft_buckets.push((le, value)),
                }
            }
            _ => {}
        }
    }
    if !saw_hits {
        s.hits = hits_old;
    }
    if !saw_queries {
        s.queries = queries_old;
    }
    s.ttft_buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    s
}

/// Splits `name{labels} value [timestamp]` into its parts (labels may hold spaces in quotes).
fn split_sample(line: &str) -> Option<(&str, &str, f64)> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let (labels, rest) = match line[name_end..].strip_prefix('{') {
        Some(r) => {
            let close = r.rfind('}')?;
            (&r[..close], &r[close + 1..])
        }
        None => ("", &line[name_end..]),
    };
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    Some((name, labels, value))
}

/// The value of `key="..."` in a label set.
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    while let Some(eq) = rest.find("=\"") {
        let k = rest[..eq].trim_start_matches([',', ' ']).trim();
        let after = &rest[eq + 2..];
        // Values escape `"` as `\"`; find the closing quote that is not escaped.
        let mut end = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match (c, escaped) {
                ('\\', false) => escaped = true,
                ('"', false) => {
                    end = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        let end = end?;
        if k == key {
            return Some(&after[..end]);
        }
        rest = &after[end + 1..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP vllm:num_requests_running Number of requests.\n\
        # TYPE vllm:num_requests_running gauge\n\
        vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 3.0\n\
        vllm:num_requests_waiting{model_name=\"m\",engine=\"0\"} 2.0\n\
        vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.25\n\
        vllm:prefix_cache_queries_total{model_name=\"m\",engine=\"0\"} 400.0\n\
        vllm:prefix_cache_hits_total{model_name=\"m\",engine=\"0\"} 300.0\n\
        vllm:request_success_total{model_name=\"m\",engine=\"0\",finished_reason=\"stop\"} 4.0\n\
        vllm:request_success_total{model_name=\"m\",engine=\"0\",finished_reason=\"length\"} 6.0\n\
        vllm:time_to_first_token_seconds_bucket{model_name=\"a \\\"b\\\"\",engine=\"0\",le=\"0.1\"} 5.0\n\
        vllm:time_to_first_token_seconds_bucket{model_name=\"m\",engine=\"0\",le=\"0.01\"} 1.0\n\
        vllm:time_to_first_token_seconds_bucket{model_name=\"m\",engine=\"0\",le=\"+Inf\"} 10.0\n\
        vllm:time_to_first_token_seconds_count{model_name=\"m\",engine=\"0\"} 10.0\n";

    #[test]
    fn reads_gauges_counters_and_sorted_buckets() {
        let s = parse(TEXT);
        assert_eq!(s.running, 3.0);
        assert_eq!(s.waiting, 2.0);
        assert_eq!(s.kv_usage, 0.25);
        assert_eq!(s.queries, 400.0);
        assert_eq!(s.hits, 300.0);
        assert_eq!(s.requests, 10.0);
        assert_eq!(s.ttft_buckets, vec![(0.01, 1.0), (0.1, 5.0)]);
        assert_eq!(s.ttft_count, 10.0);
    }

    #[test]
    fn falls_back_to_old_prefix_cache_names() {
        let s = parse(
            "vllm:gpu_prefix_cache_hits_total{engine=\"0\"} 7\nvllm:gpu_prefix_cache_queries_total 9\n",
        );
        assert_eq!((s.hits, s.queries), (7.0, 9.0));
    }

    #[test]
    fn garbage_lines_are_skipped() {
        let s =
            parse("vllm:num_requests_running{oops 1\nnot a metric\nvllm:num_requests_waiting x\n");
        assert_eq!(s, EngineSnapshot::default());
    }
}
