//! `kvmesh cert init|issue`: command-line front of [`kvmesh_node::cert`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use kvmesh_node::cert;

#[derive(Subcommand, Debug)]
pub enum CertCommand {
    /// Create a cluster CA: DIR/ca.pem and DIR/ca.key (mode 0600).
    Init {
        /// Directory to write the CA into (created if missing).
        #[arg(long)]
        dir: PathBuf,
        /// Cluster id, recorded in the CA's name.
        #[arg(long, default_value = "kvmesh")]
        cluster_id: String,
        /// Validity of the CA in days (1 to 36500).
        #[arg(long, default_value_t = 3650, value_parser = valid_days())]
        days: u64,
    },
    /// Issue a node certificate signed by the CA in DIR: NAME.pem and NAME.key (mode 0600),
    /// usable for both server and client authentication, with NAME as its first DNS SAN.
    Issue {
        /// Directory holding ca.pem and ca.key.
        #[arg(long)]
        dir: PathBuf,
        /// Node name (a DNS name); peers identify this node by it.
        #[arg(long)]
        node: String,
        /// Directory to write the node files into (default: DIR).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Extra subject alternative names: host names or IP addresses, comma-separated.
        #[arg(long, value_delimiter = ',')]
        san: Vec<String>,
        /// Validity of the certificate in days (1 to 36500).
        #[arg(long, default_value_t = 365, value_parser = valid_days())]
        days: u64,
    },
}

const DAY: u64 = 24 * 3600;

/// A validity a certificate can carry: at least a day, at most a century (longer would
/// overflow the date arithmetic, and no CA should outlive the cluster by that much).
fn valid_days() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..=36_500)
}

pub fn run(command: CertCommand) -> anyhow::Result<()> {
    match command {
        CertCommand::Init {
            dir,
            cluster_id,
            days,
        } => {
            let paths = cert::init_ca(&dir, &cluster_id, Duration::from_secs(days * DAY))
                .context("cannot create the cluster CA")?;
            println!("wrote {} and {}", paths.cert.display(), paths.key.display());
        }
        CertCommand::Issue {
            dir,
            node,
            out,
            san,
            days,
        } => {
            let out = out.unwrap_or_else(|| dir.clone());
            let paths =
                cert::issue_node_cert(&dir, &node, &out, &san, Duration::from_secs(days * DAY))
                    .with_context(|| format!("cannot issue a certificate for node {node:?}"))?;
            println!("wrote {} and {}", paths.cert.display(), paths.key.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: CertCommand,
    }

    #[test]
    fn validity_is_bounded_instead_of_overflowing() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["kvmesh"], args].concat());
        assert!(parse(&["init", "--dir", "d", "--days", "0"]).is_err());
        assert!(parse(&["init", "--dir", "d", "--days", "99999999999999"]).is_err());
        assert!(parse(&["issue", "--dir", "d", "--node", "n", "--days", "36501"]).is_err());
        assert!(parse(&["issue", "--dir", "d", "--node", "n", "--days", "36500"]).is_ok());
        assert!(parse(&["init", "--dir", "d"]).is_ok());
    }
}
