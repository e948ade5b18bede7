//! Weights and thresholds of the decision, with their defaults.

/// Which scoring form ranks candidates (`--route-form` of the node and of the simulator,
/// `form` under `[route]`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreForm {
    /// `α·matched/len + β·(1 - kv_usage) - γ·queued/L`: highest wins (`queued`: see
    /// [`ScoreWeights::running_weight`]).
    Score,
    /// Estimated time to first token, `queue_wait + prefill(uncached tokens)`: lowest wins.
    Cost,
}

impl ScoreForm {
    /// Every form, in the order their names are listed.
    pub const ALL: [ScoreForm; 2] = [ScoreForm::Score, ScoreForm::Cost];

    /// The form's name in flags and configuration files (as serde spells it).
    pub fn name(self) -> &'static str {
        match self {
            ScoreForm::Score => "score",
            ScoreForm::Cost => "cost",
        }
    }
}

impl std::fmt::Display for ScoreForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ScoreForm {
    type Err = UnknownScoreForm;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|form| form.name() == name)
            .ok_or_else(|| UnknownScoreForm(name.to_owned()))
    }
}

/// A name that is no [`ScoreForm`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("expected `score` or `cost`, not `{0}`")]
pub struct UnknownScoreForm(pub String);

/// What the load bound counts per engine.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundOn {
    /// Requests admitted and not finished (running + waiting), plus this node's pending sends.
    InFlight,
    /// Requests the engine has not yet scheduled (waiting), plus this node's pending sends:
    /// the queue a new request would wait in, not the batch it would join.
    Queued,
}

/// Every tunable of [`super::decide`], grouped by the stage that reads it. Defaults are
/// documented on each field. In a `[route]` table (the node's TOML file, the simulator's
/// `--route NAME=VALUE`) every field keeps its flat name, as before the grouping: a group's
/// fields are flattened into the table, each under the name its documentation gives.
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RouteConfig {
    /// The scoring form. Default [`ScoreForm::Score`]. (Key `form` under `[route]`; `policy`,
    /// its name before "policy" came to mean the simulator's routing policies, and
    /// `route_form`, the flag's name, are read too.)
    #[serde(alias = "policy", alias = "route_form")]
    pub form: ScoreForm,
    /// The score form's weights (`route/score.rs`).
    #[serde(flatten)]
    pub score: ScoreWeights,
    /// What is assumed where the gauges do not say (`route/score.rs`).
    #[serde(flatten)]
    pub assumed: Assumptions,
    /// What counts as held (`route/considered.rs`, `route/cold.rs`).
    #[serde(flatten)]
    pub hit: HitRules,
    /// The load bound (`route/load_cap.rs`).
    #[serde(flatten)]
    pub load: LoadBound,
    /// A new prefix's choices (`route/cold.rs`).
    #[serde(flatten)]
    pub cold: ColdPrefixes,
    /// The session bonus and the spread band (`route/session.rs`, `route/spread.rs`).
    #[serde(flatten)]
    pub soft: SoftPreferences,
    /// When a serving node may decline ([`crate::lifecycle`]).
    #[serde(flatten)]
    pub late: LateBinding,
    /// A digest older than this is ignored while a fresher candidate exists. Default 3000 ms.
    pub max_digest_age_ms: u64,
    /// Candidates returned in rank order (the first plus the retries). Default 4.
    pub ranked_len: usize,
}

impl Default for RouteConfig {
    fn default() -> Self {
        Self {
            form: ScoreForm::Score,
            score: ScoreWeights::default(),
            assumed: Assumptions::default(),
            hit: HitRules::default(),
            load: LoadBound::default(),
            cold: ColdPrefixes::default(),
            soft: SoftPreferences::default(),
            late: LateBinding::default(),
            max_digest_age_ms: 3_000,
            ranked_len: 4,
        }
    }
}

/// The score form's weights (see [`ScoreForm::Score`]): `α·matched/len + β·(1 - kv_usage) -
/// γ·queued/L + lora_weight·readiness`.
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ScoreWeights {
    /// α, weight of the matched fraction of the prompt. Default 1.0.
    pub alpha: f64,
    /// β, weight of free KV cache. Default 0.1.
    pub beta: f64,
    /// γ, weight of the queue. Default 1.0.
    pub gamma: f64,
    /// L, the queue length at which the queue term costs γ. Default 16.
    pub waiting_threshold: f64,
    /// Score form: weight of a running request in the queue term, against 1 for a waiting
    /// (or pending) one: `queued = waiting + pending + running_weight·running`. A running
    /// request holds no place in the queue, but every request in the batch slows each step
    /// a request joins. Without it an engine that admits every request at once (vLLM below
    /// `max_num_seqs`) shows nothing while nothing waits, and requests that any engine could
    /// serve as fast pick busy ones as often as idle ones. The cost form and the load bound
    /// count what waits only. Default 0.25.
    pub running_weight: f64,
    /// Score form: weight of an engine's readiness for the LoRA adapter a request names
    /// (1 running it, 0.8 a free slot to load it into, 0.6 requests for it queued, 0 every
    /// slot taken by others): a request for an adapter an engine is running joins its batch,
    /// while one elsewhere waits for the adapter to load, or for a slot. Default 0.5, worth
    /// half the prompt matched.
    pub lora_weight: f64,
}

impl Default for ScoreWeights {
    fn default() -> Self {
        Self {
            alpha: 1.0,
            beta: 0.1,
            gamma: 1.0,
            waiting_threshold: 16.0,
            running_weight: 0.25,
            lora_weight: 0.5,
        }
    }
}

/// What the decision assumes of an engine where its gauges do not say.
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Assumptions {
    /// Prefill speed assumed when a digest reports none: in the cost form's estimates and
    /// session bonus, in the work credited to an engine since its gauges were read, and in
    /// a serving node's queue in time. Default 5000 tokens/s.
    pub default_prefill_tokens_per_s: f64,
    /// Cost form: the time to load an adapter into a slot, charged in proportion to how far
    /// from running it an engine is (see [`ScoreWeights::lora_weight`]). Default 200 ms.
    pub lora_load_ms: f64,
}

impl Default for Assumptions {
    fn default() -> Self {
        Self {
            default_prefill_tokens_per_s: 5_000.0,
            lora_load_ms: 200.0,
        }
    }
}

/// What counts of a candidate's cache: when a prefix is a hit, and what an offloaded block is
/// worth.
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct HitRules {
    /// Blocks that must match for a prefix to count as a hit. Default 1.
    /// (Key `min_hit_blocks` under `[route]`.)
    #[serde(rename = "min_hit_blocks")]
    pub min_blocks: u32,
    /// Worth of a block an engine holds only in an offload tier (CPU, storage), as a fraction
    /// of one on its GPU: the engine loads it instead of computing it, at a transfer's cost.
    /// Default 0.5.
    pub offload_weight: f64,
    /// Whether a popular prefix held by fewer engines than its share of the traffic fills
    /// counts as held by every engine, so that its traffic makes new holders
    /// (`super::popularity`). Default true; false leaves a hot prefix on the engines that
    /// hold it until the load bound, the spread band or late binding moves it (the hot-prefix
    /// test's negative control turns it off).
    pub popular_owed_holders: bool,
}

impl Default for HitRules {
    fn default() -> Self {
        Self {
            min_blocks: 1,
            offload_weight: 0.5,
            popular_owed_holders: true,
        }
    }
}

/// The load bound (consistent hashing with bounded loads): no candidate is given more than
/// [`LoadBound::cap`] while another stays under it.
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct LoadBound {
    /// ε of bounded load: no candidate is given more than `(1 + ε)×` the mean load while one
    /// under it exists. Default 0.25 (as KubeAI's CHWBL).
    /// (Key `load_epsilon` under `[route]`.)
    #[serde(rename = "load_epsilon")]
    pub epsilon: f64,
    /// Additive slack of the load bound, in requests: the cap is
    /// `ceil((1 + ε) × mean + slack)` (see [`LoadBound::cap`]). At small loads a
    /// difference of a request or two is noise, and moving a prefix away from its cache costs
    /// more than it balances. 0 gives the pure CHWBL bound. Default 2.
    /// (Key `load_slack` under `[route]`.)
    #[serde(rename = "load_slack")]
    pub slack: f64,
    /// What the bound counts. Default [`BoundOn::Queued`]: an engine running a big batch
    /// takes one more request into it at little cost to the request, while moving a prefix
    /// away from its cache costs its whole prefill; a queue is what makes a request wait
    /// (`docs/studies/load-bound.md`).
    pub bound_on: BoundOn,
}

impl LoadBound {
    /// The most load a candidate may reach by taking a request while another stays under it,
    /// given the mean load (counting the request).
    pub fn cap(&self, mean: f64) -> f64 {
        ((1.0 + self.epsilon) * mean + self.slack.max(0.0)).ceil()
    }
}

impl Default for LoadBound {
    fn default() -> Self {
        Self {
            epsilon: 0.25,
            slack: 2.0,
            bound_on: BoundOn::Queued,
        }
    }
}

/// Where a new prefix (no candidate holds its first blocks) goes: its rendezvous choices.
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ColdPrefixes {
    /// A prefix nobody holds goes to the least loaded of its first `cold_choices` engines by
    /// rendezvous on its first block (ties: the rendezvous order), not always to the first:
    /// power of two choices. Every entry node considers the same few engines, so a new prefix
    /// still lands on one of them; picking the less loaded keeps a burst of new prefixes from
    /// queueing their uncached prefills on one engine (the gsp warm-up tail).
    /// 1 gives plain rendezvous. Default 1: every entry node then sends a new prefix to the
    /// same engine whatever its view, and late binding balances at that engine's sidecar,
    /// which knows its queue exactly. With 2 the choices' loads are the gossiped digests' (plus
    /// this node's sends since), but those move with every request in flight and reach entry
    /// nodes at different moments: a new prefix sent to four entries at once landed on two
    /// engines in 2 of 12 runs of `prefix_routing`'s test on a loaded machine, even with a
    /// margin of one request. The price: the demo's gsp warm-up tail is longer with 1, and
    /// on a trace where no prompt repeats the least loaded of 4 with no margin is 1% faster in
    /// the simulator, but split such copies in 8 of 12 runs
    /// (`docs/studies/new-prefix-placement.md`).
    /// Where an entry's recent prompts share no prefixes, `unshared_choices` applies instead.
    /// (Key `cold_choices` under `[route]`.)
    #[serde(rename = "cold_choices")]
    pub choices: u32,
    /// With `cold_choices` above 1: requests by which a choice's load must exceed the
    /// lightest choice's before it ranks below it, so that views a request apart still agree.
    /// Default 1.
    /// (Key `cold_load_margin` under `[route]`.)
    #[serde(rename = "cold_load_margin")]
    pub load_margin: u32,
    /// Where an entry's recent prompts share no prefixes
    /// ([`super::RouteRequest::prefixes_recur`]): a new prefix goes to the least loaded of its
    /// first `unshared_choices` engines by rendezvous, with no margin, as nothing is likely to
    /// come back for it (`cold_choices`, if more). Power of d choices rather than the least
    /// loaded of all: the loads are gossip's, 100–600 ms old, and at 8× the Azure trace's rate
    /// every entry sending its new prompts to the one engine its view shows lightest made
    /// kvmesh 1.05× least-loaded against 0.85× with 4 (`docs/studies/unshared-new-prefixes.md`).
    /// Default 1, plain rendezvous: with 4 the simulator's Azure trace is
    /// 1% faster, but over real processes a burst of 1,000 distinct prompts through one
    /// sidecar of two went up to 63% to the peer, whose gossiped load lags the requests still on
    /// their way to its engine, where rendezvous and late binding split it 50:50. Engines that
    /// look idle are choices besides these ([`Self::unshared_to_idle`]).
    pub unshared_choices: u32,
    /// Where an entry's recent prompts share no prefixes, a new prefix also counts every
    /// engine gossip shows idle (nothing running or waiting in its digest, nothing this node
    /// sent since) among its choices, so it goes to one of those, by its rendezvous weight,
    /// rather than join a busy engine's batch. An idle engine is the one signal a view 100–600
    /// ms old still gives reliably enough to act on, and the rendezvous among the idle ones
    /// differs per prompt, so entries with the same view do not herd onto one: under load no
    /// engine looks idle and the placement is `unshared_choices`'
    /// (`docs/studies/unshared-new-prefixes.md`). Default on.
    pub unshared_to_idle: bool,
}

impl Default for ColdPrefixes {
    fn default() -> Self {
        Self {
            choices: 1,
            load_margin: 1,
            unshared_choices: 1,
            unshared_to_idle: true,
        }
    }
}

/// Soft preferences among engines the score finds near-equal, or nearly: the session's bonus
/// and the spread band.
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SoftPreferences {
    /// Width of the spread band: candidates whose score is within this of the best (score
    /// units; in the cost form, this fraction of the best estimated TTFT) are near-equal, and
    /// a request that carries a spread key goes to one of them by rendezvous on that key
    /// rather than always to the best. Without it, every entry node sends all of a hot
    /// prefix's requests to the same holder until the load bound stops it. Default 0.05 (in
    /// the score form: the queue term of 0.8 requests, or a twentieth of the prompt matched;
    /// 0.1 lost more hit rate in the simulator for no better tail).
    pub spread_margin: f64,
    /// Bonus for the session's preferred node: score units, or in the cost form that fraction
    /// of the prompt's whole prefill time. Default 0.3.
    pub session_weight: f64,
}

impl Default for SoftPreferences {
    fn default() -> Self {
        Self {
            spread_margin: 0.05,
            session_weight: 0.3,
        }
    }
}

/// Late binding (see [`crate::lifecycle`]): when a serving node may decline a request whose
/// entry judged its queue on a stale view.
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct LateBinding {
    /// Late binding: how many times one request may be declined by a serving node whose own,
    /// exact queue would hold it longer than the entry estimated the next candidate would (see
    /// [`crate::lifecycle`]). The entry judges on digests 100–600 ms old; the serving node
    /// sees every request its engine gets, so a declined request goes to the next in rank at
    /// the cost of one mesh round trip. A request's last attempt is never declined. 0 turns
    /// late binding off. Default 3: after a decline, the next in rank was chosen on the same
    /// stale view, and is as likely to be busy (behind a long uncached prefill, say) as the
    /// first; with one decline that second attempt was the last and stayed, so a third try
    /// paid (simulator, 16 nodes: rag 2–4% lower mean TTFT and up to 40% lower p99, hot
    /// 0.6% lower, no workload worse; `docs/studies/late-binding.md`).
    pub max_declines: u32,
    /// `max_declines` for a new prefix (no engine holds its first block). A new prefix costs
    /// a whole uncached prefill, hundreds of times what a decline costs (~0.4 ms on loopback),
    /// so it may look further for an engine that starts it first: when a burst of new
    /// prefixes arrives, every entry's view of the engines is the least fresh, and each
    /// serving node knows only its own queue. Default 3.
    pub max_new_prefix_declines: u32,
    /// Queued requests added to the entry's estimate of the next candidate's queue before a
    /// serving node declines (see [`crate::lifecycle::tokens_bound`]). Both sides count what
    /// the prompt meets cached: a prefix is taken from its cache only when the queue costs
    /// more than the cache saves. Default 0.
    pub decline_slack: f64,
}

impl Default for LateBinding {
    fn default() -> Self {
        Self {
            max_declines: 3,
            max_new_prefix_declines: 3,
            decline_slack: 0.0,
        }
    }
}

/// When a request is disaggregated into a prefill and a decode leg, and where its decode leg
/// goes (see [`crate::lifecycle::PdRoute`]). Only clusters with prefill engines disaggregate.
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PdConfig {
    /// A request is disaggregated when the part of its prompt the best decode engine does not
    /// hold is at least this many tokens: below it, the transfer's fixed costs (a round trip
    /// more, the pull) outweigh what a decode batch saves by not prefilling (llm-d's
    /// `nonCachedTokens` rule, on the same engine the request would otherwise run on).
    /// Default 512.
    pub min_uncached_tokens: u32,
    /// The best prefill engine is busy when the request would wait longer than this behind
    /// the prefills queued there (waiting, plus this node's sends its gauges do not show,
    /// each counted as this prompt's part it does not hold, at its prefill speed): the
    /// request then runs whole on a decode engine (Dynamo's prefill-queue rule, in time),
    /// if the wait is also longer than the stall it would cause there: running whole holds
    /// up every request on that engine for the prompt's prefill, while waiting costs this
    /// request alone. The bound is long so that a burst of short prefills queued on the
    /// prefill engines does not spill onto idle decode engines either
    /// (`docs/studies/pd-busy-prefill.md`). Default 2000.
    pub max_prefill_wait_ms: u64,
    /// Requests by which a decode engine's load may exceed another's and still be preferred
    /// because it already pulled from the prefill engine: its first pull from a new one costs
    /// a handshake (~5 s with NIXL). Default 2.
    pub warm_margin: u32,
}

impl Default for PdConfig {
    fn default() -> Self {
        Self {
            min_uncached_tokens: 512,
            max_prefill_wait_ms: 2_000,
            warm_margin: 2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_cap_is_epsilon_over_the_mean_plus_the_slack() {
        let load = LoadBound::default();
        assert_eq!(load.cap(1.0), 4.0);
        assert_eq!(load.cap(9.0), 14.0);
        let pure = LoadBound { slack: 0.0, ..load };
        assert_eq!(pure.cap(8.0), 10.0);
    }

    /// The keys of a `[route]` table before the fields were grouped (every one still names
    /// its field: `policy` by its alias, `form` its name since), and the ones added since.
    const FLAT_KEYS: [&str; 26] = [
        "form",
        "alpha",
        "beta",
        "gamma",
        "waiting_threshold",
        "running_weight",
        "load_epsilon",
        "load_slack",
        "bound_on",
        "spread_margin",
        "cold_choices",
        "cold_load_margin",
        "unshared_choices",
        "unshared_to_idle",
        "max_declines",
        "max_new_prefix_declines",
        "decline_slack",
        "session_weight",
        "min_hit_blocks",
        "max_digest_age_ms",
        "ranked_len",
        "default_prefill_tokens_per_s",
        "lora_weight",
        "lora_load_ms",
        "offload_weight",
        "popular_owed_holders",
    ];

    #[test]
    fn the_groups_serialise_under_the_flat_keys() {
        let serde_json::Value::Object(fields) =
            serde_json::to_value(RouteConfig::default()).unwrap()
        else {
            panic!("a table");
        };
        let mut keys: Vec<&str> = fields.keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut expected = FLAT_KEYS.to_vec();
        expected.sort_unstable();
        assert_eq!(keys, expected);
    }

    #[test]
    fn a_flat_route_table_fills_the_groups_and_leaves_the_rest_default() {
        let text = "policy = \"cost\"\nalpha = 2\nwaiting_threshold = 8.5\n\
            load_epsilon = 0.5\nload_slack = 0\nbound_on = \"in_flight\"\n\
            cold_choices = 2\ncold_load_margin = 0\nunshared_to_idle = false\n\
            spread_margin = 0.1\nsession_weight = 0.7\nmin_hit_blocks = 3\n\
            offload_weight = 0.25\nmax_declines = 1\ndecline_slack = 2.5\n\
            default_prefill_tokens_per_s = 9000\nranked_len = 6\n";
        let config: RouteConfig = toml::from_str(text).unwrap();
        let default = RouteConfig::default();
        let expected = RouteConfig {
            form: ScoreForm::Cost,
            score: ScoreWeights {
                alpha: 2.0,
                waiting_threshold: 8.5,
                ..default.score
            },
            assumed: Assumptions {
                default_prefill_tokens_per_s: 9000.0,
                ..default.assumed
            },
            hit: HitRules {
                min_blocks: 3,
                offload_weight: 0.25,
                ..default.hit
            },
            load: LoadBound {
                epsilon: 0.5,
                slack: 0.0,
                bound_on: BoundOn::InFlight,
            },
            cold: ColdPrefixes {
                choices: 2,
                load_margin: 0,
                unshared_to_idle: false,
                ..default.cold
            },
            soft: SoftPreferences {
                spread_margin: 0.1,
                session_weight: 0.7,
            },
            late: LateBinding {
                max_declines: 1,
                decline_slack: 2.5,
                ..default.late
            },
            ranked_len: 6,
            ..default
        };
        assert_eq!(config, expected);
        assert_eq!(toml::from_str::<RouteConfig>("").unwrap(), default);
        for key in ["policy", "form", "route_form"] {
            let config: RouteConfig = toml::from_str(&format!("{key} = \"cost\"")).unwrap();
            assert_eq!(config.form, ScoreForm::Cost, "{key}");
        }
        let error = toml::from_str::<RouteConfig>("load_slack = \"many\"").unwrap_err();
        assert!(error.to_string().contains("invalid type"), "{error}");
    }
}
