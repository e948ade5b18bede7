//! `kvmesh serve` configuration: flags, `KVMESH_*` environment variables and an optional TOML
//! file, in that order of precedence, resolved into one typed [`ServeConfig`]. Defaults are
//! defined once, in [`super::defaults`], which also shows them in each flag's help.

use crate::engine::local_tokenizer::LocalTokenizer;
use crate::front::intent::IntentRouting;
use crate::serve::defaults;
use crate::serve::media_config::{MediaConfig, MediaFile, media_config};
use anyhow::{Context, bail};
use kvmesh_protocol::Role;
use kvmesh_protocol::hashing::HashMode;
use kvmesh_protocol::route::{AdapterRule, LoadableAdapters, PdConfig, ScoreForm};
use kvmesh_protocol::{HashConfig, RouteConfig, SummaryBuilder, SummaryConfig};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Flags of `kvmesh serve`. Each may also come from the environment or the `--config` file
/// (keys in kebab-case, e.g. `backend = "http://127.0.0.1:8001"`; routing weights under a
/// `[route]` table with the field names of `RouteConfig`).
#[derive(clap::Args, Debug, Default, Deserialize)]
#[command(mut_args(defaults::in_help))]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, env = "KVMESH_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Base URL of the local vLLM server, e.g. http://127.0.0.1:8001 (required).
    #[arg(long, env = "KVMESH_BACKEND")]
    pub backend: Option<String>,
    /// Client-facing HTTP address.
    #[arg(long, env = "KVMESH_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// UDP address of the QUIC mesh endpoint.
    #[arg(long, env = "KVMESH_MESH")]
    pub mesh: Option<SocketAddr>,
    /// Address peers reach this node's mesh at, IP:PORT or HOST:PORT (a host name is resolved
    /// once, at startup) [default: the --mesh address; required when that is 0.0.0.0].
    #[arg(long, env = "KVMESH_ADVERTISE")]
    pub advertise: Option<String>,
    /// Seed nodes' mesh addresses, HOST:PORT, comma-separated; DNS names are re-resolved.
    #[arg(long, env = "KVMESH_SEEDS", value_delimiter = ',')]
    pub seeds: Option<Vec<String>>,
    /// This node's id: its certificate NAME.pem/NAME.key in --tls-dir [default: $HOSTNAME].
    #[arg(long, env = "KVMESH_NODE_ID")]
    pub node_id: Option<String>,
    /// Nodes of other clusters are ignored.
    #[arg(long, env = "KVMESH_CLUSTER_ID")]
    pub cluster_id: Option<String>,
    /// Directory with ca.pem and this node's certificate and key (see `kvmesh cert`).
    #[arg(long, env = "KVMESH_TLS_DIR")]
    pub tls_dir: Option<PathBuf>,
    /// PEM file of CRLs (`kvmesh cert revoke`): peers whose certificate it lists are refused.
    /// Reloaded when it changes, like the files of --tls-dir.
    #[arg(long, env = "KVMESH_CRL")]
    pub crl: Option<PathBuf>,
    /// How often the TLS files (and --crl) are checked for changes; SIGHUP checks at once.
    #[arg(long, env = "KVMESH_TLS_RELOAD_INTERVAL_MS")]
    pub tls_reload_interval_ms: Option<u64>,
    /// Require `Authorization: Bearer KEY` on the OpenAI endpoints.
    #[arg(long, env = "KVMESH_API_KEY")]
    pub api_key: Option<String>,
    /// Bearer token for the local engine, when vLLM runs with --api-key.
    #[arg(long, env = "KVMESH_BACKEND_API_KEY")]
    pub backend_api_key: Option<String>,
    /// Largest request body accepted.
    #[arg(long, env = "KVMESH_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Retries on the next candidate when an attempt fails before the response starts.
    #[arg(long, env = "KVMESH_RETRIES")]
    pub retries: Option<usize>,
    /// Deadline of a request until its response head, and the longest a streamed answer may
    /// then go without a byte.
    #[arg(long, env = "KVMESH_REQUEST_TIMEOUT_SECS")]
    pub request_timeout_secs: Option<u64>,
    /// How long a client may take to send a request's headers, and then its body, before it
    /// gets 408.
    #[arg(long, env = "KVMESH_CLIENT_TIMEOUT_SECS")]
    pub client_timeout_secs: Option<u64>,
    /// On SIGTERM, how long in-flight requests may take to finish.
    #[arg(long, env = "KVMESH_DRAIN_TIMEOUT_SECS")]
    pub drain_timeout_secs: Option<u64>,
    /// How long `/ready` waits for a first live peer before it concludes this node is alone
    /// (its seeds name only itself); without --seeds it does not wait.
    #[arg(long, env = "KVMESH_JOIN_WAIT_SECS")]
    pub join_wait_secs: Option<u64>,
    /// Score form of the decision: `score` (classic weighted score) or `cost` (estimated
    /// TTFT). Over `form` under `[route]`.
    #[arg(long, env = "KVMESH_ROUTE_FORM", value_parser = score_forms())]
    pub route_form: Option<ScoreForm>,
    /// Deprecated: `--route-form`'s old name, read with a warning (`kvmesh-sim`'s `--policy`
    /// names routing policies).
    #[arg(long, env = "KVMESH_POLICY", value_parser = score_forms(), hide = true)]
    pub policy: Option<ScoreForm>,
    /// How often the engine is polled and the load digest refreshed.
    #[arg(long, env = "KVMESH_DIGEST_INTERVAL_MS")]
    pub digest_interval_ms: Option<u64>,
    /// Gossip round period.
    #[arg(long, env = "KVMESH_GOSSIP_INTERVAL_MS")]
    pub gossip_interval_ms: Option<u64>,
    /// Exact mode: the local vLLM's KV-event publisher, e.g. tcp://127.0.0.1:5557 (vLLM's
    /// `--kv-events-config` endpoint). Without it, the node learns its engine's cache from the
    /// requests it serves (approximate mode). Every node of a cluster must use the same mode.
    #[arg(long, env = "KVMESH_KV_EVENTS")]
    pub kv_events: Option<String>,
    /// Exact mode: bind --kv-events instead of connecting to it. vLLM binds its publisher only
    /// on a wildcard endpoint (`tcp://*:5557`); given a host (`tcp://127.0.0.1:5557`) it
    /// connects to it, and this node must be the one listening there.
    #[arg(long, env = "KVMESH_KV_EVENTS_BIND")]
    #[serde(default)]
    pub kv_events_bind: bool,
    /// The publisher's replay endpoint (vLLM's `replay_endpoint`), to recover lost batches.
    #[arg(long, env = "KVMESH_KV_EVENTS_REPLAY")]
    pub kv_events_replay: Option<String>,
    /// Topic to subscribe to [default: "", every topic].
    #[arg(long, env = "KVMESH_KV_EVENTS_TOPIC")]
    pub kv_events_topic: Option<String>,
    /// Exact mode: the model's tokenizer.json, to tokenize completions prompts in this process
    /// instead of asking the engine's /tokenize (chat requests still ask: the file has no chat
    /// template). Needs a build with the `tokenizer` feature.
    #[arg(long, env = "KVMESH_TOKENIZER")]
    pub tokenizer: Option<PathBuf>,
    /// Exact mode's hash block in tokens; must equal vLLM's `--block-size`.
    #[arg(long, env = "KVMESH_BLOCK_TOKENS")]
    pub block_tokens: Option<usize>,
    /// Prefix-summary shards gossiped per node, a power of two.
    #[arg(long, env = "KVMESH_SUMMARY_SHARDS")]
    pub summary_shards: Option<u16>,
    /// Bytes of each summary shard's Bloom filter, a power of two; shards × bytes is the
    /// summary's byte budget.
    #[arg(long, env = "KVMESH_SUMMARY_SHARD_BYTES")]
    pub summary_shard_bytes: Option<u32>,
    /// Threads serving requests. One thread forwards a request with the fewest wake-ups and the
    /// least CPU (no hand-offs between threads); more raise the most one sidecar can serve
    /// when it has cores to itself (figures in BENCHMARKS.md#overhead).
    #[arg(long, env = "KVMESH_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
    /// What this node's engine is for: `mixed` (whole requests), `prefill` (prefill legs of
    /// disaggregated requests) or `decode` (decode legs, and whole requests not worth
    /// disaggregating). Prefill and decode engines must run vLLM with the NixlConnector
    /// (`--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'`).
    #[arg(long, env = "KVMESH_ROLE", value_parser = roles())]
    pub role: Option<Role>,
    /// Intent routing: a TOML file of intents (see docs/intents.md); a request whose `model` is
    /// its auto name (default `auto`) is given the model of the intent its prompt shows.
    #[arg(long, env = "KVMESH_INTENTS")]
    pub intents: Option<PathBuf>,
    /// Intent routing's embedding: a static embedding model's directory (`tokenizer.json` and
    /// `model.safetensors`, the model2vec layout) instead of hashed character n-grams. Needs a
    /// build with the `tokenizer` feature.
    #[arg(long, env = "KVMESH_EMBEDDING_MODEL")]
    pub embedding_model: Option<PathBuf>,
    /// LoRA adapters this node's engine may load at run time, PATTERN=BASE_MODEL (repeatable
    /// or comma-separated; `*` in PATTERN matches any run of characters): a request for a
    /// matching name that no engine serves is placed on one engine of BASE_MODEL, the same
    /// from every entry node, whose sidecar loads it through vLLM's `/v1/load_lora_adapter`
    /// first. The engine must allow it (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`). Also
    /// `adapters = [{ pattern, base }]` under `[lora]` in the file.
    #[arg(
        long = "lora-adapter",
        env = "KVMESH_LORA_ADAPTERS",
        value_delimiter = ','
    )]
    #[serde(skip)]
    pub lora_adapters: Option<Vec<String>>,
    /// The `lora_path` given to the engine for an adapter: `{name}` is replaced by the
    /// adapter's name, `{base}` by its base model's. Also `path_template` under `[lora]`.
    #[arg(long, env = "KVMESH_LORA_PATH_TEMPLATE")]
    #[serde(skip)]
    pub lora_path_template: Option<String>,
    /// How long loading one adapter may take before the requests waiting on it fail. Also
    /// `load_timeout_secs` under `[lora]`.
    #[arg(long, env = "KVMESH_LORA_LOAD_TIMEOUT_SECS")]
    #[serde(skip)]
    pub lora_load_timeout_secs: Option<u64>,
    /// Adapters loaded at run time, under a `[lora]` table (TOML file only).
    #[arg(skip)]
    pub lora: Option<LoraFile>,
    /// Exact mode with media: the token ids the model's `/tokenize` puts in place of an image,
    /// audio or video item (one run per item), e.g. 151655,151656 for Qwen2.5-VL, or
    /// 128000,128001,128002 for `kvmesh-sim engine`. Without them a request's chain stops
    /// before its first media item. Also `placeholder_tokens` under `[media]`.
    #[arg(
        long = "media-placeholder-tokens",
        env = "KVMESH_MEDIA_PLACEHOLDER_TOKENS",
        value_delimiter = ','
    )]
    #[serde(skip)]
    pub media_placeholder_tokens: Option<Vec<u32>>,
    /// Fetch media given by plain URL from the hosts of `--fetch-media-hosts`, hash its bytes
    /// and send them to the engine inline, so that such an item routes and caches by its
    /// content rather than by its URL. Off by default. Also `fetch = true` under `[media]`.
    #[arg(long, env = "KVMESH_FETCH_MEDIA")]
    #[serde(skip)]
    pub fetch_media: bool,
    /// Hosts `--fetch-media` may fetch from (comma-separated, exact names or `*.suffix`):
    /// required with it, so that a client cannot make the sidecar reach internal addresses.
    /// Also `fetch_hosts` under `[media]`.
    #[arg(
        long = "fetch-media-hosts",
        env = "KVMESH_FETCH_MEDIA_HOSTS",
        value_delimiter = ','
    )]
    #[serde(skip)]
    pub fetch_media_hosts: Option<Vec<String>>,
    /// Largest media item `--fetch-media` fetches; a larger one is left as a URL. Also
    /// `fetch_max_bytes` under `[media]`.
    #[arg(long, env = "KVMESH_FETCH_MEDIA_MAX_BYTES")]
    #[serde(skip)]
    pub fetch_media_max_bytes: Option<usize>,
    /// Longest a `--fetch-media` fetch may take; a slower one is left as a URL. Also
    /// `fetch_timeout_ms` under `[media]`.
    #[arg(long, env = "KVMESH_FETCH_MEDIA_TIMEOUT_MS")]
    #[serde(skip)]
    pub fetch_media_timeout_ms: Option<u64>,
    /// Media handling, under a `[media]` table (TOML file only).
    #[arg(skip)]
    pub media: Option<MediaFile>,
    /// Routing weights (TOML file only).
    #[arg(skip)]
    pub route: Option<RouteConfig>,
    /// When requests are disaggregated, under a `[pd]` table (TOML file only).
    #[arg(skip)]
    pub pd: Option<PdConfig>,
}

/// `--route-form` over the file's `route-form`, each also under its deprecated name `policy`
/// (`--policy`, `KVMESH_POLICY`), which logs a warning naming the new one: a manifest
/// written before the rename keeps working.
fn route_form(
    flag: Option<ScoreForm>,
    old_flag: Option<ScoreForm>,
    file: Option<ScoreForm>,
    old_file: Option<ScoreForm>,
) -> Option<ScoreForm> {
    if old_flag.is_some() {
        tracing::warn!(
            "--policy (KVMESH_POLICY) is deprecated: use --route-form (KVMESH_ROUTE_FORM)"
        );
    }
    if old_file.is_some() {
        tracing::warn!("`policy` in the --config file is deprecated: use `route-form`");
    }
    flag.or(old_flag).or(file).or(old_file)
}

/// `--route-form`'s parser: the protocol's names, listed in the help and in errors.
fn score_forms() -> impl clap::builder::TypedValueParser<Value = ScoreForm> {
    use clap::builder::{PossibleValuesParser, TypedValueParser as _};
    PossibleValuesParser::new(ScoreForm::ALL.map(ScoreForm::name))
        .try_map(|name| name.parse::<ScoreForm>())
}

/// `--role`'s parser: the protocol's names, listed in the help and in errors.
fn roles() -> impl clap::builder::TypedValueParser<Value = Role> {
    use clap::builder::{PossibleValuesParser, TypedValueParser as _};
    PossibleValuesParser::new(Role::ALL.map(Role::as_str)).try_map(|name| name.parse::<Role>())
}

/// The `[lora]` table of the configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraFile {
    #[serde(default)]
    pub adapters: Vec<AdapterRule>,
    pub path_template: Option<String>,
    pub load_timeout_secs: Option<u64>,
}

/// Loading LoRA adapters at run time (see `--lora-adapter`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoraConfig {
    /// What this node's engine may load, and onto which base model (gossiped).
    pub loadable: LoadableAdapters,
    /// The engine's `lora_path` for an adapter, with `{name}` and `{base}` to fill in.
    pub path_template: String,
    pub load_timeout: Duration,
}

impl LoraConfig {
    /// The `lora_path` of `adapter` onto `base`.
    pub fn path_of(&self, adapter: &str, base: &str) -> String {
        self.path_template
            .replace("{name}", adapter)
            .replace("{base}", base)
    }
}

impl Default for LoraConfig {
    fn default() -> Self {
        Self {
            loadable: LoadableAdapters::default(),
            path_template: defaults::LORA_PATH_TEMPLATE.into(),
            load_timeout: defaults::LORA_LOAD_TIMEOUT,
        }
    }
}

/// Where exact mode reads the engine's KV events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEventsConfig {
    pub endpoint: String,
    /// Listen on `endpoint` (vLLM connects) rather than connect to it (vLLM binds).
    pub bind: bool,
    pub replay_endpoint: Option<String>,
    pub topic: String,
}

/// The resolved configuration.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub backend: String,
    pub backend_api_key: Option<String>,
    pub listen: SocketAddr,
    pub mesh: SocketAddr,
    pub advertise: Option<SocketAddr>,
    pub seeds: Vec<String>,
    pub node_id: String,
    pub cluster_id: String,
    pub tls_dir: PathBuf,
    /// `--crl`: CRLs enforced on peers.
    pub crl: Option<PathBuf>,
    pub tls_reload_interval: Duration,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    pub retries: usize,
    pub request_timeout: Duration,
    pub client_timeout: Duration,
    pub drain_timeout: Duration,
    /// `/ready`'s bound on waiting for a first peer.
    pub join_wait: Duration,
    pub digest_interval: Duration,
    pub gossip_interval: Duration,
    pub worker_threads: usize,
    pub role: Role,
    pub route: RouteConfig,
    pub pd: PdConfig,
    pub hashing: HashConfig,
    pub summary: SummaryConfig,
    /// Exact mode, when set.
    pub kv_events: Option<KvEventsConfig>,
    /// Exact mode's local tokenizer (`--tokenizer`), loaded at startup.
    pub tokenizer: Option<Arc<LocalTokenizer>>,
    /// Intent routing (`--intents`), loaded at startup.
    pub intents: Option<Arc<IntentRouting>>,
    /// LoRA adapters loaded at run time.
    pub lora: LoraConfig,
    /// Media placeholders and fetching.
    pub media: MediaConfig,
}

impl ServeConfig {
    /// Flags and environment first, then the file, then defaults.
    pub fn resolve(cli: ServeArgs) -> anyhow::Result<Self> {
        let file = match &cli.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading config file {}", path.display()))?;
                toml::from_str::<ServeArgs>(&text)
                    .with_context(|| format!("parsing config file {}", path.display()))?
            }
            None => ServeArgs::default(),
        };
        let Some(backend) = cli.backend.or(file.backend) else {
            bail!("--backend is required (the local vLLM server, e.g. http://127.0.0.1:8001)");
        };
        let Some(tls_dir) = cli.tls_dir.or(file.tls_dir) else {
            bail!(
                "--tls-dir is required (create one with `kvmesh cert init` and `kvmesh cert issue`)"
            );
        };
        let node_id = cli
            .node_id
            .or(file.node_id)
            .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()));
        let Some(node_id) = node_id else {
            bail!("--node-id is required (no $HOSTNAME to default to)");
        };
        let mut route = cli.route.or(file.route).unwrap_or_default();
        if let Some(form) = route_form(cli.route_form, cli.policy, file.route_form, file.policy) {
            route.form = form;
        }
        let role = cli.role.or(file.role).unwrap_or(defaults::ROLE);
        let millis = |v: Option<u64>, default: Duration| {
            v.map_or(default, Duration::from_millis)
                .max(Duration::from_millis(1))
        };
        let kv_events = cli
            .kv_events
            .or(file.kv_events)
            .map(|endpoint| KvEventsConfig {
                endpoint,
                bind: cli.kv_events_bind || file.kv_events_bind,
                replay_endpoint: cli.kv_events_replay.or(file.kv_events_replay),
                topic: cli
                    .kv_events_topic
                    .or(file.kv_events_topic)
                    .unwrap_or_default(),
            });
        let tokenizer = match cli.tokenizer.or(file.tokenizer) {
            None => None,
            Some(_) if kv_events.is_none() => bail!(
                "--tokenizer only applies to exact mode: set --kv-events too, or drop --tokenizer"
            ),
            Some(path) => Some(Arc::new(LocalTokenizer::load(&path)?)),
        };
        let embedding_model = cli.embedding_model.or(file.embedding_model);
        let intents = match cli.intents.or(file.intents) {
            None if embedding_model.is_some() => bail!(
                "--embedding-model only applies to intent routing: set --intents too, or drop --embedding-model"
            ),
            None => None,
            Some(path) => Some(Arc::new(IntentRouting::load(
                &path,
                embedding_model.as_deref(),
            )?)),
        };
        let block_tokens = cli
            .block_tokens
            .or(file.block_tokens)
            .unwrap_or(defaults::BLOCK_TOKENS);
        if block_tokens == 0 {
            bail!("--block-tokens must be positive");
        }
        // Exact mode hashes the engine's token ids, so queries must be hashed in tokens too.
        let hashing = match kv_events {
            Some(_) => HashConfig {
                mode: HashMode::Token { block_tokens },
                token_prompt_block_tokens: block_tokens,
            },
            None => HashConfig::default(),
        };
        let default_summary = SummaryConfig::default();
        let summary = SummaryConfig {
            num_shards: cli
                .summary_shards
                .or(file.summary_shards)
                .unwrap_or(default_summary.num_shards),
            shard_bytes: cli
                .summary_shard_bytes
                .or(file.summary_shard_bytes)
                .unwrap_or(default_summary.shard_bytes),
        };
        let seconds = |value: Option<u64>, flag: &str, default: Duration| match value
            .map_or(default, Duration::from_secs)
        {
            Duration::ZERO => {
                bail!("--{flag} must be positive (a zero deadline would refuse every request)")
            }
            deadline => Ok(deadline),
        };
        let request_timeout = seconds(
            cli.request_timeout_secs.or(file.request_timeout_secs),
            "request-timeout-secs",
            defaults::REQUEST_TIMEOUT,
        )?;
        let client_timeout = seconds(
            cli.client_timeout_secs.or(file.client_timeout_secs),
            "client-timeout-secs",
            defaults::CLIENT_TIMEOUT,
        )?;
        let lora = lora_config(
            cli.lora_adapters,
            cli.lora_path_template,
            cli.lora_load_timeout_secs,
            file.lora.unwrap_or_default(),
        )?;
        let media = media_config(
            cli.media_placeholder_tokens,
            cli.fetch_media,
            cli.fetch_media_hosts,
            cli.fetch_media_max_bytes,
            cli.fetch_media_timeout_ms,
            file.media.unwrap_or_default(),
        )?;
        if let Err(why) = SummaryBuilder::new(summary, 0) {
            bail!("--summary-shards / --summary-shard-bytes: {why}");
        }
        let config = Self {
            backend,
            backend_api_key: cli.backend_api_key.or(file.backend_api_key),
            listen: cli.listen.or(file.listen).unwrap_or(defaults::LISTEN),
            mesh: cli.mesh.or(file.mesh).unwrap_or(defaults::MESH),
            advertise: cli
                .advertise
                .or(file.advertise)
                .map(|address| resolve_advertise(&address))
                .transpose()?,
            seeds: cli.seeds.or(file.seeds).unwrap_or_default(),
            node_id,
            cluster_id: cli
                .cluster_id
                .or(file.cluster_id)
                .unwrap_or_else(|| defaults::CLUSTER_ID.into()),
            tls_dir,
            crl: cli.crl.or(file.crl),
            tls_reload_interval: millis(
                cli.tls_reload_interval_ms.or(file.tls_reload_interval_ms),
                defaults::TLS_RELOAD_INTERVAL,
            ),
            api_key: cli.api_key.or(file.api_key).filter(|k| !k.is_empty()),
            max_body_bytes: cli
                .max_body_bytes
                .or(file.max_body_bytes)
                .unwrap_or(defaults::MAX_BODY_BYTES),
            retries: cli.retries.or(file.retries).unwrap_or(defaults::RETRIES),
            request_timeout,
            client_timeout,
            drain_timeout: cli
                .drain_timeout_secs
                .or(file.drain_timeout_secs)
                .map_or(defaults::DRAIN_TIMEOUT, Duration::from_secs),
            join_wait: cli
                .join_wait_secs
                .or(file.join_wait_secs)
                .map_or(defaults::JOIN_WAIT, Duration::from_secs),
            digest_interval: millis(
                cli.digest_interval_ms.or(file.digest_interval_ms),
                defaults::DIGEST_INTERVAL,
            ),
            gossip_interval: millis(
                cli.gossip_interval_ms.or(file.gossip_interval_ms),
                defaults::GOSSIP_INTERVAL,
            ),
            worker_threads: cli
                .worker_threads
                .or(file.worker_threads)
                .unwrap_or(defaults::WORKER_THREADS),
            role,
            route,
            pd: cli.pd.or(file.pd).unwrap_or_default(),
            hashing,
            summary,
            kv_events,
            tokenizer,
            intents,
            lora,
            media,
        };
        if config.max_body_bytes == 0 {
            bail!("--max-body-bytes must be positive");
        }
        if config.worker_threads == 0 {
            bail!("--worker-threads must be at least 1");
        }
        Ok(config)
    }
}

/// The `--lora-*` flags over the `[lora]` table over the defaults. Rules from the flags
/// replace the file's.
fn lora_config(
    adapters: Option<Vec<String>>,
    path_template: Option<String>,
    load_timeout_secs: Option<u64>,
    file: LoraFile,
) -> anyhow::Result<LoraConfig> {
    let rules = match adapters {
        Some(texts) => texts
            .iter()
            .map(|text| AdapterRule::parse(text))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|why| anyhow::anyhow!("--lora-adapter {why}"))?,
        None => file.adapters,
    };
    let loadable = LoadableAdapters { rules };
    if let Err(why) = loadable.check() {
        bail!("[lora] adapters: {why}");
    }
    let defaults = LoraConfig::default();
    let path_template = path_template
        .or(file.path_template)
        .unwrap_or(defaults.path_template);
    if !path_template.contains("{name}") {
        bail!(
            "--lora-path-template `{path_template}` has no `{{name}}`: every adapter would load the same path"
        );
    }
    let load_timeout = match load_timeout_secs.or(file.load_timeout_secs) {
        Some(0) => bail!("--lora-load-timeout-secs must be positive"),
        Some(secs) => Duration::from_secs(secs),
        None => defaults.load_timeout,
    };
    Ok(LoraConfig {
        loadable,
        path_template,
        load_timeout,
    })
}

/// `--advertise` as a socket address: an IP address as given, a host name resolved now (an IPv4
/// address preferred, as peers most often reach each other over IPv4). A pod's or a host's
/// own name does not move while it runs, so resolving once is enough, unlike the seeds.
fn resolve_advertise(address: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(addr) = address.parse() {
        return Ok(addr);
    }
    let resolved: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(address)
        .with_context(|| format!("--advertise {address}: expected IP:PORT or HOST:PORT"))?
        .collect();
    resolved
        .iter()
        .find(|addr| addr.is_ipv4())
        .or(resolved.first())
        .copied()
        .with_context(|| format!("--advertise {address}: the name resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> ServeArgs {
        ServeArgs {
            backend: Some("http://127.0.0.1:8001".into()),
            tls_dir: Some("/tmp/tls".into()),
            node_id: Some("a".into()),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_fill_what_is_not_given() {
        let config = ServeConfig::resolve(args()).unwrap();
        assert_eq!(config.listen, "0.0.0.0:8000".parse::<SocketAddr>().unwrap());
        assert_eq!(config.kv_events, None);
        assert_eq!(config.hashing, HashConfig::default());
        assert_eq!(config.summary, SummaryConfig::default());
        assert_eq!(config.retries, 2);
        assert_eq!(config.max_body_bytes, 32 * 1024 * 1024);
        assert_eq!(config.worker_threads, 1);
        assert_eq!(config.join_wait, Duration::from_secs(15));
        assert_eq!(config.route, RouteConfig::default());
        assert_eq!(config.role, Role::Mixed);
        assert_eq!(config.pd, PdConfig::default());
        // What the simulator models by default (its test: `simulate::args`'s
        // `defaults_are_the_sidecars`).
        assert_eq!(
            config.digest_interval,
            kvmesh_protocol::cadence::DIGEST_INTERVAL
        );
        assert_eq!(
            config.gossip_interval,
            kvmesh_protocol::cadence::GOSSIP_INTERVAL
        );
        assert_eq!(
            crate::mesh::GossipConfig::default().interval,
            config.gossip_interval
        );
    }

    #[test]
    fn the_role_comes_from_the_flag_and_disaggregation_from_the_pd_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kvmesh.toml");
        std::fs::write(
            &path,
            "role = \"prefill\"\n[pd]\nmin_uncached_tokens = 2048\n",
        )
        .unwrap();
        let mut cli = args();
        cli.config = Some(path.clone());
        let config = ServeConfig::resolve(cli).unwrap();
        assert_eq!(config.role, Role::Prefill);
        assert_eq!(config.pd.min_uncached_tokens, 2048);
        assert_eq!(
            config.pd.max_prefill_wait_ms,
            PdConfig::default().max_prefill_wait_ms
        );
        let mut cli = args();
        cli.config = Some(path.clone());
        cli.role = Some(Role::Decode);
        assert_eq!(ServeConfig::resolve(cli).unwrap().role, Role::Decode);
        let role = |value: &str| {
            let command = <ServeArgs as clap::Args>::augment_args(clap::Command::new("serve"));
            command.try_get_matches_from(["serve", "--role", value])
        };
        assert!(role("prefill").is_ok());
        let error = role("both").unwrap_err().to_string();
        assert!(
            error.contains("--role") && error.contains("[possible values: mixed, prefill, decode]"),
            "{error}"
        );
        std::fs::write(&path, "role = \"both\"\n").unwrap();
        let mut cli = args();
        cli.config = Some(path.clone());
        assert!(
            ServeConfig::resolve(cli).is_err(),
            "an unknown role is refused"
        );
        std::fs::write(&path, "[pd]\nmin_uncached = 1\n").unwrap();
        let mut cli = args();
        cli.config = Some(path);
        assert!(
            ServeConfig::resolve(cli).is_err(),
            "an unknown [pd] key is refused"
        );
    }

    #[test]
    fn flags_win_over_the_file_and_the_file_over_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kvmesh.toml");
        std::fs::write(
            &path,
            "retries = 5\npolicy = \"cost\"\ncluster-id = \"prod\"\nworker-threads = 2\n[route]\nalpha = 2.0\n",
        )
        .unwrap();
        let mut cli = args();
        cli.config = Some(path);
        cli.retries = Some(1);
        let config = ServeConfig::resolve(cli).unwrap();
        assert_eq!(config.retries, 1);
        assert_eq!(config.cluster_id, "prod");
        assert_eq!(config.worker_threads, 2);
        assert_eq!(config.route.form, ScoreForm::Cost);
        assert_eq!(config.route.score.alpha, 2.0);
    }

    /// What `run` logs at WARN and above.
    fn warnings_of<T>(run: impl FnOnce() -> T) -> (T, String) {
        #[derive(Clone, Default)]
        struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let value = tracing::subscriber::with_default(subscriber, run);
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        (value, text)
    }

    #[test]
    fn the_old_name_of_the_route_form_still_works_and_warns() {
        // `--policy cost` or `KVMESH_POLICY=cost` (clap fills the same field from either).
        let command = <ServeArgs as clap::Args>::augment_args(clap::Command::new("serve"));
        let policy = command
            .get_arguments()
            .find(|arg| arg.get_id() == "policy")
            .unwrap();
        assert_eq!(policy.get_long(), Some("policy"));
        assert_eq!(
            policy.get_env(),
            Some(std::ffi::OsStr::new("KVMESH_POLICY"))
        );
        assert!(policy.is_hide_set(), "--help shows only --route-form");
        let (config, warnings) = warnings_of(|| {
            ServeConfig::resolve(ServeArgs {
                policy: Some(ScoreForm::Cost),
                ..args()
            })
        });
        assert_eq!(config.unwrap().route.form, ScoreForm::Cost);
        assert!(
            warnings.contains("--policy (KVMESH_POLICY) is deprecated")
                && warnings.contains("--route-form (KVMESH_ROUTE_FORM)"),
            "{warnings}"
        );
        // The new name wins over the old, and alone warns of nothing.
        let (config, warnings) = warnings_of(|| {
            ServeConfig::resolve(ServeArgs {
                route_form: Some(ScoreForm::Score),
                ..args()
            })
        });
        assert_eq!(config.unwrap().route.form, ScoreForm::Score);
        assert_eq!(warnings, "");
        // The file's old top-level key, and `[route] policy`.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kvmesh.toml");
        std::fs::write(&path, "policy = \"cost\"\n").unwrap();
        let (config, warnings) = warnings_of(|| {
            ServeConfig::resolve(ServeArgs {
                config: Some(path.clone()),
                ..args()
            })
        });
        assert_eq!(config.unwrap().route.form, ScoreForm::Cost);
        assert!(warnings.contains("use `route-form`"), "{warnings}");
        for text in ["[route]\npolicy = \"cost\"\n", "[route]\nform = \"cost\"\n"] {
            std::fs::write(&path, text).unwrap();
            let config = ServeConfig::resolve(ServeArgs {
                config: Some(path.clone()),
                ..args()
            });
            assert_eq!(config.unwrap().route.form, ScoreForm::Cost, "{text}");
        }
    }

    #[test]
    fn the_route_table_keeps_its_flat_keys_for_the_grouped_fields() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kvmesh.toml");
        std::fs::write(
            &path,
            "[route]\nload_slack = 0\nbound_on = \"in_flight\"\ncold_choices = 2\n\
             spread_margin = 0.1\nmax_declines = 1\nmin_hit_blocks = 2\n",
        )
        .unwrap();
        let mut cli = args();
        cli.config = Some(path);
        let route = ServeConfig::resolve(cli).unwrap().route;
        assert_eq!(route.load.slack, 0.0);
        assert_eq!(
            route.load.bound_on,
            kvmesh_protocol::route::BoundOn::InFlight
        );
        assert_eq!(route.cold.choices, 2);
        assert_eq!(route.soft.spread_margin, 0.1);
        assert_eq!(route.late.max_declines, 1);
        assert_eq!(route.hit.min_blocks, 2);
        let default = RouteConfig::default();
        assert_eq!(route.load.epsilon, default.load.epsilon);
        assert_eq!(route.score, default.score);
    }

    #[test]
    fn the_crl_and_the_tls_poll_come_from_the_file_too() {
        let config = ServeConfig::resolve(args()).unwrap();
        assert_eq!(config.crl, None);
        assert_eq!(config.tls_reload_interval, Duration::from_secs(2));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kvmesh.toml");
        std::fs::write(
            &path,
            "crl = \"/etc/kvmesh/crl.pem\"\ntls-reload-interval-ms = 500\n",
        )
        .unwrap();
        let mut cli = args();
        cli.config = Some(path);
        let config = ServeConfig::resolve(cli).unwrap();
        assert_eq!(config.crl, Some("/etc/kvmesh/crl.pem".into()));
        assert_eq!(config.tls_reload_interval, Duration::from_millis(500));
    }

    #[test]
    fn exact_mode_hashes_in_token_blocks_of_the_engine() {
        let mut cli = args();
        cli.kv_events = Some("tcp://127.0.0.1:5557".into());
        cli.block_tokens = Some(32);
        let config = ServeConfig::resolve(cli).unwrap();
        assert_eq!(
            config.kv_events,
            Some(KvEventsConfig {
                endpoint: "tcp://127.0.0.1:5557".into(),
                bind: false,
                replay_endpoint: None,
                topic: String::new(),
            })
        );
        assert_eq!(config.hashing.mode, HashMode::Token { block_tokens: 32 });
        assert_eq!(config.hashing.token_prompt_block_tokens, 32);
    }

    #[test]
    fn advertise_takes_an_address_or_a_host_name() {
        let resolved = |address: &str| {
            ServeConfig::resolve(ServeArgs {
                advertise: Some(address.into()),
                ..args()
            })
            .map(|config| config.advertise)
        };
        assert_eq!(
            resolved("10.0.0.11:7946").unwrap(),
            Some("10.0.0.11:7946".parse().unwrap())
        );
        assert_eq!(
            resolved("localhost:7946").unwrap(),
            Some("127.0.0.1:7946".parse().unwrap())
        );
        for bad in ["localhost", "no-such-host.invalid:7946"] {
            let error = resolved(bad).unwrap_err().to_string();
            assert!(error.contains("--advertise"), "{bad}: {error}");
        }
    }

    #[test]
    fn a_tokenizer_needs_exact_mode_and_a_build_with_the_feature() {
        let mut cli = args();
        cli.tokenizer = Some("tokenizer.json".into());
        let error = ServeConfig::resolve(cli).unwrap_err().to_string();
        assert!(
            error.contains("--tokenizer") && error.contains("--kv-events"),
            "{error}"
        );

        let exact = || ServeArgs {
            kv_events: Some("tcp://127.0.0.1:5557".into()),
            ..args()
        };
        let fixture = || Some(crate::engine::local_tokenizer::TEST_FIXTURE.into());
        let resolved = ServeConfig::resolve(ServeArgs {
            tokenizer: fixture(),
            ..exact()
        });
        if cfg!(feature = "tokenizer") {
            assert!(resolved.unwrap().tokenizer.is_some());
            let error = ServeConfig::resolve(ServeArgs {
                tokenizer: Some("/no/such/tokenizer.json".into()),
                ..exact()
            })
            .unwrap_err()
            .to_string();
            assert!(error.contains("/no/such/tokenizer.json"), "{error}");
        } else {
            let error = resolved.unwrap_err().to_string();
            assert!(
                error.contains("built without the `tokenizer` feature"),
                "{error}"
            );
        }
        assert!(ServeConfig::resolve(exact()).unwrap().tokenizer.is_none());
    }

    #[test]
    fn intents_load_at_startup_and_an_embedding_model_needs_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("intents.toml");
        std::fs::write(
            &path,
            "default_model = \"g\"\n[[intent]]\nname = \"c\"\nmodel = \"m\"\nexamples = [\"x\"]\n",
        )
        .unwrap();
        let config = ServeConfig::resolve(ServeArgs {
            intents: Some(path.clone()),
            ..args()
        })
        .unwrap();
        assert_eq!(config.intents.unwrap().router.file().default_model, "g");
        let error = ServeConfig::resolve(ServeArgs {
            embedding_model: Some(dir.path().into()),
            ..args()
        })
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("--embedding-model") && error.contains("--intents"),
            "{error}"
        );
        std::fs::write(&path, "default_model = \"g\"\n").unwrap();
        let error = format!(
            "{:#}",
            ServeConfig::resolve(ServeArgs {
                intents: Some(path),
                ..args()
            })
            .unwrap_err()
        );
        assert!(error.contains("intents.toml"), "{error}");
    }

    #[test]
    fn loadable_adapters_come_from_the_flags_or_the_lora_table() {
        assert_eq!(
            ServeConfig::resolve(args()).unwrap().lora,
            LoraConfig::default()
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kvmesh.toml");
        std::fs::write(
            &path,
            "[lora]\npath_template = \"/adapters/{base}/{name}\"\nload_timeout_secs = 5\n\
             adapters = [{ pattern = \"sql-*\", base = \"model-b\" }]\n",
        )
        .unwrap();
        let mut cli = args();
        cli.config = Some(path.clone());
        let lora = ServeConfig::resolve(cli).unwrap().lora;
        assert_eq!(lora.loadable.base_of("sql-v2"), Some("model-b"));
        assert_eq!(
            lora.path_of("sql-v2", "model-b"),
            "/adapters/model-b/sql-v2"
        );
        assert_eq!(lora.load_timeout, Duration::from_secs(5));
        let mut cli = args();
        cli.config = Some(path);
        cli.lora_adapters = Some(vec!["chat=model-a".into(), "*=model-c".into()]);
        let lora = ServeConfig::resolve(cli).unwrap().lora;
        assert_eq!(lora.loadable.base_of("sql-v2"), Some("model-c"));
        assert_eq!(lora.loadable.base_of("chat"), Some("model-a"));
        for (flags, template, expected) in [
            (vec!["chat"], None, "--lora-adapter"),
            (vec!["a=b"], Some("/adapters/x"), "--lora-path-template"),
        ] {
            let mut cli = args();
            cli.lora_adapters = Some(flags.into_iter().map(String::from).collect());
            cli.lora_path_template = template.map(String::from);
            let error = ServeConfig::resolve(cli).unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
        }
    }

    #[test]
    fn clear_errors_for_missing_or_bad_values() {
        let mut cli = args();
        cli.summary_shard_bytes = Some(1000);
        assert!(
            ServeConfig::resolve(cli)
                .unwrap_err()
                .to_string()
                .contains("--summary-shard-bytes")
        );
        let mut cli = args();
        cli.backend = None;
        assert!(
            ServeConfig::resolve(cli)
                .unwrap_err()
                .to_string()
                .contains("--backend")
        );
        let mut cli = args();
        cli.worker_threads = Some(0);
        assert!(
            ServeConfig::resolve(cli)
                .unwrap_err()
                .to_string()
                .contains("--worker-threads")
        );
        for zero in ["request", "client"] {
            let mut cli = args();
            match zero {
                "request" => cli.request_timeout_secs = Some(0),
                _ => cli.client_timeout_secs = Some(0),
            }
            let error = ServeConfig::resolve(cli).unwrap_err().to_string();
            assert!(error.contains(&format!("--{zero}-timeout-secs")), "{error}");
        }
        for flag in ["--route-form", "--policy"] {
            let form = |value: &str| {
                let command = <ServeArgs as clap::Args>::augment_args(clap::Command::new("serve"));
                command.try_get_matches_from(["serve", flag, value])
            };
            assert!(form("cost").is_ok());
            let error = form("fastest").unwrap_err().to_string();
            assert!(
                error.contains(flag) && error.contains("[possible values: score, cost]"),
                "{error}"
            );
        }
        for key in ["route-form", "policy"] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("form.toml");
            std::fs::write(&path, format!("{key} = \"fastest\"\n")).unwrap();
            let mut cli = args();
            cli.config = Some(path);
            assert!(ServeConfig::resolve(cli).is_err(), "{key}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "no-such-key = 1\n").unwrap();
        let mut cli = args();
        cli.config = Some(path);
        assert!(ServeConfig::resolve(cli).is_err());
    }
}
