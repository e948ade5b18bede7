//! The media flags (`--media-placeholder-tokens`, `--fetch-media*`) over the `[media]` table
//! over the defaults, resolved into [`MediaConfig`].

use crate::serve::defaults;
use anyhow::bail;
use serde::Deserialize;
use std::time::Duration;

/// The `[media]` table of the configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MediaFile {
    #[serde(default)]
    pub placeholder_tokens: Vec<u32>,
    #[serde(default)]
    pub fetch: bool,
    #[serde(default)]
    pub fetch_hosts: Vec<String>,
    pub fetch_max_bytes: Option<usize>,
    pub fetch_timeout_ms: Option<u64>,
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

pub fn media_config(
    placeholder_tokens: Option<Vec<u32>>,
    fetch: bool,
    hosts: Option<Vec<String>>,
    max_bytes: Option<usize>,
    timeout_ms: Option<u64>,
    file: MediaFile,
) -> anyhow::Result<MediaConfig> {
    let placeholder_tokens = placeholder_tokens.unwrap_or(file.placeholder_tokens);
    let fetch = match fetch || file.fetch {
        false => None,
        true => {
            let hosts: Vec<String> = hosts
                .unwrap_or(file.fetch_hosts)
                .into_iter()
                .map(|host| host.trim().trim_end_matches('.').to_ascii_lowercase())
                .filter(|host| !host.is_empty())
                .collect();
            if hosts.is_empty() {
                bail!(
                    "--fetch-media needs --fetch-media-hosts: fetching from any host would let a client make this node reach internal addresses"
                );
            }
            let max_bytes = match max_bytes.or(file.fetch_max_bytes) {
                Some(0) => bail!("--fetch-media-max-bytes must be positive"),
                Some(bytes) => bytes,
                None => defaults::FETCH_MEDIA_MAX_BYTES,
            };
            let timeout = match timeout_ms.or(file.fetch_timeout_ms) {
                Some(0) => bail!("--fetch-media-timeout-ms must be positive"),
                Some(ms) => Duration::from_millis(ms),
                None => defaults::FETCH_MEDIA_TIMEOUT,
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

    fn fetch(hosts: &[&str]) -> anyhow::Result<MediaConfig> {
        let hosts = hosts.iter().map(|h| (*h).to_owned()).collect();
        media_config(None, true, Some(hosts), None, None, MediaFile::default())
    }

    #[test]
    fn fetching_needs_an_allow_list_and_matches_hosts_exactly_or_by_domain() {
        let error = fetch(&[]).unwrap_err().to_string();
        assert!(error.contains("--fetch-media-hosts"), "{error}");
        let config = fetch(&["images.example.com", "*.cdn.example.org"]).unwrap();
        let rules = config.fetch.unwrap();
        assert_eq!(rules.max_bytes, defaults::FETCH_MEDIA_MAX_BYTES);
        assert!(rules.allows("images.example.com"));
        assert!(rules.allows("Images.Example.com."));
        assert!(!rules.allows("evil-images.example.com"));
        assert!(rules.allows("a.cdn.example.org"));
        assert!(!rules.allows("cdn.example.org"));
        assert!(!rules.allows("xcdn.example.org"));
        assert!(!rules.allows("169.254.169.254"));
    }

    #[test]
    fn off_by_default_and_flags_win_over_the_file() {
        let off = media_config(None, false, None, None, None, MediaFile::default()).unwrap();
        assert_eq!(off, MediaConfig::default());
        let file = MediaFile {
            placeholder_tokens: vec![1],
            fetch: true,
            fetch_hosts: vec!["a".into()],
            fetch_max_bytes: Some(10),
            fetch_timeout_ms: Some(5),
        };
        let config = media_config(Some(vec![7, 8]), false, None, Some(99), None, file).unwrap();
        assert_eq!(config.placeholder_tokens, vec![7, 8]);
        let fetch = config.fetch.unwrap();
        assert_eq!(
            (fetch.max_bytes, fetch.timeout),
            (99, Duration::from_millis(5))
        );
    }
}
