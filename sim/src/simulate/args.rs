//! Command-line configuration of `kvmesh-sim simulate`.

use std::path::PathBuf;

use kvmesh_protocol::route::{PdConfig, ScoreForm};
use kvmesh_protocol::{RouteConfig, SummaryConfig, cadence};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::cluster::{ClusterConfig, Join};
use super::gossip::CALIBRATED_HOP_S;
use super::gossip::epidemic::GossipParams;
use super::pd::{DecodeChoice, PdSetup, Slo, SplitRule};
use super::policy::PolicyKind;
use crate::engine::config::parse_engine_profile;
use crate::engine::model::config::DEFAULT_NUM_GPU_BLOCKS;
use crate::engine::model::timing::encoder_s_per_media_token;
use crate::engine::model::{EngineConfig, EngineProfile, Overrides, TimingModel};
use crate::workload::{WorkloadArgs, WorkloadKind};

/// Lease of a prefill leg's blocks in the simulated engines: longer than any run.
const KV_LEASE_UNTIL_PULLED: std::time::Duration = std::time::Duration::from_secs(1 << 30);

/// What a node's own candidate carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SelfView {
    /// Its digest and its own summary, without lag.
    Summary,
    /// Its digest only: no sidecar routes so since 709218e (its own candidate carries its
    /// own summary); kept to measure what that summary is worth.
    Digest,
}

/// `--route-form`'s parser: the protocol's names, listed in the help and in errors.
fn score_forms() -> impl clap::builder::TypedValueParser<Value = ScoreForm> {
    use clap::builder::{PossibleValuesParser, TypedValueParser as _};
    PossibleValuesParser::new(ScoreForm::ALL.map(ScoreForm::name))
        .try_map(|name| name.parse::<ScoreForm>())
}

/// `kvmesh-sim simulate`: a discrete-event cluster simulation of routing policies.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct SimulateArgs {
    /// Number of nodes (engine + sidecar each).
    #[arg(long, default_value_t = 16)]
    pub nodes: usize,
    /// Policies to compare, comma separated (default: all).
    #[arg(long = "policy", value_enum, value_delimiter = ',')]
    pub policies: Vec<PolicyKind>,
    /// Workload (--trace FILE implies trace).
    #[arg(long, value_enum, default_value_t = WorkloadKind::Gsp)]
    pub workload: WorkloadKind,
    /// Requests to simulate (default: the trace's length, or 2,000).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Requests to simulate per node (scales with --sweep-nodes).
    #[arg(long, conflicts_with = "requests")]
    pub requests_per_node: Option<u64>,
    /// Only the requests that arrive within this many seconds, as the load generator's
    /// `--duration` stops sending new ones (unbounded in number unless --requests says so).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Poisson arrival rate for the whole cluster, requests/s (overrides trace timestamps).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Poisson arrival rate per node, requests/s (default for synthetic workloads: 2).
    #[arg(long, conflicts_with = "rate")]
    pub rate_per_node: Option<f64>,
    /// Divide trace timestamps by this factor (2 = twice as fast).
    #[arg(long, default_value_t = 1.0)]
    pub trace_speedup: f64,
    /// Gossip round interval, milliseconds (the sidecar's default).
    #[arg(long, default_value_t = cadence::GOSSIP_INTERVAL.as_millis() as u64)]
    pub gossip_interval: u64,
    /// Peers contacted per gossip round.
    #[arg(long, default_value_t = 3)]
    pub gossip_fanout: u32,
    /// Probability that a gossip message is lost.
    #[arg(long, default_value_t = 0.0)]
    pub gossip_loss: f64,
    /// One-way delay of a gossip message, milliseconds (default calibrated on the real mesh).
    #[arg(long, default_value_t = CALIBRATED_HOP_S * 1e3)]
    pub gossip_hop_ms: f64,
    /// Engine poll, digest refresh and summary publish interval, milliseconds (the sidecar's
    /// default).
    #[arg(long, default_value_t = cadence::DIGEST_INTERVAL.as_millis() as u64)]
    pub digest_interval: u64,
    /// Milliseconds from a change to a node's queue until it publishes its digest (the
    /// sidecar's default); 0: only at the digest interval.
    #[arg(long, default_value_t = cadence::PUBLISH_COALESCE.as_millis() as u64)]
    pub publish_coalesce: u64,
    /// Lag classes of the aggregate gossip model (more = finer staleness, more memory; at
    /// most 64).
    #[arg(long, default_value_t = 8)]
    pub lag_classes: usize,
    /// Summary shards per node.
    #[arg(long, default_value_t = SummaryConfig::default().num_shards)]
    pub summary_shards: u16,
    /// Bytes of Bloom filter per shard.
    #[arg(long, default_value_t = SummaryConfig::default().shard_bytes)]
    pub summary_shard_bytes: u32,
    /// What a node knows of itself when routing.
    #[arg(long, value_enum, default_value_t = SelfView::Summary)]
    pub self_view: SelfView,
    /// Scoring form of `decide`.
    #[arg(long, value_parser = score_forms(), default_value_t = RouteConfig::default().form)]
    pub route_form: ScoreForm,
    /// Spread band of `decide` (`spread_margin` of `[route]`); 0 ranks near-equal candidates by
    /// score and node key alone.
    #[arg(long, default_value_t = RouteConfig::default().soft.spread_margin)]
    pub spread_margin: f64,
    /// Any other setting of `decide`, as in the node's `[route]` table: `NAME=VALUE`
    /// (repeatable; VALUE in JSON, e.g. `load_slack=1` or `bound_on="in_flight"`).
    #[arg(long = "route", value_name = "NAME=VALUE", value_parser = parse_route_setting)]
    pub route_settings: Vec<(String, serde_json::Value)>,
    /// KV cache blocks per engine (default 8192, or the size the workload is made for:
    /// rag-pressure's small cache).
    #[arg(long)]
    pub kv_blocks: Option<u32>,
    /// The modelled engines, as the mock engine's `--engine-profile`: `h100-8b` (default),
    /// `cpu-tiny` or `legacy` (the model before issue 45, for figures recorded with it).
    #[arg(long, value_parser = parse_engine_profile, default_value_t = EngineProfile::default())]
    pub engine_profile: EngineProfile,
    /// Most sequences in an engine's batch (default: the profile's).
    #[arg(long)]
    pub max_num_seqs: Option<u32>,
    /// Token budget of an engine's step (default: the profile's).
    #[arg(long)]
    pub max_num_batched_tokens: Option<u32>,
    /// Engine prefill speed, tokens/s (overrides the profile's compute time per token).
    #[arg(long)]
    pub prefill_tokens_per_s: Option<f64>,
    /// Engine decode step at batch size 1, milliseconds (overrides the profile's).
    #[arg(long)]
    pub decode_step_ms: Option<f64>,
    /// Multiplier on every modelled engine duration, as the mock engine's `--time-scale`
    /// (1.0 = real time, 0.3 = 3.3 times faster); the sidecars' cadences do not scale.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Nodes per zone of the kvmesh-zoned policy.
    #[arg(long, default_value_t = 64)]
    pub zone_size: usize,
    #[command(flatten)]
    #[serde(flatten)]
    pub workload_args: WorkloadArgs,
    /// Run at each of these node counts (comma separated) instead of --nodes.
    #[arg(long, value_delimiter = ',')]
    pub sweep_nodes: Vec<usize>,
    /// Write the full report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write every request's record (entry, serving node, reason, TTFT), one JSON line each,
    /// into this directory as `NODES-POLICY.records.jsonl`: the load generator's `--records`,
    /// request by request.
    #[arg(long)]
    pub records_dir: Option<PathBuf>,
    /// Write SVG plots into this directory.
    #[arg(long)]
    pub svg_dir: Option<PathBuf>,
    /// Policies simulated in parallel (each in its own thread).
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// Threads publishing the nodes' digests and summaries in one gossiping policy's
    /// simulation (results do not depend on it).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Round trip of a message between two sidecars, milliseconds: what a forwarded attempt,
    /// its answer's head and a decline cost (default: the added latency of a cross-node
    /// request on loopback, BENCHMARKS.md#overhead).
    #[arg(long, default_value_t = 0.28)]
    pub mesh_rtt_ms: f64,
    /// Requests enter at the first this many nodes only (default: every node, at random): a
    /// batch job that calls one sidecar, say.
    #[arg(long)]
    pub entry_nodes: Option<usize>,
    /// The last this many nodes join the cluster at `--join-at` seconds into the run (a
    /// sidecar started with the seed list under load); until then they take no request and
    /// are no entry. With `--entry-nodes` at most the nodes up from the start, requests
    /// keep entering where they did (as a load generator given a fixed list of sidecars).
    #[arg(long, default_value_t = 0)]
    pub join_nodes: usize,
    /// When the `--join-nodes` join, seconds after the run starts.
    #[arg(long, default_value_t = 0.0)]
    pub join_at: f64,
    /// Engines with the prefill role (nodes 0..N; the others decode). 0: every engine is
    /// mixed. The kvmesh policies disaggregate as the sidecar does; random, round-robin,
    /// least-loaded and power-of-two split every request as the central PD routers do (each
    /// leg's engine by their rule); chwbl and the oracle are refused.
    #[arg(long, default_value_t = 0)]
    pub prefill_nodes: usize,
    /// A setting of disaggregation, as in the node's `[pd]` table: `NAME=VALUE` (repeatable;
    /// e.g. `min_uncached_tokens=1024`, `max_prefill_wait_ms=1000`, `warm_margin=2`).
    #[arg(long = "pd", value_name = "NAME=VALUE", value_parser = parse_route_setting)]
    pub pd_settings: Vec<(String, serde_json::Value)>,
    /// Which requests the kvmesh policies disaggregate: by the skip rule of `--pd`, or all of
    /// them (the central routers split all of them).
    #[arg(long, value_enum, default_value_t = SplitRule::Skip)]
    pub pd_split: SplitRule,
    /// When a disaggregated request's decode engine is chosen.
    #[arg(long, value_enum, default_value_t = DecodeChoice::PrefillEnd)]
    pub pd_decode: DecodeChoice,
    /// Bytes of KV per token, which a pull moves (default: an 8B model, as the engine's).
    #[arg(long, default_value_t = 131_072)]
    pub kv_bytes_per_token: u64,
    /// Bandwidth of a KV pull, GB/s.
    #[arg(long, default_value_t = 10.0)]
    pub nixl_bandwidth_gb_s: f64,
    /// Handshake of a decode engine's first pull from a prefill engine, milliseconds.
    #[arg(long, default_value_t = 5000.0)]
    pub nixl_handshake_ms: f64,
    /// TTFT objective of goodput, milliseconds.
    #[arg(long, default_value_t = 2000.0)]
    pub slo_ttft_ms: f64,
    /// Objective of goodput for a request's mean gap between tokens, milliseconds.
    #[arg(long, default_value_t = 100.0)]
    pub slo_itl_ms: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Mixed into each request's key for spreading among near-equal engines. A sidecar keys
    /// it by the request's id, which carries its clock (`kvmesh-NODE-MS-N`), so every real run
    /// draws its own; runs with several values sample what the real runs vary over (the
    /// workload, arrivals and entries stay those of --seed).
    #[arg(long, default_value_t = 0)]
    pub spread_seed: u64,
}

impl SimulateArgs {
    /// The policies to run, in a fixed order.
    pub fn policy_list(&self) -> Vec<PolicyKind> {
        let mut list = if self.policies.is_empty() {
            PolicyKind::ALL.to_vec()
        } else {
            self.policies.clone()
        };
        list.sort();
        list.dedup();
        list
    }

    /// The workload to run.
    pub fn workload_kind(&self) -> WorkloadKind {
        self.workload_args.kind(self.workload)
    }

    /// KV cache blocks per engine.
    pub fn kv_blocks(&self) -> u32 {
        // Unless `--kv-blocks` or the workload says otherwise, the mock engine's default.
        self.kv_blocks
            .or(self.workload_kind().kv_blocks())
            .unwrap_or(DEFAULT_NUM_GPU_BLOCKS)
            .max(1)
    }

    /// `decide`'s settings: the defaults, the form and spread margin flags, then `--route`.
    pub fn route_config(&self) -> Result<RouteConfig, String> {
        let base = RouteConfig {
            form: self.route_form,
            soft: kvmesh_protocol::route::SoftPreferences {
                spread_margin: self.spread_margin.max(0.0),
                ..Default::default()
            },
            ..RouteConfig::default()
        };
        with_settings(base, &self.route_settings, "--route")
    }

    /// Disaggregation, if `--prefill-nodes` asks for it: `--pd` over the defaults, then
    /// `--pd-split`.
    pub fn pd_setup(&self) -> Result<Option<PdSetup>, String> {
        if self.prefill_nodes == 0 {
            return Ok(None);
        }
        let config = with_settings(PdConfig::default(), &self.pd_settings, "--pd")?;
        Ok(Some(PdSetup::new(
            self.prefill_nodes,
            config,
            self.pd_split,
            self.pd_decode,
        )))
    }

    /// Seconds a pull takes per KV block of `block_size` tokens.
    fn transfer_s_per_block(&self, block_size: u32) -> f64 {
        self.kv_bytes_per_token.max(1) as f64 * f64::from(block_size)
            / (self.nixl_bandwidth_gb_s.max(1e-9) * 1e9)
    }

    pub fn cluster_config(
        &self,
        nodes: usize,
        route: RouteConfig,
        pd: Option<PdSetup>,
    ) -> ClusterConfig {
        let block_size = EngineConfig::default().block_size;
        let profile = self.engine_profile;
        let step = profile.step_cost().with(&Overrides {
            prefill_tokens_per_s: self.prefill_tokens_per_s.map(|v| v.max(1.0)),
            decode_step_s: self.decode_step_ms.map(|ms| ms / 1e3),
            ..Overrides::default()
        });
        ClusterConfig {
            nodes,
            engine: EngineConfig {
                num_gpu_blocks: self.kv_blocks(),
                max_num_seqs: self.max_num_seqs.unwrap_or(profile.max_num_seqs()).max(1),
                max_num_batched_tokens: self
                    .max_num_batched_tokens
                    .unwrap_or(profile.max_num_batched_tokens())
                    .max(1),
                timing: TimingModel {
                    // As the mock engine's default: a third of its prefill cost per token.
                    encoder_s_per_media_token: encoder_s_per_media_token(
                        step.prefill_tokens_per_s(),
                    ),
                    kv_transfer_s_per_block: self.transfer_s_per_block(block_size),
                    kv_handshake_s: self.nixl_handshake_ms.max(0.0) / 1e3,
                    time_scale: self.time_scale.max(0.0),
                    ..TimingModel::of(step)
                },
                // The decode side heartbeats a lease for as long as its decode leg waits
                // (every sixth of it, vLLM): in the model, where nothing fails, a held copy
                // ends when it is pulled, never by expiry.
                kv_lease: KV_LEASE_UNTIL_PULLED,
                ..EngineConfig::default()
            },
            pd,
            slo: Slo {
                ttft_s: self.slo_ttft_ms.max(0.0) / 1e3,
                itl_s: self.slo_itl_ms.max(0.0) / 1e3,
            },
            summary: SummaryConfig {
                num_shards: self.summary_shards,
                shard_bytes: self.summary_shard_bytes,
            },
            route,
            gossip: GossipParams {
                interval_s: self.gossip_interval.max(1) as f64 / 1e3,
                fanout: self.gossip_fanout.max(1),
                loss: self.gossip_loss.clamp(0.0, 0.99),
                hop_s: self.gossip_hop_ms.max(0.0) / 1e3,
            },
            digest_interval_s: self.digest_interval.max(1) as f64 / 1e3,
            publish_coalesce_s: self.publish_coalesce as f64 / 1e3,
            lag_classes: self.lag_classes.clamp(1, 64),
            chwbl_epsilon: 0.25,
            zone_size: self.zone_size.max(1),
            threads: self.threads.max(1),
            mesh_hop_ns: (self.mesh_rtt_ms.max(0.0) * 1e6 / 2.0) as u64,
            entry_nodes: self.entry_nodes.unwrap_or(nodes).clamp(1, nodes.max(1)),
            join: (self.join_nodes > 0).then(|| Join {
                nodes: self.join_nodes,
                at_ns: (self.join_at.max(0.0) * 1e9) as u64,
            }),
            spread_seed: self.spread_seed,
            self_summary: self.self_view == SelfView::Summary,
            seed: self.seed,
        }
    }
}

/// `NAME=VALUE` of `--route`: VALUE is JSON, or else a bare string.
fn parse_route_setting(text: &str) -> Result<(String, serde_json::Value), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}`: expected NAME=VALUE"))?;
    let value = serde_json::from_str(value).unwrap_or_else(|_| value.into());
    Ok((name.trim().to_owned(), value))
}

/// `config` with `settings` applied by name, as the node reads its `[route]` or `[pd]` table:
/// an unknown name or a value of the wrong type is an error, not ignored. `flag` names the
/// flag in errors.
fn with_settings<T: Serialize + DeserializeOwned>(
    config: T,
    settings: &[(String, serde_json::Value)],
    flag: &str,
) -> Result<T, String> {
    let mut fields = match serde_json::to_value(config) {
        Ok(serde_json::Value::Object(fields)) => fields,
        other => return Err(format!("{flag}: the settings serialised as {other:?}")),
    };
    for (name, value) in settings {
        match fields.get_mut(name) {
            Some(field) => *field = value.clone(),
            None => {
                let known: Vec<&str> = fields.keys().map(String::as_str).collect();
                return Err(format!(
                    "{flag} {name}: no such setting (known: {})",
                    known.join(", ")
                ));
            }
        }
    }
    serde_json::from_value(serde_json::Value::Object(fields)).map_err(|e| format!("{flag}: {e}"))
}

#[cfg(test)]
mod route_setting_tests {
    use super::*;

    #[test]
    fn settings_apply_by_name_and_unknown_or_mistyped_ones_are_refused() {
        let set = |text: &str| parse_route_setting(text).unwrap();
        let config = with_settings(
            RouteConfig::default(),
            &[set("load_slack=1"), set("bound_on=in_flight")],
            "--route",
        )
        .unwrap();
        assert_eq!(config.load.slack, 1.0);
        assert_eq!(
            config.load.bound_on,
            kvmesh_protocol::route::BoundOn::InFlight
        );
        assert!(with_settings(RouteConfig::default(), &[set("load_slak=1")], "--route").is_err());
        assert!(
            with_settings(RouteConfig::default(), &[set("load_slack=many")], "--route").is_err()
        );
        assert!(parse_route_setting("load_slack").is_err());
        let pd = with_settings(
            PdConfig::default(),
            &[set("min_uncached_tokens=2048")],
            "--pd",
        )
        .unwrap();
        assert_eq!(pd.min_uncached_tokens, 2048);
        assert_eq!(
            pd.max_prefill_wait_ms,
            PdConfig::default().max_prefill_wait_ms
        );
        let unknown = with_settings(PdConfig::default(), &[set("min_tokens=1")], "--pd");
        assert!(unknown.is_err_and(|e| e.starts_with("--pd min_tokens")));
    }
}

#[cfg(test)]
mod defaults_tests {
    use super::*;
    use kvmesh_protocol::hashing::DEFAULT_BLOCK_TOKENS;

    /// The simulator models the sidecar as it runs by default: the settings both read from
    /// `protocol` must come out the same here as in `kvmesh serve` (whose own test,
    /// `serve::config`'s `defaults_fill_what_is_not_given`, pins the node to the same values).
    #[test]
    fn defaults_are_the_sidecars() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: SimulateArgs,
        }
        let args = <Cli as clap::Parser>::parse_from(["simulate"]).args;
        let route = args.route_config().unwrap();
        assert_eq!(route, RouteConfig::default());
        let config = args.cluster_config(16, route, None);
        assert_eq!(config.summary, SummaryConfig::default());
        assert_eq!(
            config.gossip.interval_s,
            cadence::GOSSIP_INTERVAL.as_secs_f64()
        );
        assert_eq!(
            config.digest_interval_s,
            cadence::DIGEST_INTERVAL.as_secs_f64()
        );
        assert_eq!(
            config.publish_coalesce_s,
            cadence::PUBLISH_COALESCE.as_secs_f64()
        );
        assert_eq!(config.engine.block_size as usize, DEFAULT_BLOCK_TOKENS);
        // And its engines are the mock engine's, flag for flag (see the engine's own test).
        let model = EngineConfig::default();
        assert_eq!(config.engine.num_gpu_blocks, model.num_gpu_blocks);
        assert_eq!(config.engine.max_num_seqs, model.max_num_seqs);
        assert_eq!(
            config.engine.max_num_batched_tokens,
            model.max_num_batched_tokens
        );
        assert_eq!(config.engine.timing.step, model.timing.step);
        assert_eq!(
            config.engine.timing.encoder_s_per_media_token,
            model.timing.encoder_s_per_media_token
        );
    }
}
