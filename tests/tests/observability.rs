//! What operators scrape: the sidecar's `/metrics` passes `promtool check metrics` with no
//! lint in the format promtool reads, and is OpenMetrics for a scraper that asks for it.
//!
//! The Prometheus rules and the Grafana dashboard of `deploy/` refer only to metrics a live
//! sidecar and engine export, and to recorded series their rules define.
//!
//! The promtool check needs `promtool` (Debian's `prometheus` package): see
//! [`kvmesh_tests::tools`].

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};

use kvmesh_tests::binaries::workspace_root;
use kvmesh_tests::tools::skipped_for_lack_of;
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Call, Cluster, NodeSpec, Request, call};
use serde_json::Value;

/// Runs `promtool ARGS` with `input` on stdin; its exit status and everything it printed.
fn promtool(args: &[&str], input: &[u8]) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): install Debian's `prometheus` package (scripts/test.sh does)")
        });
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input)
        .expect("write to promtool");
    let output = child.wait_with_output().expect("promtool");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), printed)
}

/// A two-node mesh that has served requests both locally and across the mesh, so that the
/// labelled families (requests by reason and outcome, latency by target) have samples.
fn busy_mesh() -> Cluster {
    let cluster = Cluster::start(&[NodeSpec::new("a", &["m"]), NodeSpec::new("b", &["m"])]);
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);
    for round in 0..4 {
        for entry in ["a", "b"] {
            for kind in Call::ALL {
                call(
                    cluster.sidecar(entry),
                    kind,
                    "m",
                    &format!("prompt {round}"),
                );
            }
        }
    }
    cluster
}

#[test]
fn metrics_pass_promtool_without_lint_and_openmetrics_is_served_when_asked() {
    if skipped_for_lack_of("promtool") {
        return;
    }
    let cluster = busy_mesh();
    for node in ["a", "b"] {
        let sidecar = cluster.sidecar(node);
        // What curl and promtool get: the Prometheus text format.
        let text = sidecar.get("/metrics");
        assert_eq!(text.status, 200);
        assert_eq!(
            text.header("content-type"),
            Some("text/plain; version=0.0.4; charset=utf-8")
        );
        let (ok, printed) = promtool(&["check", "metrics"], &text.body);
        assert!(
            ok && printed.trim().is_empty(),
            "{node}: promtool check metrics: {printed}\n{}",
            text.text()
        );
        assert!(
            !text.text().contains("-0.0"),
            "{node}: a negative zero: {}",
            text.text()
        );

        // What Prometheus asks for first.
        let accept = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;q=0.3";
        let openmetrics = sidecar.send(Request::get("/metrics").header("accept", accept));
        assert_eq!(
            openmetrics.header("content-type"),
            Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
        );
        let body = openmetrics.text();
        assert!(body.ends_with("# EOF\n"), "{node}: {body}");
        assert!(
            body.contains("# TYPE kvmesh_requests counter\n"),
            "{node}: {body}"
        );
    }
}

/// Names a scrape exports: every sample's, and every declared family's (a family with no
/// sample yet, such as a counter by reason before its first event, is still exported), with
/// a histogram's `_bucket`, `_sum` and `_count`.
fn exported_names(scrape: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in scrape.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let mut words = declared.split_whitespace();
            let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                continue;
            };
            names.insert(name.to_string());
            if kind == "histogram" || kind == "summary" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

/// The metric names a PromQL expression refers to, in two kinds: exported ones (`kvmesh_*`,
/// `vllm:*`) and recorded ones (any other name with a colon, e.g. `cluster:x:rate5m`).
/// Quoted strings (label values) are skipped; function names and label names have neither
/// prefix nor colon. (`up` is Prometheus' own and needs no exporter.)
fn referenced_names(expr: &str, exported: &mut BTreeSet<String>, recorded: &mut BTreeSet<String>) {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut chars = expr.char_indices().peekable();
    let mut previous = ' ';
    while let Some((at, c)) = chars.next() {
        if c == '"' || c == '\'' || c == '`' {
            // Skip to the closing quote, past escaped ones.
            let mut escaped = false;
            for (_, q) in chars.by_ref() {
                if !escaped && q == c {
                    break;
                }
                escaped = q == '\\' && !escaped;
            }
            previous = c;
            continue;
        }
        if is_ident(c) && !is_ident(previous) && (c.is_ascii_alphabetic() || c == '_') {
            let mut end = at + c.len_utf8();
            while let Some(&(next_at, next)) = chars.peek() {
                if !is_ident(next) {
                    break;
                }
                end = next_at + next.len_utf8();
                chars.next();
            }
            let token = &expr[at..end];
            if token.starts_with("kvmesh_") || token.starts_with("vllm:") {
                exported.insert(token.to_string());
            } else if token.contains(':') {
                recorded.insert(token.to_string());
            }
            previous = 'x';
            continue;
        }
        previous = c;
    }
}

#[test]
fn referenced_names_reads_promql() {
    let (mut exported, mut recorded) = (BTreeSet::new(), BTreeSet::new());
    referenced_names(
        r#"sum by (node) (rate(kvmesh_requests_total{job="kvmesh_x", a='vllm:y'}[5m]))
           / on () group_left () cluster:vllm_prefix_cache_hit:ratio_rate5m
           + histogram_quantile(0.5, vllm:time_to_first_token_seconds_bucket) + up"#,
        &mut exported,
        &mut recorded,
    );
    assert_eq!(
        exported.into_iter().collect::<Vec<_>>(),
        [
            "kvmesh_requests_total",
            "vllm:time_to_first_token_seconds_bucket"
        ]
    );
    assert_eq!(
        recorded.into_iter().collect::<Vec<_>>(),
        ["cluster:vllm_prefix_cache_hit:ratio_rate5m"]
    );
}

/// Every PromQL expression of deploy/prometheus's rules (with the names they record) and of
/// deploy/grafana's dashboard.
fn deployed_expressions() -> (Vec<(String, String)>, BTreeSet<String>) {
    let deploy = workspace_root().join("deploy");
    let mut expressions = Vec::new();
    let mut records = BTreeSet::new();
    let rules_dir = deploy.join("prometheus").join("rules");
    for entry in std::fs::read_dir(&rules_dir).expect("deploy/prometheus/rules") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("rules file");
        let rules: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("YAML");
        let rules = serde_json::to_value(rules).expect("JSON");
        for group in rules["groups"].as_array().expect("groups") {
            for rule in group["rules"].as_array().expect("rules") {
                let expr = rule["expr"].as_str().expect("expr").to_string();
                let name = rule["record"].as_str().or(rule["alert"].as_str());
                expressions.push((format!("{}: {}", path.display(), name.unwrap_or("?")), expr));
                if let Some(record) = rule["record"].as_str() {
                    records.insert(record.to_string());
                }
            }
        }
    }
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(deploy.join("grafana").join("kvmesh.json")).expect("dashboard"),
    )
    .expect("dashboard JSON");
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("target expr").to_string();
            expressions.push((format!("dashboard: {}", panel["title"]), expr));
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        // A query variable's PromQL (a data-source variable's `query` is a plugin id).
        if let Some(query) = variable["query"]["query"].as_str() {
            expressions.push((format!("dashboard: ${}", variable["name"]), query.into()));
        }
    }
    (expressions, records)
}

#[test]
fn rules_and_dashboard_use_only_what_a_live_sidecar_and_engine_export() {
    let cluster = Cluster::start(&[NodeSpec::new("a", &["m"])]);
    call(cluster.sidecar("a"), Call::Completion, "m", "a prompt");
    let mut exported = exported_names(&cluster.sidecar("a").get("/metrics").text());
    exported.extend(exported_names(
        &cluster.node("a").engine.get("/metrics").text(),
    ));

    let (expressions, records) = deployed_expressions();
    let mut missing = Vec::new();
    let mut checked = BTreeSet::new();
    for (origin, expr) in &expressions {
        let (mut names, mut recorded) = (BTreeSet::new(), BTreeSet::new());
        referenced_names(expr, &mut names, &mut recorded);
        for name in names.difference(&exported) {
            missing.push(format!("{origin}: {name} is not exported"));
        }
        for name in recorded.difference(&records) {
            missing.push(format!("{origin}: {name} is recorded by no rule"));
        }
        checked.extend(names);
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
    // The extraction found what the files are about (a broken one would find nothing).
    assert!(checked.len() >= 20, "only {checked:?}");
    for name in ["kvmesh_requests_total", "vllm:prefix_cache_hits_total"] {
        assert!(checked.contains(name), "{name} not found in {checked:?}");
    }
    println!(
        "{} expressions refer to {} exported names, all exported",
        expressions.len(),
        checked.len()
    );
}
