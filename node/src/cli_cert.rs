//! `kvmesh cert init|issue|trust|revoke|crl`: command-line front of [`kvmesh_node::cert`].

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
        /// Validity in hours instead of days (1 to 876000), for short-lived certificates.
        #[arg(long, conflicts_with = "days", value_parser = clap::value_parser!(u64).range(1..=876_000))]
        hours: Option<u64>,
        /// Validity in seconds instead (tests of expiry).
        #[arg(long, hide = true, conflicts_with_all = ["days", "hours"])]
        seconds: Option<u64>,
    },
    /// Append the CA certificate CA_PEM to the CA bundle BUNDLE (a node's ca.pem), so that
    /// nodes trust both CAs during a CA rotation. Nodes reload the bundle by themselves.
    Trust {
        /// The bundle to extend, e.g. a node's TLS_DIR/ca.pem.
        #[arg(long)]
        bundle: PathBuf,
        /// The other CA's certificate, e.g. NEW_CA_DIR/ca.pem.
        #[arg(long)]
        ca: PathBuf,
    },
    /// Revoke node NAME's certificate: add it to the CA's CRL (DIR/crl.pem by default),
    /// signed by the CA in DIR. Give the file to the nodes with `kvmesh serve --crl`.
    Revoke {
        /// Directory holding ca.pem and ca.key.
        #[arg(long)]
        dir: PathBuf,
        /// Node whose certificate is revoked.
        #[arg(long)]
        node: String,
        /// The certificate to revoke [default: DIR/NAME.pem].
        #[arg(long)]
        cert: Option<PathBuf>,
        /// The CRL to update [default: DIR/crl.pem].
        #[arg(long)]
        crl: Option<PathBuf>,
    },
    /// Write the CA's CRL again (an empty one the first time), keeping what it lists.
    Crl {
        /// Directory holding ca.pem and ca.key.
        #[arg(long)]
        dir: PathBuf,
        /// The CRL to write [default: DIR/crl.pem].
        #[arg(long)]
        crl: Option<PathBuf>,
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
            hours,
            seconds,
        } => {
            let out = out.unwrap_or_else(|| dir.clone());
            let validity = match (seconds, hours) {
                (Some(seconds), _) => Duration::from_secs(seconds),
                (None, Some(hours)) => Duration::from_secs(hours * 3600),
                (None, None) => Duration::from_secs(days * DAY),
            };
            let paths = cert::issue_node_cert(&dir, &node, &out, &san, validity)
                .with_context(|| format!("cannot issue a certificate for node {node:?}"))?;
            println!("wrote {} and {}", paths.cert.display(), paths.key.display());
        }
        CertCommand::Trust { bundle, ca } => {
            let count = cert::trust_ca(&bundle, &ca)
                .with_context(|| format!("cannot add {} to {}", ca.display(), bundle.display()))?;
            println!("{} now trusts {count} CA certificate(s)", bundle.display());
        }
        CertCommand::Revoke {
            dir,
            node,
            cert,
            crl,
        } => {
            let revoked = cert::crl::revoke(&dir, &node, cert.as_deref(), crl.as_deref())
                .with_context(|| format!("cannot revoke the certificate of node {node:?}"))?;
            let what = if revoked.newly {
                "revoked"
            } else {
                "was already revoked"
            };
            println!(
                "{node} (serial {}) {what}; wrote {} ({} revoked)",
                revoked.serial,
                revoked.crl.display(),
                revoked.listed
            );
        }
        CertCommand::Crl { dir, crl } => {
            let (path, listed) =
                cert::crl::refresh(&dir, crl.as_deref()).context("cannot write the CRL")?;
            println!("wrote {} ({listed} revoked)", path.display());
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
        assert!(parse(&["issue", "--dir", "d", "--node", "n", "--hours", "2"]).is_ok());
        assert!(parse(&["issue", "--dir", "d", "--node", "n", "--hours", "0"]).is_err());
        let both = [
            "issue", "--dir", "d", "--node", "n", "--hours", "2", "--days", "3",
        ];
        assert!(parse(&both).is_err());
    }
}
