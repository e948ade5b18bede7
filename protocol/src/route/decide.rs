//! [`decide`]: what it reads and returns, and the pipeline of its stages, each in its own
//! file: [`eligible`](super::eligible) and [`considered`](super::considered) (who may take
//! the request, and what is read of each), [`load_cap`](super::load_cap) (the load bound),
//! [`cold`](super::cold) (a new prefix's choices), [`owed`](super::owed) (popular prefixes
//! owed holders), [`score`](super::score), [`session`](super::session) (the affinity bonus),
//! [`spread`](super::spread) (near-equal engines share requests), [`rank`](super::rank) (the
//! order and its reason).

use super::cold::{self, ColdChoices};
use super::config::RouteConfig;
#[cfg(doc)]
use super::config::{ColdPrefixes, SoftPreferences};
use super::considered::Considered;
use super::popularity::PrefixShare;
use super::rank::{Ranked, Ranking};
use super::reason::RouteReason;
use super::score::{self, Scored};
use super::session::Session;
use super::{eligible, load_cap, owed, spread};
use crate::digest::{LoadDigest, LoraReadiness, Role};
use crate::hashing::BlockHash;
use crate::summary::PeerSummary;

/// One engine the request could go to, as this node sees it.
#[derive(Copy, Clone, Debug)]
pub struct Candidate<'a> {
    /// [`super::node_key`] of the node's id: the tie-breaker and the rendezvous identity.
    pub node_key: u64,
    pub digest: &'a LoadDigest,
    /// The node's gossiped prefix summary, if any has arrived.
    pub summary: Option<&'a PeerSummary>,
    /// Blocks the engine's cache holds, when the caller knows them exactly (the simulator's
    /// oracle reads its index); `None`: the summary's estimate, if any.
    pub held_blocks: Option<u64>,
    /// What the node's engine holds in offload tiers (CPU, storage), from exact mode.
    pub offload: Option<&'a PeerSummary>,
    /// When this node received the gauges it judges the engine by (`digest`'s, or `fresh`'s
    /// when those are newer), its own clock: for staleness.
    pub digest_received_ms: u64,
    /// Requests this node sent there that its gauges (`fresh`, else the digest's) do not
    /// reflect yet, plus its attempts in flight elsewhere that a decline would send there.
    pub pending: u32,
    /// Requests this node sent there that the digest does not reflect yet (`pending`'s sends
    /// when `fresh` is `None`; never the attempts that may come back, which no other entry
    /// knows of).
    pub digest_pending: u32,
    /// Leading blocks of this request this node itself recently sent there (optimistic: the
    /// peer's summary may not show them yet).
    pub recent_match: u32,
    /// The engine's gauges as its sidecar reported them on the return path, when that report
    /// is newer than `digest` (see [`crate::lifecycle`]); `None`: the digest's.
    pub fresh: Option<Gauges>,
}

impl Candidate<'_> {
    /// The gauges the decision judges this engine's load by: the freshest it has.
    pub fn gauges(&self) -> Gauges {
        self.fresh.unwrap_or_else(|| Gauges::of(self.digest))
    }
}

/// An engine's load gauges: what a digest carries and a return-path report refreshes.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Gauges {
    /// Requests in the engine's running batch.
    pub running: u32,
    /// Requests queued ahead of a new one (see `lifecycle::ServingState::queued`).
    pub waiting: u32,
    /// KV cache usage, 0..=1.
    pub kv_usage: f32,
    /// Prompt tokens queued ahead of a new request, as its serving node counts them (see
    /// `lifecycle::ServingState::queued_tokens`); `None` where nothing says: an engine's own
    /// gauges, or a queue of requests none of whose sizes its sidecar knows.
    pub queued_tokens: Option<u32>,
}

impl Gauges {
    pub fn of(digest: &LoadDigest) -> Self {
        Self {
            running: digest.running,
            waiting: digest.waiting,
            kv_usage: digest.kv_usage,
            queued_tokens: digest.queued_tokens,
        }
    }

    /// Everything admitted and not finished.
    pub fn load(&self) -> u32 {
        self.running.saturating_add(self.waiting)
    }
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
    /// The work asked of the engine: [`Role::Mixed`] for a whole request, else one leg of a
    /// disaggregated one; engines whose role does not take it ([`Role::takes`]) are skipped.
    pub role: Role,
    /// A key of this request alone (e.g. a hash of its id). Candidates whose score is within
    /// [`SoftPreferences::spread_margin`] of the best share such requests by rendezvous on
    /// this key, so that entry nodes with the same view do not all pick the same one of
    /// several near-equal engines (the holders of a hot prefix, say). `None`: near-equal
    /// candidates are ranked by score and node key alone.
    pub spread: Option<u64>,
    /// Prefixes of the chain with their share of the recent traffic (see
    /// [`super::PrefixTraffic`]): one held by fewer engines than its share fills counts as
    /// held by every engine. Empty: every prefix is judged by who holds it.
    pub popular: &'a [PrefixShare],
    /// Whether prompts in the recent traffic share prefixes (see
    /// [`super::PrefixTraffic::prefixes_recur`]). Where they do, a new prefix goes where every
    /// entry node sends it, so that its copies and next requests meet there
    /// ([`ColdPrefixes::choices`]); where they do not, to the least loaded of its first
    /// [`ColdPrefixes::unshared_choices`] (by default one: there too) or to an engine that
    /// looks idle ([`ColdPrefixes::unshared_to_idle`]), as a load balancer would: nothing is
    /// likely to come back for it. `true` unless the traffic says otherwise.
    pub prefixes_recur: bool,
}

impl RouteRequest<'_> {
    /// The prompt tokens an engine holding `matched` of the chain's blocks has to compute.
    pub fn uncached_tokens(&self, matched: u32) -> f64 {
        let cached = f64::from(matched) * f64::from(self.tokens_per_block);
        (f64::from(self.prompt_tokens) - cached).max(0.0)
    }
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
    /// No candidate holds the prompt's first blocks (fewer than `min_hit_blocks`): a new
    /// prefix, placed by rendezvous on its first block.
    pub new_prefix: bool,
    /// The counted depth of a popular prefix held by fewer engines than its share of the
    /// traffic owes, which the decision counted as held by every engine (see
    /// [`super::PrefixTraffic`]); 0 when there was none. The chosen engine holding fewer
    /// (`matched_blocks`) is a new holder.
    pub popular_blocks: u32,
    /// Per entry of `ranked`, what the decision believed of that engine.
    pub estimates: Vec<Estimate>,
}

/// What a decision believed of one ranked engine.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Estimate {
    /// Blocks of the prompt it holds.
    pub matched: u32,
    /// Requests queued there (waiting plus this node's pending sends): what the entry
    /// estimates the prefill work ahead of a request there from (see
    /// [`crate::lifecycle::tokens_bound`]).
    pub queued: u32,
    /// Of `queued`, this node's sends its gauges do not count yet.
    pub pending: u32,
    /// The prompt tokens queued there as its gauges showed them (`queued` less `pending`),
    /// when its serving node said (see [`Gauges::queued_tokens`]).
    pub queued_tokens: Option<u32>,
    /// Prompt tokens the engine could have prefilled since its gauges were read (their age
    /// at its prefill speed): work off the queue they show, not off the sends after them.
    pub worked_tokens: u32,
    /// How ready it is to run the LoRA adapter the request names ([`LoraReadiness::Running`]
    /// for a base model).
    pub ready: LoraReadiness,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RouteError {
    #[error("no healthy engine serves model `{0}`")]
    NoCandidate(String),
}

/// Reusable buffers, so a busy node allocates nothing per decision beyond the result.
#[derive(Debug, Default)]
pub struct DecideScratch {
    entries: Vec<Considered>,
    scored: Vec<Scored>,
    weights: Vec<u64>,
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

/// [`decide`] with caller-owned scratch buffers: the stages in order.
pub fn decide_with(
    scratch: &mut DecideScratch,
    candidates: &[Candidate<'_>],
    request: &RouteRequest<'_>,
    config: &RouteConfig,
    now_ms: u64,
) -> Result<Decision, RouteError> {
    let DecideScratch {
        entries,
        scored,
        weights,
    } = scratch;
    eligible::consider(entries, candidates, request, config, now_ms);
    if entries.is_empty() {
        return Err(RouteError::NoCandidate(request.model.to_owned()));
    }
    let cap = load_cap::cap(entries, &config.load);
    let best_matched = entries.iter().map(|e| e.matched).max().unwrap_or(0);
    let cold = cold::is_new_prefix(request, best_matched, &config.hit)
        .then(|| ColdChoices::new(weights, entries, request, &config.cold));
    let owed = match config.hit.popular_owed_holders {
        true => owed::owed(entries, request.popular),
        false => owed::Owed::default(),
    };
    let session = Session::new(entries, request, config, cold.is_some());
    scored.clear();
    scored.extend(entries.iter().map(|entry| Scored {
        under_bound: load_cap::under(entry, cap),
        base: match &cold {
            Some(choices) => choices.score(entry),
            None => {
                let candidate = &candidates[entry.index];
                let matched = entry.matched.max(owed.everywhere);
                score::base_score(candidate, matched, entry, request, config)
            }
        },
        bonus: session.bonus_for(entry),
    }));
    let ranking = Ranking {
        entries,
        scored,
        spread: spread::key(request, cold.is_some()),
        config,
    };
    let top = ranking.top();
    let short = request.chain.is_empty();
    let reason = ranking.reason(&top[0], cold.is_some(), session.node, short);
    Ok(Decision {
        ranked: top.iter().map(|r| entries[r.entry].index).collect(),
        reason,
        matched_blocks: entries[top[0].entry].matched,
        best_matched_blocks: best_matched,
        new_prefix: cold.is_some(),
        popular_blocks: if cold.is_some() { 0 } else { owed.blocks },
        estimates: estimates(&top, entries, candidates, config, now_ms),
    })
}

/// What the decision believed of each engine in `top`.
fn estimates(
    top: &[Ranked],
    entries: &[Considered],
    candidates: &[Candidate<'_>],
    config: &RouteConfig,
    now_ms: u64,
) -> Vec<Estimate> {
    top.iter()
        .map(|r| {
            let entry = &entries[r.entry];
            let candidate = &candidates[entry.index];
            Estimate {
                matched: entry.matched,
                queued: entry.queued,
                pending: candidate.pending,
                queued_tokens: candidate.gauges().queued_tokens,
                worked_tokens: score::worked_tokens(candidate, config, now_ms),
                ready: entry.ready,
            }
        })
        .collect()
}
