//! `kvmesh status`: a table of the cluster from any sidecar (see [`kvmesh_node::status`]).

use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kvmesh_node::status::{from_debug_cluster, render_table};

/// Bound on one look at the sidecar: it answers from memory, so this is only ever hit when it
/// is unreachable or stuck.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Base URL of any sidecar of the cluster.
    #[arg(
        long,
        env = "KVMESH_STATUS_NODE",
        default_value = "http://127.0.0.1:8000"
    )]
    node: String,
    /// The sidecars' --api-key, if they have one (sent as a bearer token).
    #[arg(long, env = "KVMESH_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Refresh every SECS seconds until interrupted [default when given alone: 2].
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "2",
          value_parser = clap::value_parser!(u64).range(1..))]
    watch: Option<u64>,
    /// Print the rows as JSON, for scripts.
    #[arg(long)]
    json: bool,
}

pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let url = format!("{}/debug/cluster", args.node.trim_end_matches('/'));
        let uri: http::Uri = url
            .parse()
            .with_context(|| format!("--node {}: not a URL", args.node))?;
        if uri.scheme_str() != Some("http") {
            bail!("--node {}: expected http://HOST:PORT", args.node);
        }
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        loop {
            let cluster = fetch(&client, &uri, args.api_key.as_deref())
                .await
                .with_context(|| format!("asking {url}"))?;
            let rows = from_debug_cluster(&cluster).map_err(anyhow::Error::msg)?;
            let text = if args.json {
                serde_json::to_string(&rows)? + "\n"
            } else {
                render_table(&rows)
            };
            match args.watch {
                None => {
                    print!("{text}");
                    return Ok(());
                }
                Some(secs) => {
                    // Clear the screen and home the cursor, then the fresh table.
                    print!("\x1b[2J\x1b[H{text}");
                    use std::io::Write as _;
                    std::io::stdout().flush()?;
                    tokio::time::sleep(Duration::from_secs(secs)).await;
                }
            }
        }
    })
}

async fn fetch(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
    uri: &http::Uri,
    api_key: Option<&str>,
) -> anyhow::Result<serde_json::Value> {
    let mut request = http::Request::get(uri.clone());
    if let Some(key) = api_key {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let request = request.body(Empty::new())?;
    let response = tokio::time::timeout(REQUEST_TIMEOUT, client.request(request))
        .await
        .with_context(|| format!("no answer within {REQUEST_TIMEOUT:?}"))??;
    let status = response.status();
    let body = tokio::time::timeout(REQUEST_TIMEOUT, response.into_body().collect())
        .await
        .with_context(|| format!("no whole answer within {REQUEST_TIMEOUT:?}"))??
        .to_bytes();
    if !status.is_success() {
        let hint = if status == http::StatusCode::UNAUTHORIZED {
            " (pass the sidecars' --api-key)"
        } else {
            ""
        };
        bail!(
            "the sidecar answered {status}{hint}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    serde_json::from_slice(&body).context("the answer is not JSON")
}
