//! `kvmesh serve`'s defaults, each defined once: [`super::config::ServeConfig::resolve`]
//! applies them, and [`in_help`] shows them in the flags' help.
//!
//! Not clap's `default_value`: a flag that always has a value would shadow the `--config`
//! file, which sits between the flags (and environment) and these defaults.

use kvmesh_protocol::hashing::DEFAULT_BLOCK_TOKENS;
use kvmesh_protocol::{Role, RouteConfig, SummaryConfig, cadence};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

/// Client-facing HTTP address.
pub const LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8000));
/// UDP address of the QUIC mesh endpoint.
pub const MESH: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 7946));
pub const CLUSTER_ID: &str = "kvmesh";
/// 32 MiB.
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
pub const RETRIES: usize = 2;
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
pub const JOIN_WAIT: Duration = Duration::from_secs(15);
pub const DIGEST_INTERVAL: Duration = cadence::DIGEST_INTERVAL;
pub const GOSSIP_INTERVAL: Duration = cadence::GOSSIP_INTERVAL;
pub const WORKER_THREADS: usize = 1;
pub const BLOCK_TOKENS: usize = DEFAULT_BLOCK_TOKENS;
pub const ROLE: Role = Role::Mixed;
/// An adapter's `lora_path` is its name.
pub const LORA_PATH_TEMPLATE: &str = "{name}";
pub const LORA_LOAD_TIMEOUT: Duration = Duration::from_secs(60);
/// 20 MiB: a large photo, well under the body limit it is inlined into.
pub const FETCH_MEDIA_MAX_BYTES: usize = 20 * 1024 * 1024;
/// How often the TLS files are polled for changes (why polling: `tls::reload`).
pub const TLS_RELOAD_INTERVAL: Duration = crate::tls::reload::DEFAULT_INTERVAL;
/// A fetch on the request path: long enough for an object store, short next to a prefill.
pub const FETCH_MEDIA_TIMEOUT: Duration = Duration::from_secs(2);

/// The default a flag's help shows, by argument id; `None` for a flag without one here.
fn shown(id: &str) -> Option<String> {
    let secs = |d: Duration| format!("{} s", d.as_secs());
    let millis = |d: Duration| format!("{} ms", d.as_millis());
    let summary = SummaryConfig::default();
    Some(match id {
        "listen" => LISTEN.to_string(),
        "mesh" => MESH.to_string(),
        "cluster_id" => CLUSTER_ID.to_owned(),
        "max_body_bytes" => format!("{MAX_BODY_BYTES}, {} MiB", MAX_BODY_BYTES >> 20),
        "retries" => RETRIES.to_string(),
        "request_timeout_secs" => secs(REQUEST_TIMEOUT),
        "client_timeout_secs" => secs(CLIENT_TIMEOUT),
        "drain_timeout_secs" => secs(DRAIN_TIMEOUT),
        "join_wait_secs" => secs(JOIN_WAIT),
        "route_form" => RouteConfig::default().form.to_string(),
        "digest_interval_ms" => millis(DIGEST_INTERVAL),
        "gossip_interval_ms" => millis(GOSSIP_INTERVAL),
        "block_tokens" => BLOCK_TOKENS.to_string(),
        "summary_shards" => summary.num_shards.to_string(),
        "summary_shard_bytes" => summary.shard_bytes.to_string(),
        "worker_threads" => WORKER_THREADS.to_string(),
        "role" => ROLE.as_str().to_owned(),
        "lora_path_template" => format!("`{LORA_PATH_TEMPLATE}`"),
        "lora_load_timeout_secs" => secs(LORA_LOAD_TIMEOUT),
        "fetch_media_max_bytes" => format!(
            "{FETCH_MEDIA_MAX_BYTES}, {} MiB",
            FETCH_MEDIA_MAX_BYTES >> 20
        ),
        "fetch_media_timeout_ms" => millis(FETCH_MEDIA_TIMEOUT),
        "tls_reload_interval_ms" => millis(TLS_RELOAD_INTERVAL),
        _ => return None,
    })
}

/// Ends the help of each flag that has a default here with `[default: …]`, as clap would for
/// its own defaults.
pub fn in_help(arg: clap::Arg) -> clap::Arg {
    let Some(default) = shown(arg.get_id().as_str()) else {
        return arg;
    };
    let with_default = |help: &clap::builder::StyledStr| format!("{help} [default: {default}]");
    let help = arg.get_help().map(with_default);
    let long_help = arg.get_long_help().map(with_default);
    let arg = match help {
        Some(help) => arg.help(help),
        None => arg,
    };
    match long_help {
        Some(long_help) => arg.long_help(long_help),
        None => arg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::config::ServeArgs;
    use clap::{Args, Command};

    #[test]
    fn every_default_shows_in_a_flags_help_once() {
        let command = ServeArgs::augment_args(Command::new("serve"));
        let mut shown_count = 0;
        for arg in command.get_arguments() {
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            let long_help = arg.get_long_help().map(ToString::to_string);
            match shown(arg.get_id().as_str()) {
                Some(default) => {
                    shown_count += 1;
                    let tag = format!("[default: {default}]");
                    assert!(help.ends_with(&tag), "{}: {help}", arg.get_id());
                    assert_eq!(help.matches("[default:").count(), 1, "{help}");
                    if let Some(long_help) = long_help {
                        assert!(long_help.ends_with(&tag), "{long_help}");
                    }
                }
                // Defaults that are no constant (the --mesh address, $HOSTNAME) stay prose.
                None if ["advertise", "node_id", "kv_events_topic"]
                    .contains(&arg.get_id().as_str()) => {}
                None => assert!(
                    !help.contains("[default: "),
                    "{}: a literal default in the help: {help}",
                    arg.get_id()
                ),
            }
        }
        assert_eq!(shown_count, 22, "a default of `shown` names no flag");
        assert_eq!(shown("route_form").as_deref(), Some("score"));
        assert_eq!(shown("gossip_interval_ms").as_deref(), Some("200 ms"));
        assert_eq!(shown("listen").as_deref(), Some("0.0.0.0:8000"));
    }
}
