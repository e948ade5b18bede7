//! The media options (`--media-placeholder-tokens`, `--fetch-media*`, or the `[media]` table),
//! checked and resolved into [`MediaConfig`].

use crate::serve::declare::Millis;
use anyhow::bail;
use serde::Deserialize;
use std::time::Duration;

/// The `[media]` table of the configuration file: every key is an option's
/// (`super::options`, `in media.KEY`).
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(deny_unknown_fields)]
pub struct MediaFile {
    pub placeholder_tokens: Option<Vec<u32>>,
    pub fetch: Option<bool>,
    pub fetch_hosts: Option<Vec<String>>,
    pub fetch_max_bytes: Option<usize>,
    pub fetch_timeout_ms: Option<Millis>,
}

/// How this node treats media parts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MediaConfig {
    /// Token ids that stand for media in the model's tokenized prompts (exact mode).
    pub placeholder_tokens: Vec<u32>,
    /// Fetching plain URLs, when on.
    pub fetch: Option<FetchMedia>,
}

/// `--fetch-media`: which URLs may be fetched, how much and how long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchMedia {
    /// Exact host names, or `*.suffix` for any host under a domain.
    pub hosts: Vec<String>,
    pub max_bytes: usize,
    pub timeout: Duration,
}

impl FetchMedia {
    /// Whether `host` is on the allow-list.
    pub fn allows(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.hosts
            .iter()
            .any(|allowed| match allowed.strip_prefix("*.") {
                Some(domain) => host
                    .strip_suffix(domain)
                    .is_some_and(|sub| sub.ends_with('.') && sub.len() > 1),
                None => host == *allowed,
            })
    }
}

/// The media options, settled, checked: fetching needs an allow-list, a positive size cap and
/// timeout.
pub fn media_config(
    placeholder_tokens: Vec<u32>,
    fetch: bool,
    hosts: Vec<String>,
    max_bytes: usize,
    timeout: Millis,
) -> anyhow::Result<MediaConfig> {
    let fetch = match fetch {
        false => None,
        true => {
            let hosts: Vec<String> = hosts
                .into_iter()
                .map(|host| host.trim().trim_end_matches('.').to_ascii_lowercase())
                .filter(|host| !host.is_empty())
                .collect();
            if hosts.is_empty() {
                bail!(
                    "--fetch-media needs --fetch-media-hosts: fetching from any host would let a client make this node reach internal addresses"
                );
            }
            if max_bytes == 0 {
                bail!("--fetch-media-max-bytes must be positive");
            }
            let timeout = match Duration::from(timeout) {
                Duration::ZERO => bail!("--fetch-media-timeout-ms must be positive"),
                timeout => timeout,
            };
            Some(FetchMedia {
                hosts,
                max_bytes,
                timeout,
            })
        }
    };
    Ok(MediaConfig {
        placeholder_tokens,
        fetch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::options;

    /// Fetching from `hosts`, with the defaults of the other media options.
    fn fetch(hosts: &[&str]) -> anyhow::Result<MediaConfig> {
        let hosts = hosts.iter().map(|h| (*h).to_owned()).collect();
        let defaults = options::defaults();
        media_config(
            Vec::new(),
            true,
            hosts,
            defaults.fetch_media_max_bytes,
            defaults.fetch_media_timeout_ms,
        )
    }

    #[test]
    fn fetching_needs_an_allow_list_and_matches_hosts_exactly_or_by_domain() {
        let error = fetch(&[]).unwrap_err().to_string();
        assert!(error.contains("--fetch-media-hosts"), "{error}");
        let config = fetch(&["images.example.com", "*.cdn.example.org"]).unwrap();
        let rules = config.fetch.unwrap();
        assert_eq!(rules.max_bytes, 20 * 1024 * 1024);
        assert_eq!(rules.timeout, Duration::from_secs(2));
        assert!(rules.allows("images.example.com"));
        assert!(rules.allows("Images.Example.com."));
        assert!(!rules.allows("evil-images.example.com"));
        assert!(rules.allows("a.cdn.example.org"));
        assert!(!rules.allows("cdn.example.org"));
        assert!(!rules.allows("xcdn.example.org"));
        assert!(!rules.allows("169.254.169.254"));
    }

    #[test]
    fn off_by_default_and_a_fetch_needs_a_positive_cap_and_timeout() {
        // Which of the flags and the `[media]` table wins: `options`' precedence test.
        let defaults = options::defaults();
        let off = media_config(
            Vec::new(),
            false,
            Vec::new(),
            defaults.fetch_media_max_bytes,
            defaults.fetch_media_timeout_ms,
        )
        .unwrap();
        assert_eq!(off, MediaConfig::default());
        let hosts = || vec!["a".to_owned()];
        let error = media_config(vec![], true, hosts(), 0, Millis(5)).unwrap_err();
        assert!(
            error.to_string().contains("--fetch-media-max-bytes"),
            "{error}"
        );
        let error = media_config(vec![], true, hosts(), 9, Millis(0)).unwrap_err();
        assert!(
            error.to_string().contains("--fetch-media-timeout-ms"),
            "{error}"
        );
    }
}
