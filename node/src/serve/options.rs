//! `kvmesh serve`'s options, each declared once: its help (the doc comment), its flag and
//! environment variable (`#[arg]`), its `--config` file key (the field's name in kebab-case, or
//! `in TABLE.KEY`, or `flag only`) and its default (`= …`, shown in its help; without one the
//! option is unset, which for a list or a switch means empty or off). `super::declare` says
//! what the rows become; `ServeConfig::resolve` (`super::config`) does what no row can say.
//!
//! Adding an option is adding a row (and reading it in `resolve`):
//!
//! ```text
//! /// Largest batch the sidecar forwards at once.
//! #[arg(long, env = "KVMESH_MAX_BATCH")]
//! max_batch: usize = 8,
//! ```
//!
//! Not clap's `default_value`: a flag that always has a value would shadow the `--config`
//! file, which sits between the flags (and environment) and these defaults.

use super::declare::{Millis, Secs, serve_options};
use super::media_config::MediaFile;
use crate::serve::config::LoraFile;
use kvmesh_protocol::hashing::DEFAULT_BLOCK_TOKENS;
use kvmesh_protocol::route::{PdConfig, ScoreForm};
use kvmesh_protocol::{Role, RouteConfig, SummaryConfig, cadence};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;

serve_options! {
    options {
        /// Base URL of the local vLLM server, e.g. http://127.0.0.1:8001 (required).
        #[arg(long, env = "KVMESH_BACKEND")]
        backend: String,
        /// Client-facing HTTP address.
        #[arg(long, env = "KVMESH_LISTEN")]
        listen: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8000)),
        /// UDP address of the QUIC mesh endpoint.
        #[arg(long, env = "KVMESH_MESH")]
        mesh: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 7946)),
        /// Address peers reach this node's mesh at, IP:PORT or HOST:PORT (a host name is resolved
        /// once, at startup) [default: the --mesh address; required when that is 0.0.0.0].
        #[arg(long, env = "KVMESH_ADVERTISE")]
        advertise: String,
        /// Seed nodes' mesh addresses, HOST:PORT, comma-separated; DNS names are re-resolved.
        #[arg(long, env = "KVMESH_SEEDS", value_delimiter = ',')]
        seeds: Vec<String>,
        /// This node's id: its certificate NAME.pem/NAME.key in --tls-dir [default: $HOSTNAME].
        #[arg(long, env = "KVMESH_NODE_ID")]
        node_id: String,
        /// Nodes of other clusters are ignored.
        #[arg(long, env = "KVMESH_CLUSTER_ID")]
        cluster_id: String = "kvmesh".into(),
        /// Directory with ca.pem and this node's certificate and key (see `kvmesh cert`).
        #[arg(long, env = "KVMESH_TLS_DIR")]
        tls_dir: PathBuf,
        /// PEM file of CRLs (`kvmesh cert revoke`): peers whose certificate it lists are refused.
        /// Reloaded when it changes, like the files of --tls-dir.
        #[arg(long, env = "KVMESH_CRL")]
        crl: PathBuf,
        /// How often the TLS files (and --crl) are checked for changes; SIGHUP checks at once.
        #[arg(long, env = "KVMESH_TLS_RELOAD_INTERVAL_MS")]
        // Why polling: `tls::reload`.
        tls_reload_interval_ms: Millis = Millis::of(crate::tls::reload::DEFAULT_INTERVAL),
        /// Require `Authorization: Bearer KEY` on the OpenAI endpoints.
        #[arg(long, env = "KVMESH_API_KEY")]
        api_key: String,
        /// Bearer token for the local engine, when vLLM runs with --api-key.
        #[arg(long, env = "KVMESH_BACKEND_API_KEY")]
        backend_api_key: String,
        /// Largest request body accepted.
        #[arg(long, env = "KVMESH_MAX_BODY_BYTES")]
        max_body_bytes: usize = 32 * 1024 * 1024, // 32 MiB
        /// Retries on the next candidate when an attempt fails before the response starts.
        #[arg(long, env = "KVMESH_RETRIES")]
        retries: usize = 2,
        /// Deadline of a request until its response head, and the longest a streamed answer may
        /// then go without a byte.
        #[arg(long, env = "KVMESH_REQUEST_TIMEOUT_SECS")]
        request_timeout_secs: Secs = Secs(600),
        /// How long a client may take to send a request's headers, and then its body, before it
        /// gets 408.
        #[arg(long, env = "KVMESH_CLIENT_TIMEOUT_SECS")]
        client_timeout_secs: Secs = Secs(60),
        /// On SIGTERM, how long in-flight requests may take to finish.
        #[arg(long, env = "KVMESH_DRAIN_TIMEOUT_SECS")]
        drain_timeout_secs: Secs = Secs(30),
        /// How long `/ready` waits for a first live peer before it concludes this node is alone
        /// (its seeds name only itself); without --seeds it does not wait.
        #[arg(long, env = "KVMESH_JOIN_WAIT_SECS")]
        join_wait_secs: Secs = Secs(15),
        /// Score form of the decision: `score` (classic weighted score) or `cost` (estimated
        /// TTFT). Over `form` under `[route]` [default: score].
        #[arg(long, env = "KVMESH_ROUTE_FORM", value_parser = score_forms())]
        route_form: ScoreForm,
        /// Deprecated: `--route-form`'s old name, read with a warning (`kvmesh-sim`'s `--policy`
        /// names routing policies).
        #[arg(long, env = "KVMESH_POLICY", value_parser = score_forms(), hide = true)]
        policy: ScoreForm,
        /// How often the engine is polled and the load digest refreshed.
        #[arg(long, env = "KVMESH_DIGEST_INTERVAL_MS")]
        digest_interval_ms: Millis = Millis::of(cadence::DIGEST_INTERVAL),
        /// Gossip round period.
        #[arg(long, env = "KVMESH_GOSSIP_INTERVAL_MS")]
        gossip_interval_ms: Millis = Millis::of(cadence::GOSSIP_INTERVAL),
        /// Exact mode: the local vLLM's KV-event publisher, e.g. tcp://127.0.0.1:5557 (vLLM's
        /// `--kv-events-config` endpoint). Without it, the node learns its engine's cache from the
        /// requests it serves (approximate mode). Every node of a cluster must use the same mode.
        #[arg(long, env = "KVMESH_KV_EVENTS")]
        kv_events: String,
        /// Exact mode: bind --kv-events instead of connecting to it. vLLM binds its publisher only
        /// on a wildcard endpoint (`tcp://*:5557`); given a host (`tcp://127.0.0.1:5557`) it
        /// connects to it, and this node must be the one listening there.
        #[arg(long, env = "KVMESH_KV_EVENTS_BIND", value_name = "BOOL", num_args = 0..=1,
              require_equals = true, default_missing_value = "true")]
        // A switch: given alone it is on; not given it is unset, so the file's value counts
        // (a clap switch, `bool`, is always set, and would shadow the file).
        kv_events_bind: bool,
        /// The publisher's replay endpoint (vLLM's `replay_endpoint`), to recover lost batches.
        #[arg(long, env = "KVMESH_KV_EVENTS_REPLAY")]
        kv_events_replay: String,
        /// Topic to subscribe to [default: "", every topic].
        #[arg(long, env = "KVMESH_KV_EVENTS_TOPIC")]
        kv_events_topic: String,
        /// Exact mode: the model's tokenizer.json, to tokenize completions prompts in this process
        /// instead of asking the engine's /tokenize (chat requests still ask: the file has no chat
        /// template). Needs a build with the `tokenizer` feature.
        #[arg(long, env = "KVMESH_TOKENIZER")]
        tokenizer: PathBuf,
        /// Exact mode's hash block in tokens; must equal vLLM's `--block-size`.
        #[arg(long, env = "KVMESH_BLOCK_TOKENS")]
        block_tokens: usize = DEFAULT_BLOCK_TOKENS,
        /// Prefix-summary shards gossiped per node, a power of two.
        #[arg(long, env = "KVMESH_SUMMARY_SHARDS")]
        summary_shards: u16 = SummaryConfig::default().num_shards,
        /// Bytes of each summary shard's Bloom filter, a power of two; shards × bytes is the
        /// summary's byte budget.
        #[arg(long, env = "KVMESH_SUMMARY_SHARD_BYTES")]
        summary_shard_bytes: u32 = SummaryConfig::default().shard_bytes,
        /// Threads serving requests. One thread forwards a request with the fewest wake-ups and the
        /// least CPU (no hand-offs between threads); more raise the most one sidecar can serve
        /// when it has cores to itself (figures in BENCHMARKS.md#overhead).
        #[arg(long, env = "KVMESH_WORKER_THREADS")]
        worker_threads: usize = 1,
        /// What this node's engine is for: `mixed` (whole requests), `prefill` (prefill legs of
        /// disaggregated requests) or `decode` (decode legs, and whole requests not worth
        /// disaggregating). Prefill and decode engines must run vLLM with the NixlConnector
        /// (`--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'`).
        #[arg(long, env = "KVMESH_ROLE", value_parser = roles())]
        role: Role = Role::Mixed,
        /// Intent routing: a TOML file of intents (see docs/intents.md); a request whose `model` is
        /// its auto name (default `auto`) is given the model of the intent its prompt shows.
        #[arg(long, env = "KVMESH_INTENTS")]
        intents: PathBuf,
        /// Intent routing's embedding: a static embedding model's directory (`tokenizer.json` and
        /// `model.safetensors`, the model2vec layout) instead of hashed character n-grams. Needs a
        /// build with the `tokenizer` feature.
        #[arg(long, env = "KVMESH_EMBEDDING_MODEL")]
        embedding_model: PathBuf,
        /// LoRA adapters this node's engine may load at run time, PATTERN=BASE_MODEL (repeatable
        /// or comma-separated; `*` in PATTERN matches any run of characters): a request for a
        /// matching name that no engine serves is placed on one engine of BASE_MODEL, the same
        /// from every entry node, whose sidecar loads it through vLLM's `/v1/load_lora_adapter`
        /// first. The engine must allow it (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`). Also
        /// `adapters = [{ pattern, base }]` under `[lora]` in the file.
        #[arg(long = "lora-adapter", env = "KVMESH_LORA_ADAPTERS", value_delimiter = ',')]
        #[serde(skip)]
        lora_adapters: Vec<String>; flag only,
        /// The `lora_path` given to the engine for an adapter: `{name}` is replaced by the
        /// adapter's name, `{base}` by its base model's. Also `path_template` under `[lora]`.
        #[arg(long, env = "KVMESH_LORA_PATH_TEMPLATE")]
        #[serde(skip)]
        lora_path_template: String = "{name}".into(); in lora.path_template,
        /// How long loading one adapter may take before the requests waiting on it fail. Also
        /// `load_timeout_secs` under `[lora]`.
        #[arg(long, env = "KVMESH_LORA_LOAD_TIMEOUT_SECS")]
        #[serde(skip)]
        lora_load_timeout_secs: Secs = Secs(60); in lora.load_timeout_secs,
        /// Exact mode with media: the token ids the model's `/tokenize` puts in place of an image,
        /// audio or video item (one run per item), e.g. 151655,151656 for Qwen2.5-VL, or
        /// 128000,128001,128002 for `kvmesh-sim engine`. Without them a request's chain stops
        /// before its first media item. Also `placeholder_tokens` under `[media]`.
        #[arg(long = "media-placeholder-tokens", env = "KVMESH_MEDIA_PLACEHOLDER_TOKENS",
              value_delimiter = ',')]
        #[serde(skip)]
        media_placeholder_tokens: Vec<u32>; in media.placeholder_tokens,
        /// Fetch media given by plain URL from the hosts of `--fetch-media-hosts`, hash its bytes
        /// and send them to the engine inline, so that such an item routes and caches by its
        /// content rather than by its URL. Off by default. Also `fetch = true` under `[media]`.
        #[arg(long, env = "KVMESH_FETCH_MEDIA", value_name = "BOOL", num_args = 0..=1,
              require_equals = true, default_missing_value = "true")]
        #[serde(skip)]
        fetch_media: bool; in media.fetch,
        /// Hosts `--fetch-media` may fetch from (comma-separated, exact names or `*.suffix`):
        /// required with it, so that a client cannot make the sidecar reach internal addresses.
        /// Also `fetch_hosts` under `[media]`.
        #[arg(long = "fetch-media-hosts", env = "KVMESH_FETCH_MEDIA_HOSTS", value_delimiter = ',')]
        #[serde(skip)]
        fetch_media_hosts: Vec<String>; in media.fetch_hosts,
        /// Largest media item `--fetch-media` fetches; a larger one is left as a URL. Also
        /// `fetch_max_bytes` under `[media]`.
        #[arg(long, env = "KVMESH_FETCH_MEDIA_MAX_BYTES")]
        #[serde(skip)]
        // 20 MiB: a large photo, well under the body limit it is inlined into.
        fetch_media_max_bytes: usize = 20 * 1024 * 1024; in media.fetch_max_bytes,
        /// Longest a `--fetch-media` fetch may take; a slower one is left as a URL. Also
        /// `fetch_timeout_ms` under `[media]`.
        #[arg(long, env = "KVMESH_FETCH_MEDIA_TIMEOUT_MS")]
        #[serde(skip)]
        // A fetch on the request path: long enough for an object store, short next to a prefill.
        fetch_media_timeout_ms: Millis = Millis(2_000); in media.fetch_timeout_ms,
    }
    tables {
        /// Adapters loaded at run time, under a `[lora]` table (TOML file only).
        lora: LoraFile,
        /// Media handling, under a `[media]` table (TOML file only).
        media: MediaFile,
        /// Routing weights (TOML file only).
        route: RouteConfig,
        /// When requests are disaggregated, under a `[pd]` table (TOML file only).
        pd: PdConfig,
    }
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

/// The defaults alone (for the structs whose `Default` is the options').
pub(crate) fn defaults() -> Settled {
    Settled::of(ServeArgs::default(), ServeArgs::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, Command, FromArgMatches};

    fn command() -> Command {
        ServeArgs::augment_args(Command::new("serve"))
    }

    #[test]
    fn every_option_settles_flag_over_file_over_default() {
        let (argv, file, expected) = precedence::samples();
        let cli =
            ServeArgs::from_arg_matches(&command().try_get_matches_from(&argv).unwrap()).unwrap();
        // Through the file's text, so that each option's key is read as a user writes it.
        let text = toml::to_string(&file).unwrap();
        let file = || toml::from_str::<ServeArgs>(&text).unwrap();
        let both = precedence::shown(&Settled::of(cli, file()));
        let file_only = precedence::shown(&Settled::of(ServeArgs::default(), file()));
        let neither = precedence::shown(&defaults());
        assert_eq!(expected.len(), both.len());
        for (i, (name, flag, in_file, default)) in expected.into_iter().enumerate() {
            assert_eq!((name, &flag), (both[i].0, &both[i].1), "{argv:?}\n{text}");
            assert_eq!(
                (name, &in_file),
                (file_only[i].0, &file_only[i].1),
                "{text}"
            );
            assert_eq!((name, &default), (neither[i].0, &neither[i].1));
            assert_ne!(flag, in_file, "{name}: the samples must differ");
        }
    }

    /// The flags and variables before the options were declared in one table (users'
    /// manifests and scripts name them), plus the route form's new name.
    const NAMES: [(&str, &str); 43] = [
        ("config", "KVMESH_CONFIG"),
        ("backend", "KVMESH_BACKEND"),
        ("listen", "KVMESH_LISTEN"),
        ("mesh", "KVMESH_MESH"),
        ("advertise", "KVMESH_ADVERTISE"),
        ("seeds", "KVMESH_SEEDS"),
        ("node-id", "KVMESH_NODE_ID"),
        ("cluster-id", "KVMESH_CLUSTER_ID"),
        ("tls-dir", "KVMESH_TLS_DIR"),
        ("crl", "KVMESH_CRL"),
        ("tls-reload-interval-ms", "KVMESH_TLS_RELOAD_INTERVAL_MS"),
        ("api-key", "KVMESH_API_KEY"),
        ("backend-api-key", "KVMESH_BACKEND_API_KEY"),
        ("max-body-bytes", "KVMESH_MAX_BODY_BYTES"),
        ("retries", "KVMESH_RETRIES"),
        ("request-timeout-secs", "KVMESH_REQUEST_TIMEOUT_SECS"),
        ("client-timeout-secs", "KVMESH_CLIENT_TIMEOUT_SECS"),
        ("drain-timeout-secs", "KVMESH_DRAIN_TIMEOUT_SECS"),
        ("join-wait-secs", "KVMESH_JOIN_WAIT_SECS"),
        ("route-form", "KVMESH_ROUTE_FORM"),
        ("policy", "KVMESH_POLICY"),
        ("digest-interval-ms", "KVMESH_DIGEST_INTERVAL_MS"),
        ("gossip-interval-ms", "KVMESH_GOSSIP_INTERVAL_MS"),
        ("kv-events", "KVMESH_KV_EVENTS"),
        ("kv-events-bind", "KVMESH_KV_EVENTS_BIND"),
        ("kv-events-replay", "KVMESH_KV_EVENTS_REPLAY"),
        ("kv-events-topic", "KVMESH_KV_EVENTS_TOPIC"),
        ("tokenizer", "KVMESH_TOKENIZER"),
        ("block-tokens", "KVMESH_BLOCK_TOKENS"),
        ("summary-shards", "KVMESH_SUMMARY_SHARDS"),
        ("summary-shard-bytes", "KVMESH_SUMMARY_SHARD_BYTES"),
        ("worker-threads", "KVMESH_WORKER_THREADS"),
        ("role", "KVMESH_ROLE"),
        ("intents", "KVMESH_INTENTS"),
        ("embedding-model", "KVMESH_EMBEDDING_MODEL"),
        ("lora-adapter", "KVMESH_LORA_ADAPTERS"),
        ("lora-path-template", "KVMESH_LORA_PATH_TEMPLATE"),
        ("lora-load-timeout-secs", "KVMESH_LORA_LOAD_TIMEOUT_SECS"),
        (
            "media-placeholder-tokens",
            "KVMESH_MEDIA_PLACEHOLDER_TOKENS",
        ),
        ("fetch-media", "KVMESH_FETCH_MEDIA"),
        ("fetch-media-hosts", "KVMESH_FETCH_MEDIA_HOSTS"),
        ("fetch-media-max-bytes", "KVMESH_FETCH_MEDIA_MAX_BYTES"),
        ("fetch-media-timeout-ms", "KVMESH_FETCH_MEDIA_TIMEOUT_MS"),
    ];

    #[test]
    fn every_flag_and_variable_keeps_its_name() {
        let command = command();
        let names: Vec<(&str, &str)> = command
            .get_arguments()
            .map(|arg| {
                let env = arg.get_env().and_then(|env| env.to_str()).unwrap_or("");
                (arg.get_long().unwrap_or(""), env)
            })
            .collect();
        assert_eq!(names, NAMES);
    }

    #[test]
    fn switches_are_flags_and_read_true_or_false_from_the_environment_or_file() {
        let parsed = |argv: &[&str]| {
            let matches = command().try_get_matches_from(argv)?;
            Ok::<_, clap::Error>(ServeArgs::from_arg_matches(&matches)?.kv_events_bind)
        };
        assert_eq!(parsed(&["serve"]).unwrap(), None);
        assert_eq!(parsed(&["serve", "--kv-events-bind"]).unwrap(), Some(true));
        assert_eq!(
            parsed(&["serve", "--kv-events-bind=false"]).unwrap(),
            Some(false)
        );
        // A word after the switch is no value of it, as before.
        assert!(parsed(&["serve", "--kv-events-bind", "true"]).is_err());
        let file: ServeArgs = toml::from_str("kv-events-bind = true\n").unwrap();
        assert_eq!(file.kv_events_bind, Some(true));
    }

    #[test]
    fn the_help_shows_each_default_once() {
        let mut command = command();
        let mut shown = 0;
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            match shown_default(id) {
                Some(default) => {
                    shown += 1;
                    let tag = format!("[default: {default}]");
                    assert!(help.ends_with(&tag), "{id}: {help}");
                    assert_eq!(help.matches("[default:").count(), 1, "{help}");
                    if let Some(long_help) = arg.get_long_help() {
                        assert!(long_help.to_string().ends_with(&tag), "{long_help}");
                    }
                }
                // Defaults that are no constant (the --mesh address, $HOSTNAME, the `[route]`
                // table's form) stay prose.
                None if ["advertise", "node_id", "kv_events_topic", "route_form"].contains(&id) => {
                    assert_eq!(help.matches("[default:").count(), 1, "{help}")
                }
                None => assert!(
                    !help.contains("[default:"),
                    "{id}: a literal default: {help}"
                ),
            }
        }
        let rendered = command.render_long_help().to_string();
        assert_eq!(
            rendered.matches("[default:").count(),
            shown + 4,
            "{rendered}"
        );
        assert_eq!(shown_default("route_form"), None);
        assert_eq!(
            shown_default("gossip_interval_ms").as_deref(),
            Some("200 ms")
        );
        assert_eq!(
            shown_default("request_timeout_secs").as_deref(),
            Some("600 s")
        );
        assert_eq!(shown_default("listen").as_deref(), Some("0.0.0.0:8000"));
        assert_eq!(shown_default("role").as_deref(), Some("mixed"));
    }
}
