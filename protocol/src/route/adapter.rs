//! Placing a LoRA adapter that no engine has loaded: [`place_adapter`].
//!
//! A sidecar whose engine allows loading adapters at run time (vLLM's
//! `VLLM_ALLOW_RUNTIME_LORA_UPDATING`) says which names it can load, and onto which base
//! model ([`LoadableAdapters`], gossiped). A request for such a name that no live engine
//! serves goes to one engine of its base model, the same one from every entry node: the
//! highest rendezvous weight on the adapter's name among the engines with a free slot (all of
//! them when none has one). That engine's sidecar loads it before serving the request; from
//! then on its digest lists the adapter and requests for it are routed like any other model's.

use super::rendezvous::{node_key, rendezvous_weight};
use crate::digest::{LoadDigest, LoraReadiness, Role};
use serde::{Deserialize, Serialize};

/// Longest adapter pattern or base model name a rule may hold (bounds what a peer gossips).
pub const MAX_RULE_FIELD_BYTES: usize = 512;
/// Most rules one node may announce.
pub const MAX_RULES: usize = 64;

/// One rule: adapter names matching `pattern` load onto `base`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdapterRule {
    /// An adapter name, or a pattern where each `*` stands for any run of characters
    /// (`sql-*`, `*`).
    pub pattern: String,
    /// The served model name of the base model the adapter was trained on.
    pub base: String,
}

impl AdapterRule {
    /// Parses `PATTERN=BASE`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (pattern, base) = text
            .split_once('=')
            .ok_or_else(|| format!("`{text}`: expected PATTERN=BASE_MODEL"))?;
        let rule = Self {
            pattern: pattern.trim().to_owned(),
            base: base.trim().to_owned(),
        };
        rule.check()?;
        Ok(rule)
    }

    /// Whether the rule is usable: both fields non-empty and bounded.
    pub fn check(&self) -> Result<(), String> {
        for (what, field) in [("pattern", &self.pattern), ("base model", &self.base)] {
            if field.is_empty() {
                return Err(format!("an adapter rule's {what} is empty"));
            }
            if field.len() > MAX_RULE_FIELD_BYTES {
                return Err(format!(
                    "an adapter rule's {what} is over {MAX_RULE_FIELD_BYTES} bytes"
                ));
            }
        }
        Ok(())
    }

    pub fn matches(&self, name: &str) -> bool {
        glob_match(&self.pattern, name)
    }
}

/// The adapters one engine can load at run time: its sidecar's `[lora]` rules.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadableAdapters {
    pub rules: Vec<AdapterRule>,
}

impl LoadableAdapters {
    /// The base model `adapter` loads onto here (the first rule that matches), if any.
    pub fn base_of(&self, adapter: &str) -> Option<&str> {
        self.rules
            .iter()
            .find(|rule| rule.matches(adapter))
            .map(|rule| rule.base.as_str())
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether a peer's announcement is within bounds (checked on receipt).
    pub fn check(&self) -> Result<(), String> {
        if self.rules.len() > MAX_RULES {
            return Err(format!("{} rules, over {MAX_RULES}", self.rules.len()));
        }
        self.rules.iter().try_for_each(AdapterRule::check)
    }
}

/// One engine an adapter could be loaded onto, as this node sees it.
#[derive(Copy, Clone, Debug)]
pub struct AdapterHost<'a> {
    pub node_key: u64,
    pub digest: &'a LoadDigest,
    /// What its sidecar announced it can load (empty: nothing, or a node that announces
    /// nothing).
    pub loadable: &'a LoadableAdapters,
    /// Whether its digest is fresh enough to route by (see `RouteConfig::max_digest_age_ms`).
    pub fresh: bool,
}

/// Where an adapter no engine serves is loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterPlacement {
    /// Indexes into the hosts, best first: the first is where it goes; every entry node with
    /// the same view puts the same one first.
    pub ranked: Vec<usize>,
    /// The base model it loads onto (the first host's rule).
    pub base: String,
}

/// Where `adapter`, which no live engine serves, should be loaded: among the healthy engines
/// that take whole requests, announce a rule for it and serve its base model (the fresh ones,
/// when any is), those with a free LoRA slot first, each group by rendezvous weight on the
/// adapter's name. An engine whose `vllm:lora_requests_info` already names the adapter (it was
/// just loaded there, and its `/v1/models` has not been read since) goes before them all.
/// `None`: no engine can load it (the name is then unknown to the cluster).
pub fn place_adapter(adapter: &str, hosts: &[AdapterHost<'_>]) -> Option<AdapterPlacement> {
    let eligible = |host: &AdapterHost<'_>| {
        let digest = host.digest;
        digest.healthy
            && digest.role.takes(Role::Mixed)
            && host
                .loadable
                .base_of(adapter)
                .is_some_and(|base| digest.models.iter().any(|model| model == base))
    };
    let any_fresh = hosts.iter().any(|host| host.fresh && eligible(host));
    let key = node_key(adapter);
    let mut ranked: Vec<(u8, u64, usize)> = hosts
        .iter()
        .enumerate()
        .filter(|(_, host)| eligible(host) && (host.fresh || !any_fresh))
        .map(|(index, host)| {
            let tier = match host.digest.lora_use.readiness(adapter) {
                LoraReadiness::Running | LoraReadiness::Waiting => 2u8,
                LoraReadiness::FreeSlot => 1,
                LoraReadiness::NoSlot => 0,
            };
            (tier, rendezvous_weight(key, host.node_key), index)
        })
        .collect();
    // Best first; the weight (a permutation of the node key) breaks every tie.
    ranked.sort_unstable_by_key(|&(tier, weight, _)| std::cmp::Reverse((tier, weight)));
    let first = hosts[ranked.first()?.2];
    let base = first.loadable.base_of(adapter)?.to_owned();
    Some(AdapterPlacement {
        ranked: ranked.into_iter().map(|(_, _, index)| index).collect(),
        base,
    })
}

/// Whether `name` matches `pattern`, where `*` matches any run of characters (none included)
/// and every other character itself.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let Some((head, rest)) = pattern.split_once('*') else {
        return pattern == name;
    };
    let Some(mut remaining) = name.strip_prefix(head) else {
        return false;
    };
    let mut parts: Vec<&str> = rest.split('*').collect();
    let tail = parts.pop().unwrap_or("");
    for part in parts {
        match remaining.find(part) {
            Some(at) => remaining = &remaining[at + part.len()..],
            None => return false,
        }
    }
    remaining.len() >= tail.len() && remaining.ends_with(tail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::LoraUse;

    fn digest(models: &[&str], running: &[&str], max_loras: u16) -> LoadDigest {
        let mut digest = crate::digest::sample_digest();
        digest.models = models.iter().map(|m| m.to_string()).collect();
        digest.lora_use = LoraUse {
            running: running.iter().map(|m| m.to_string()).collect(),
            waiting: vec![],
            max_loras,
        };
        digest
    }

    fn rules(text: &[&str]) -> LoadableAdapters {
        LoadableAdapters {
            rules: text
                .iter()
                .map(|t| AdapterRule::parse(t).unwrap())
                .collect(),
        }
    }

    #[test]
    fn patterns_match_names_with_stars_anywhere() {
        for (pattern, name) in [
            ("sql", "sql"),
            ("*", "anything"),
            ("*", ""),
            ("sql-*", "sql-v2"),
            ("sql-*", "sql-"),
            ("*-lora", "chat-lora"),
            ("a*b*c", "aXbYc"),
            ("a*b*c", "abc"),
            ("a**c", "ac"),
        ] {
            assert!(glob_match(pattern, name), "{pattern} {name}");
        }
        for (pattern, name) in [
            ("sql", "sql2"),
            ("sql-*", "sq"),
            ("*-lora", "lora"),
            ("a*b*c", "acb"),
            ("ab*ba", "aba"),
        ] {
            assert!(!glob_match(pattern, name), "{pattern} {name}");
        }
    }

    #[test]
    fn rules_parse_and_reject_what_they_cannot_use() {
        assert_eq!(
            AdapterRule::parse(" chat-* = model-b ").unwrap(),
            AdapterRule {
                pattern: "chat-*".into(),
                base: "model-b".into()
            }
        );
        for bad in ["chat", "=b", "a=", &format!("a={}", "x".repeat(600))] {
            assert!(AdapterRule::parse(bad).is_err(), "{bad}");
        }
        let loadable = rules(&["sql=model-a", "*=model-b"]);
        assert_eq!(loadable.base_of("sql"), Some("model-a"));
        assert_eq!(loadable.base_of("chat"), Some("model-b"));
        assert_eq!(rules(&["sql=a"]).base_of("chat"), None);
    }

    fn host<'a>(
        key: u64,
        digest: &'a LoadDigest,
        loadable: &'a LoadableAdapters,
    ) -> AdapterHost<'a> {
        AdapterHost {
            node_key: key,
            digest,
            loadable,
            fresh: true,
        }
    }

    #[test]
    fn every_entry_picks_the_same_engine_of_the_base_model() {
        let b = digest(&["model-b"], &[], 2);
        let a = digest(&["model-a"], &[], 2);
        let loadable = rules(&["chat-*=model-b"]);
        let nothing = LoadableAdapters::default();
        let hosts = vec![
            host(node_key("n1"), &a, &loadable),
            host(node_key("n2"), &b, &loadable),
            host(node_key("n3"), &b, &loadable),
            host(node_key("n4"), &b, &nothing),
        ];
        let placed = place_adapter("chat-x", &hosts).unwrap();
        assert_eq!(placed.base, "model-b");
        let mut ranked = placed.ranked.clone();
        ranked.sort();
        assert_eq!(ranked, [1, 2], "only model-b engines that may load it");
        // The order of the hosts does not matter.
        let reversed: Vec<_> = hosts.iter().rev().copied().collect();
        let again = place_adapter("chat-x", &reversed).unwrap();
        assert_eq!(
            hosts[placed.ranked[0]].node_key,
            reversed[again.ranked[0]].node_key
        );
        // Different names spread over both engines.
        let firsts: std::collections::HashSet<u64> = (0..32)
            .map(|i| {
                let placed = place_adapter(&format!("chat-{i}"), &hosts).unwrap();
                hosts[placed.ranked[0]].node_key
            })
            .collect();
        assert_eq!(firsts.len(), 2);
        assert_eq!(place_adapter("sql", &hosts), None);
    }

    #[test]
    fn an_engine_with_a_free_slot_goes_first_and_an_unhealthy_or_stale_one_not_at_all() {
        let loadable = LoadableAdapters {
            rules: vec![AdapterRule::parse("*=model-b").unwrap()],
        };
        let full = digest(&["model-b"], &["x", "y"], 2);
        let free = digest(&["model-b"], &["x"], 2);
        let mut sick = free.clone();
        sick.healthy = false;
        // Find a name whose rendezvous choice is the full engine, then see the free one win.
        let (k1, k2) = (node_key("n1"), node_key("n2"));
        let name = (0..)
            .map(|i| format!("ad-{i}"))
            .find(|name| {
                rendezvous_weight(node_key(name), k1) > rendezvous_weight(node_key(name), k2)
            })
            .unwrap();
        let hosts = [host(k1, &full, &loadable), host(k2, &free, &loadable)];
        assert_eq!(place_adapter(&name, &hosts).unwrap().ranked, [1, 0]);
        let mut stale = hosts;
        stale[1].fresh = false;
        assert_eq!(place_adapter(&name, &stale).unwrap().ranked, [0]);
        let mut unhealthy = hosts;
        unhealthy[1].digest = &sick;
        assert_eq!(place_adapter(&name, &unhealthy).unwrap().ranked, [0]);
        // Every slot taken everywhere: still placed, by rendezvous alone.
        let both_full = [
            hosts[0],
            AdapterHost {
                digest: &full,
                ..hosts[1]
            },
        ];
        assert_eq!(place_adapter(&name, &both_full).unwrap().ranked, [0, 1]);
        // Just loaded on the full one (its requests run there; /v1/models not read since):
        // it stays first, though the other has a free slot.
        let running = digest(&["model-b"], &["x", name.as_str()], 2);
        let loaded = [
            AdapterHost {
                digest: &running,
                ..hosts[0]
            },
            hosts[1],
        ];
        assert_eq!(place_adapter(&name, &loaded).unwrap().ranked, [0, 1]);
    }
}
