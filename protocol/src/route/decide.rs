//! [`decide`]: filter, score, bound, rank.

use super::config::{Policy, RouteConfig};
use super::reason::RouteReason;
use super::rendezvous::rendezvous_weight;
use crate::digest::{LoadDigest, Role};
use crate::hashing::{BlockHash, HASH_VERSION};
use crate::summary::PeerSummary;
use std::cmp::Ordering;

/// One engine the request could go to, as this node sees it.
#[derive(Copy, Clone, Debug)]
pub struct Candidate<'a> {
    /// [`super::node_key`] of the node's id: the tie-breaker and the rendezvous identity.
    pub node_key: u64,
    pub digest: &'a LoadDigest,
    /// The node's gossiped prefix summary, if any has arrived.
    pub summary: Option<&'a PeerSummary>,
    /// What the node's engine holds in offload tiers (CPU, storage), from exact mode.
    pub offload: Option<&'a PeerSummary>,
    /// When this node received `digest` (its own clock), for staleness.
    pub digest_received_ms: u64,
    /// Requests this node sent there that the digest does not reflect yet.
    pub pending: u32,
    /// Leading blocks of this request this node itself recently sent there (optimistic: the
    /// peer's summary may not show them yet).
    pub recent_match: u32,
}

/// What the decision needs to know about the request.
#[derive(Copy, Clone, Debug)]
pub struct RouteRequest<'a> {
    pub model: &'a str,
    pub chain: &'a [BlockHash],
    pub prompt_tokens: u32,
    pub tokens_per_block: f32,
    /// A session key (from a session header or the `user` field), for soft affinity.
    pub session: Option<u64>,
    /// The role the request needs: [`Role::Mixed`] for whole requests.
    pub role: Role,
}

/// The ranked outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// Indexes into the candidate slice, best first: the first is the target, the rest are
    /// retries in order.
    pub ranked: Vec<usize>,
    pub reason: RouteReason,
    /// Blocks of the prompt the chosen engine is believed to hold.
    pub matched_blocks: u32,
    /// The most blocks any candidate is believed to hold.
    pub best_matched_blocks: u32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RouteError {
    #[error("no healthy engine serves model `{0}`")]
    NoCandidate(String),
}

/// Reusable buffers, so a busy node allocates nothing per decision beyond the result.
#[derive(Debug, Default)]
pub struct DecideScratch {
    entries: Vec<Entry>,
}

#[derive(Copy, Clone, Debug)]
struct Entry {
    index: usize,
    node_key: u64,
    matched: u32,
    load: u32,
    fresh: bool,
}

/// A ranking key: under the load bound first, then the score, then the node key, so that the
/// order is total and identical on every node.
#[derive(Copy, Clone, Debug)]
struct Ranked {
    under_bound: bool,
    score: f64,
    node_key: u64,
    entry: usize,
}

impl Ranked {
    fn cmp_rank(&self, other: &Self) -> Ordering {
        (self.under_bound.cmp(&other.under_bound))
            .then(self.score.total_cmp(&other.score))
            .then(self.node_key.cmp(&other.node_key))
    }
}

/// Decides where a request goes. See the module docs of [`crate::route`].
pub fn decide(
    candidates: &[Candidate<'_>],
    request: &RouteRequest<'_>,
    config: &RouteConfig,
    now_ms: u64,
) -> Result<Decision, RouteError> {
    decide_with(
        &mut DecideScratch::default(),
        candidates,
        request,
        config,
        now_ms,
    )
}

/// [`decide`] with caller-owned scratch buffers.
pub fn decide_with(
    scratch: &mut DecideScratch,
    candidates: &[Candidate<'_>],
    request: &RouteRequest<'_>,
    config: &RouteConfig,
    now_ms: u64,
) -> Result<Decision, RouteError> {
    let entries = &mut scratch.entries;
    entries.clear();
    entries.reserve(candidates.len());
    let chain_len = request.chain.len() as u32;
    let mut any_fresh = false;
    for (index, candidate) in candidates.iter().enumerate() {
        let digest = candidate.digest;
        if !digest.healthy || digest.role != request.role || !digest.serves(request.model) {
            continue;
        }
        let fresh = now_ms.saturating_sub(candidate.digest_received_ms) <= config.max_digest_age_ms;
        any_fresh |= fresh;
        let matched_in = |summary: Option<&PeerSummary>| match summary {
            Some(summary) if digest.hash_version == HASH_VERSION => {
                (summary.longest_match(request.chain) as u32).min(chain_len)
            }
            _ => 0,
        };
        let on_gpu = matched_in(candidate.summary)
            .max(candidate.recent_match)
            .min(chain_len);
        // Blocks past the GPU match that an offload tier holds count at a discount.
        let offloaded = matched_in(candidate.offload).saturating_sub(on_gpu);
        let offload_worth =
            (f64::from(offloaded) * config.offload_weight.clamp(0.0, 1.0)).round() as u32;
        entries.push(Entry {
            index,
            node_key: candidate.node_key,
            matched: on_gpu + offload_worth,
            load: digest.load().saturating_add(candidate.pending),
            fresh,
        });
    }
    if any_fresh {
        entries.retain(|e| e.fresh);
    }
    if entries.is_empty() {
        return Err(RouteError::NoCandidate(request.model.to_owned()));
    }

    // Bounded load: the cap a candidate may reach by taking this request.
    let total_load: u64 = entries.iter().map(|e| u64::from(e.load)).sum();
    let mean = (total_load + 1) as f64 / entries.len() as f64;
    let cap = ((1.0 + config.load_epsilon) * mean + config.load_slack.max(0.0)).ceil();

    let best_matched = entries.iter().map(|e| e.matched).max().unwrap_or(0);
    let short = request.chain.is_empty();
    let cold = !short && best_matched < config.min_hit_blocks;
    let session_node = request.session.map(|session| {
        entries
            .iter()
            .max_by_key(|e| (rendezvous_weight(session, e.node_key), e.node_key))
            .map_or(0, |e| e.node_key)
    });

    let keep = config.ranked_len.max(1);
    let mut top: Vec<Ranked> = Vec::with_capacity(keep + 1);
    // The winner ignoring the load bound, and ignoring the session bonus, to name the reason.
    let mut best_unbounded: Option<Ranked> = None;
    let mut best_without_session: Option<Ranked> = None;
    for (position, entry) in entries.iter().enumerate() {
        let candidate = &candidates[entry.index];
        let base = if cold {
            // Rendezvous on the first block: every entry node agrees on a new prefix's home.
            rendezvous_weight(request.chain[0], entry.node_key) as f64 / u64::MAX as f64
        } else {
            base_score(candidate, entry, request, config)
        };
        let bonus = match session_node {
            Some(node) if !cold && node == entry.node_key => session_bonus(request, config),
            _ => 0.0,
        };
        let under_bound = f64::from(entry.load) + 1.0 <= cap;
        let ranked = Ranked {
            under_bound,
            score: base + bonus,
            node_key: entry.node_key,
            entry: position,
        };
        let unbounded = Ranked {
            under_bound: true,
            ..ranked
        };
        if best_unbounded.is_none_or(|b| unbounded.cmp_rank(&b).is_gt()) {
            best_unbounded = Some(unbounded);
        }
        let plain = Ranked {
            score: base,
            ..ranked
        };
        if best_without_session.is_none_or(|b| plain.cmp_rank(&b).is_gt()) {
            best_without_session = Some(plain);
        }
        insert_top(&mut top, ranked, keep);
    }

    let chosen = top[0];
    let chosen_entry = entries[chosen.entry];
    let reason = if entries.len() == 1 {
        RouteReason::OnlyCandidate
    } else if best_unbounded.is_some_and(|b| b.node_key != chosen.node_key) {
        RouteReason::LoadSpill
    } else if cold {
        RouteReason::ColdHash
    } else if session_node == Some(chosen.node_key)
        && best_without_session.is_some_and(|b| b.node_key != chosen.node_key)
    {
        RouteReason::Session
    } else if !short && chosen_entry.matched >= config.min_hit_blocks {
        RouteReason::PrefixHit
    } else {
        RouteReason::LeastLoaded
    };
    Ok(Decision {
        ranked: top.iter().map(|r| entries[r.entry].index).collect(),
        reason,
        matched_blocks: chosen_entry.matched,
        best_matched_blocks: best_matched,
    })
}

/// Keeps `top` sorted best first and at most `keep` long.
fn insert_top(top: &mut Vec<Ranked>, item: Ranked, keep: usize) {
    let position = top
        .iter()
        .position(|t| item.cmp_rank(t).is_gt())
        .unwrap_or(top.len());
    if position < keep {
        top.insert(position, item);
        top.truncate(keep);
    }
}

fn base_score(
    candidate: &Candidate<'_>,
    entry: &Entry,
    request: &RouteRequest<'_>,
    config: &RouteConfig,
) -> f64 {
    let digest = candidate.digest;
    let queued = f64::from(digest.waiting) + f64::from(candidate.pending);
    match config.policy {
        Policy::Score => {
            let matched = match request.chain.len() {
                0 => 0.0,
                len => f64::from(entry.matched) / len as f64,
            };
            config.alpha * matched + config.beta * (1.0 - f64::from(digest.kv_usage))
                - config.gamma * queued / config.waiting_threshold.max(1.0)
        }
        Policy::Cost => -estimated_ttft_ms(digest, entry.matched, queued, request, config),
    }
}

/// The cost form: time to drain the queue ahead plus time to prefill what is not cached.
/// The per-request service time comes from the observed TTFT (TTFT ≈ (waiting + 1) × service),
/// or from the prompt's own prefill time when nothing was observed yet.
fn estimated_ttft_ms(
    digest: &LoadDigest,
    matched: u32,
    queued: f64,
    request: &RouteRequest<'_>,
    config: &RouteConfig,
) -> f64 {
    let tokens_per_s = match f64::from(digest.prefill_tokens_per_s) {
        tps if tps > 0.0 => tps,
        _ => config.default_prefill_tokens_per_s.max(1.0),
    };
    let prompt = f64::from(request.prompt_tokens);
    let cached = f64::from(matched) * f64::from(request.tokens_per_block);
    let prefill_ms = (prompt - cached).max(0.0) / tokens_per_s * 1000.0;
    let service_ms = match f64::from(digest.ttft_ewma_ms) {
        ttft if ttft > 0.0 => ttft / (1.0 + f64::from(digest.waiting)),
        _ => prompt / tokens_per_s * 1000.0,
    };
    queued * service_ms + prefill_ms
}

/// The session bonus, in the policy's units: score units, or (cost form) that fraction of the
/// whole prompt's prefill time.
fn session_bonus(request: &RouteRequest<'_>, config: &RouteConfig) -> f64 {
    match config.policy {
        Policy::Score => config.session_weight,
        Policy::Cost => {
            config.session_weight * f64::from(request.prompt_tokens)
                / config.default_prefill_tokens_per_s.max(1.0)
                * 1000.0
        }
    }
}
