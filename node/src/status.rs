//! `kvmesh status`: the cluster as one sidecar sees it, read from its `GET /debug/cluster`,
//! as rows for a table (people) or for JSON (scripts).
//!
//! Pure: the command fetches the JSON, this turns it into rows and text.

use serde::Serialize;
use serde_json::Value;

/// One node of the cluster, as the asked sidecar knows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeStatus {
    pub node: String,
    /// Whether this is the sidecar that was asked (the others are its live peers).
    pub asked: bool,
    /// `mixed`, `prefill` or `decode` (the digest's role); `None` until its first digest.
    pub role: Option<String>,
    pub models: Vec<String>,
    pub adapters: Vec<String>,
    /// `healthy`, `unhealthy` (its engine is not a target), `draining` (the asked node only)
    /// or `unknown` (no digest received yet).
    pub engine: &'static str,
    pub running: Option<u64>,
    pub waiting: Option<u64>,
    pub kv_usage: Option<f64>,
    /// Blocks its prefix summary advertises (the asked node's exactly, a peer's estimated
    /// from its summary when that is a Bloom filter).
    pub cached_blocks: Option<u64>,
    /// KV blocks in use (usage × capacity) and the capacity, in the engine's blocks.
    pub kv_used_blocks: Option<u64>,
    pub kv_capacity_blocks: Option<u64>,
    /// How old the digest these figures come from is.
    pub digest_age_ms: Option<u64>,
    pub version: Option<String>,
}

/// The rows of a `/debug/cluster` answer: the asked node first, then its peers by name.
pub fn from_debug_cluster(cluster: &Value) -> Result<Vec<NodeStatus>, String> {
    let node = cluster["node"]
        .as_str()
        .ok_or("not a /debug/cluster answer: no `node`")?;
    let engine = if cluster["draining"] == true {
        "draining"
    } else if cluster["engine"]["healthy"] == true {
        "healthy"
    } else {
        "unhealthy"
    };
    let mut rows = vec![row(
        node,
        true,
        &cluster["digest"],
        engine,
        cluster["digest_age_ms"].as_u64(),
        cluster,
    )];
    let mut peers: Vec<NodeStatus> = cluster["peers"]
        .as_array()
        .ok_or("not a /debug/cluster answer: no `peers` list")?
        .iter()
        .map(|peer| {
            let digest = &peer["digest"];
            let engine = match digest["healthy"].as_bool() {
                None => "unknown",
                Some(true) => "healthy",
                Some(false) => "unhealthy",
            };
            row(
                peer["node"].as_str().unwrap_or("?"),
                false,
                digest,
                engine,
                peer["age_ms"].as_u64(),
                peer,
            )
        })
        .collect();
    peers.sort_by(|a, b| a.node.cmp(&b.node));
    rows.extend(peers);
    Ok(rows)
}

fn row(
    node: &str,
    asked: bool,
    digest: &Value,
    engine: &'static str,
    age_ms: Option<u64>,
    // The node's own object in the answer: its version and cached blocks.
    node_json: &Value,
) -> NodeStatus {
    let strings = |value: &Value| -> Vec<String> {
        value
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|item| item.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let kv_usage = digest["kv_usage"].as_f64();
    let kv_capacity_blocks = digest["kv_capacity_blocks"].as_u64();
    NodeStatus {
        node: node.to_owned(),
        asked,
        role: digest["role"].as_str().map(str::to_owned),
        models: strings(&digest["models"]),
        adapters: strings(&digest["loras"]),
        engine,
        running: digest["running"].as_u64(),
        waiting: digest["waiting"].as_u64(),
        kv_usage,
        cached_blocks: node_json["cached_blocks"].as_u64(),
        kv_used_blocks: kv_usage
            .zip(kv_capacity_blocks)
            .map(|(usage, capacity)| (usage * capacity as f64).round() as u64),
        kv_capacity_blocks,
        digest_age_ms: digest.is_object().then_some(age_ms).flatten(),
        version: node_json["version"].as_str().map(str::to_owned),
    }
}

/// A plain-text table, one line per node; the asked node is marked with `*`.
pub fn render_table(rows: &[NodeStatus]) -> String {
    let header = [
        "NODE",
        "ROLE",
        "MODELS",
        "ENGINE",
        "RUN",
        "WAIT",
        "KV USED",
        "CACHED",
        "DIGEST AGE",
        "VERSION",
    ];
    let dash = || "-".to_owned();
    let lines: Vec<[String; 10]> = rows
        .iter()
        .map(|row| {
            let mut models = row.models.join(",");
            if !row.adapters.is_empty() {
                models.push_str(&format!(" +{}", row.adapters.join(",+")));
            }
            let kv = match (row.kv_used_blocks, row.kv_capacity_blocks, row.kv_usage) {
                (Some(used), Some(capacity), Some(usage)) => {
                    format!("{used}/{capacity} ({:.0}%)", usage * 100.0)
                }
                (_, _, Some(usage)) => format!("{:.0}%", usage * 100.0),
                _ => dash(),
            };
            [
                format!("{}{}", row.node, if row.asked { " *" } else { "" }),
                row.role.clone().unwrap_or_else(dash),
                if models.is_empty() { dash() } else { models },
                row.engine.to_owned(),
                row.running.map_or_else(dash, |n| n.to_string()),
                row.waiting.map_or_else(dash, |n| n.to_string()),
                kv,
                row.cached_blocks.map_or_else(dash, |n| n.to_string()),
                row.digest_age_ms.map_or_else(dash, format_age),
                row.version.clone().unwrap_or_else(dash),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for line in &lines {
        for (width, cell) in widths.iter_mut().zip(line) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut push = |cells: &mut dyn Iterator<Item = &str>| {
        let line: Vec<String> = cells
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    };
    push(&mut header.iter().copied());
    for line in &lines {
        push(&mut line.iter().map(String::as_str));
    }
    out
}

fn format_age(ms: u64) -> String {
    if ms < 10_000 {
        format!("{ms} ms")
    } else {
        format!("{} s", ms / 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cluster() -> Value {
        json!({
            "node": "b",
            "version": "0.1.0",
            "draining": false,
            "engine": {"healthy": true},
            "digest_age_ms": 40,
            "cached_blocks": 120,
            "digest": {"role": "mixed", "models": ["m"], "loras": ["sql"], "healthy": true,
                       "running": 3, "waiting": 1, "kv_usage": 0.25, "kv_capacity_blocks": 800},
            "peers": [
                {"node": "c", "age_ms": 12000, "version": "0.1.0",
                 "digest": {"role": "mixed", "models": ["m"], "loras": [], "healthy": false,
                            "running": 0, "waiting": 0, "kv_usage": 0.0, "kv_capacity_blocks": 800}},
                {"node": "a", "age_ms": 5, "version": null, "digest": null},
            ],
        })
    }

    #[test]
    fn rows_put_the_asked_node_first_and_peers_by_name() {
        let rows = from_debug_cluster(&cluster()).unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.node.as_str()).collect();
        assert_eq!(names, ["b", "a", "c"]);
        assert!(rows[0].asked && !rows[1].asked);
        assert_eq!(rows[0].engine, "healthy");
        assert_eq!(rows[0].kv_used_blocks, Some(200));
        assert_eq!(rows[0].adapters, ["sql"]);
        assert_eq!(rows[0].cached_blocks, Some(120));
        // A peer without a digest yet: known by name only.
        assert_eq!(rows[1].engine, "unknown");
        assert_eq!(
            (rows[1].role.as_deref(), rows[1].digest_age_ms),
            (None, None)
        );
        assert_eq!(rows[2].engine, "unhealthy");
        assert_eq!(rows[2].digest_age_ms, Some(12000));
    }

    #[test]
    fn a_draining_node_says_so() {
        let mut cluster = cluster();
        cluster["draining"] = json!(true);
        assert_eq!(from_debug_cluster(&cluster).unwrap()[0].engine, "draining");
    }

    #[test]
    fn the_table_aligns_columns_and_marks_the_asked_node() {
        let table = render_table(&from_debug_cluster(&cluster()).unwrap());
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "{table}");
        assert!(lines[0].starts_with("NODE "), "{table}");
        assert!(lines[1].starts_with("b *"), "{table}");
        assert!(lines[1].contains("m +sql"), "{table}");
        assert!(lines[1].contains("200/800 (25%)"), "{table}");
        assert!(lines[3].contains("12 s"), "{table}");
        // Every column starts at the same offset on every line.
        let at = lines[0].find("ENGINE").unwrap();
        assert_eq!(&lines[1][at..at + 7], "healthy");
        assert_eq!(&lines[2][at..at + 7], "unknown");
    }

    #[test]
    fn anything_else_is_a_clear_error() {
        let error = from_debug_cluster(&json!({"error": "nope"})).unwrap_err();
        assert!(error.contains("/debug/cluster"), "{error}");
    }
}
