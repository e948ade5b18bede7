//! `kvmesh serve` configuration: flags, `KVMESH_*` environment variables and an optional TOML
//! file, in that order of precedence, resolved into one typed [`ServeConfig`]. Each option is
//! declared once, with its default, in [`super::options`]; [`ServeConfig::resolve`] adds what
//! no declaration can say (required options, checks, values derived from several options).

use crate::engine::local_tokenizer::LocalTokenizer;
use crate::front::intent::IntentRouting;
use crate::serve::declare::{Millis, Secs};
use crate::serve::media_config::{MediaConfig, media_config};
use crate::serve::options::{self, Settled};
use anyhow::{Context, bail};
use kvmesh_protocol::Role;
use kvmesh_protocol::hashing::HashMode;
use kvmesh_protocol::route::{AdapterRule, LoadableAdapters, PdConfig, ScoreForm};
use kvmesh_protocol::{HashConfig, RouteConfig, SummaryBuilder, SummaryConfig};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use super::options::ServeArgs;

/// The `[lora]` table of the configuration file (its `path_template` and `load_timeout_secs`
/// are options' keys: `super::options`).
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(deny_unknown_fields)]
pub struct LoraFile {
    #[serde(default)]
    pub adapters: Vec<AdapterRule>,
    pub path_template: Option<String>,
    pub load_timeout_secs: Option<Secs>,
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
    /// No adapters, and the options' defaults.
    fn default() -> Self {
        let defaults = options::defaults();
        Self {
            loadable: LoadableAdapters::default(),
            path_template: defaults.lora_path_template,
            load_timeout: defaults.lora_load_timeout_secs.into(),
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
    /// Every option settled (flag or environment, then the file, then its declared default:
    /// [`options::Settled`]), then what no declaration says, each step with its reason.
    pub fn resolve(cli: ServeArgs) -> anyhow::Result<Self> {
        let file = read_file(cli.config.as_deref())?;
        let settled = Settled::of(cli, file);
        // The flag overrides the `[route]` table's `form`; its old name still counts
        // (first, so that its warning shows even if a later step fails).
        let mut route = settled.route.unwrap_or_default();
        if let Some(form) = route_form(settled.route_form, settled.policy) {
            route.form = form;
        }
        // Required: nothing to default to, and the error says where to get one.
        let Some(backend) = settled.backend else {
            bail!("--backend is required (the local vLLM server, e.g. http://127.0.0.1:8001)");
        };
        let Some(tls_dir) = settled.tls_dir else {
            bail!(
                "--tls-dir is required (create one with `kvmesh cert init` and `kvmesh cert issue`)"
            );
        };
        // The default id is the host's name, which is no constant.
        let node_id = settled
            .node_id
            .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()));
        let Some(node_id) = node_id else {
            bail!("--node-id is required (no $HOSTNAME to default to)");
        };
        // The KV-event options mean something only with an endpoint (exact mode).
        let kv_events = settled.kv_events.map(|endpoint| KvEventsConfig {
            endpoint,
            bind: settled.kv_events_bind.unwrap_or_default(),
            replay_endpoint: settled.kv_events_replay,
            topic: settled.kv_events_topic.unwrap_or_default(),
        });
        // Options that need another: refused alone rather than silently ignored.
        let tokenizer = match settled.tokenizer {
            None => None,
            Some(_) if kv_events.is_none() => bail!(
                "--tokenizer only applies to exact mode: set --kv-events too, or drop --tokenizer"
            ),
            Some(path) => Some(Arc::new(LocalTokenizer::load(&path)?)),
        };
        let intents = match settled.intents {
            None if settled.embedding_model.is_some() => bail!(
                "--embedding-model only applies to intent routing: set --intents too, or drop --embedding-model"
            ),
            None => None,
            Some(path) => Some(Arc::new(IntentRouting::load(
                &path,
                settled.embedding_model.as_deref(),
            )?)),
        };
        if settled.block_tokens == 0 {
            bail!("--block-tokens must be positive");
        }
        // Exact mode hashes the engine's token ids, so queries must be hashed in tokens too.
        let hashing = match kv_events {
            Some(_) => HashConfig {
                mode: HashMode::Token {
                    block_tokens: settled.block_tokens,
                },
                token_prompt_block_tokens: settled.block_tokens,
            },
            None => HashConfig::default(),
        };
        let summary = SummaryConfig {
            num_shards: settled.summary_shards,
            shard_bytes: settled.summary_shard_bytes,
        };
        if let Err(why) = SummaryBuilder::new(summary, 0) {
            bail!("--summary-shards / --summary-shard-bytes: {why}");
        }
        let request_timeout = deadline(settled.request_timeout_secs, "request-timeout-secs")?;
        let client_timeout = deadline(settled.client_timeout_secs, "client-timeout-secs")?;
        let lora = lora_config(
            settled.lora_adapters,
            settled.lora_path_template,
            settled.lora_load_timeout_secs,
            settled.lora.unwrap_or_default().adapters,
        )?;
        let media = media_config(
            settled.media_placeholder_tokens.unwrap_or_default(),
            settled.fetch_media.unwrap_or_default(),
            settled.fetch_media_hosts.unwrap_or_default(),
            settled.fetch_media_max_bytes,
            settled.fetch_media_timeout_ms,
        )?;
        if settled.max_body_bytes == 0 {
            bail!("--max-body-bytes must be positive");
        }
        if settled.worker_threads == 0 {
            bail!("--worker-threads must be at least 1");
        }
        // A period of 0 would spin: at least 1 ms.
        let period = |ms: Millis| Duration::from(ms).max(Duration::from_millis(1));
        Ok(Self {
            backend,
            backend_api_key: settled.backend_api_key,
            listen: settled.listen,
            mesh: settled.mesh,
            advertise: settled
                .advertise
                .map(|address| resolve_advertise(&address))
                .transpose()?,
            seeds: settled.seeds.unwrap_or_default(),
            node_id,
            cluster_id: settled.cluster_id,
            tls_dir,
            crl: settled.crl,
            tls_reload_interval: period(settled.tls_reload_interval_ms),
            // An empty key (an unset variable in a manifest) asks for no key.
            api_key: settled.api_key.filter(|k| !k.is_empty()),
            max_body_bytes: settled.max_body_bytes,
            retries: settled.retries,
            request_timeout,
            client_timeout,
            drain_timeout: settled.drain_timeout_secs.into(),
            join_wait: settled.join_wait_secs.into(),
            digest_interval: period(settled.digest_interval_ms),
            gossip_interval: period(settled.gossip_interval_ms),
            worker_threads: settled.worker_threads,
            role: settled.role,
            route,
            pd: settled.pd.unwrap_or_default(),
            hashing,
            summary,
            kv_events,
            tokenizer,
            intents,
            lora,
            media,
        })
    }
}

/// The `--config` file's options, or none without one.
fn read_file(path: Option<&Path>) -> anyhow::Result<ServeArgs> {
    let Some(path) = path else {
        return Ok(ServeArgs::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str::<ServeArgs>(&text)
        .with_context(|| format!("parsing config file {}", path.display()))
}

/// A deadline of `--FLAG`: a zero one would refuse every request.
fn deadline(secs: Secs, flag: &str) -> anyhow::Result<Duration> {
    match Duration::from(secs) {
        Duration::ZERO => {
            bail!("--{flag} must be positive (a zero deadline would refuse every request)")
        }
        deadline => Ok(deadline),
    }
}

/// `--route-form`, else its deprecated name `policy` (`--policy`, `KVMESH_POLICY`, `policy` in
/// the file), which logs a warning naming the new one: a manifest written before the rename
/// keeps working.
fn route_form(form: Option<ScoreForm>, old_name: Option<ScoreForm>) -> Option<ScoreForm> {
    if old_name.is_some() {
        tracing::warn!(
            "--policy (KVMESH_POLICY, `policy` in --config) is deprecated: use --route-form \
             (KVMESH_ROUTE_FORM, `route-form` in --config)"
        );
    }
    form.or(old_name)
}

/// Loading adapters: the rules of `--lora-adapter`, else the `[lora]` table's; the template
/// must name the adapter and the timeout be positive.
fn lora_config(
    adapters: Option<Vec<String>>,
    path_template: String,
    load_timeout: Secs,
    file_rules: Vec<AdapterRule>,
) -> anyhow::Result<LoraConfig> {
    let rules = match adapters {
        Some(texts) => texts
            .iter()
            .map(|text| AdapterRule::parse(text))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|why| anyhow::anyhow!("--lora-adapter {why}"))?,
        None => file_rules,
    };
    let loadable = LoadableAdapters { rules };
    if let Err(why) = loadable.check() {
        bail!("[lora] adapters: {why}");
    }
    if !path_template.contains("{name}") {
        bail!(
            "--lora-path-template `{path_template}` has no `{{name}}`: every adapter would load the same path"
        );
    }
    let load_timeout = match Duration::from(load_timeout) {
        Duration::ZERO => bail!("--lora-load-timeout-secs must be positive"),
        timeout => timeout,
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
            warnings.contains("--policy (KVMESH_POLICY, `policy` in --config) is deprecated")
                && warnings.contains("use --route-form (KVMESH_ROUTE_FORM"),
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
        assert!(warnings.contains("`route-form` in --config"), "{warnings}");
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
                "request" => cli.request_timeout_secs = Some(Secs(0)),
                _ => cli.client_timeout_secs = Some(Secs(0)),
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
