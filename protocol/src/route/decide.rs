//! [`decide`]: filter, score, bound, rank.

use super::config::{BoundOn, RouteConfig, ScoreForm};
use super::popularity::PrefixShare;
use super::reason::RouteReason;
use super::rendezvous::rendezvous_weight;
use crate::digest::{LoadDigest, LoraReadiness, Role};
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
    /// [`RouteConfig::spread_margin`] of the best share such requests by rendezvous on this
    /// key, so that entry nodes with the same view do not all pick the same one of several
    /// near-equal engines (the holders of a hot prefix, say). `None`: near-equal candidates
    /// are ranked by score and node key alone.
    pub spread: Option<u64>,
    /// Prefixes of the chain with their share of the recent traffic (see
    /// [`super::PrefixTraffic`]): one held by fewer engines than its share fills counts as
    /// held by every engine. Empty: every prefix is judged by who holds it.
    pub popular: &'a [PrefixShare],
    /// Whether prompts in the recent traffic share prefixes (see
    /// [`super::PrefixTraffic::prefixes_recur`]). Where they do, a new prefix goes where every
    /// entry node sends it, so that its copies and next requests meet there
    /// ([`RouteConfig::cold_choices`]); where they do not, to the least loaded of its first
    /// [`RouteConfig::unshared_choices`] (by default one: there too) or to an engine that
    /// looks idle ([`RouteConfig::unshared_to_idle`]), as a load balancer would: nothing is
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

/// A candidate as this decision considers it: its match and its load, read once.
#[derive(Copy, Clone, Debug)]
struct Considered {
    index: usize,
    node_key: u64,
    matched: u32,
    /// What the load bound counts (see [`BoundOn`]).
    bounded: u32,
    /// Waiting plus pending.
    queued: u32,
    /// Gauges read at this very millisecond (this node's own engine, read live) show nothing
    /// in flight there, and nothing was sent since.
    idle_now: bool,
    /// The engine has room for the blocks this request would add to its cache without
    /// evicting any (its summary's blocks plus those, at most its capacity): an engine that
    /// holds little takes near-equal requests first, so that it fills with prefixes of its own
    /// instead of being passed over for every prompt that meets a few blocks elsewhere. Not
    /// known of a candidate without a summary (this decision is shown none).
    evicts_nothing: bool,
    /// Requests in flight there (running, waiting, pending) as the gossiped digest shows
    /// them: what every entry node sees alike.
    shared_load: u32,
    /// For a request naming a LoRA adapter, how ready the engine is to run it (see
    /// [`LoraReadiness`]); the highest for a base model.
    ready: LoraReadiness,
    fresh: bool,
}

/// A ranking key: under the load bound first, then inside the spread band (near-equal to the
/// best, ordered by the request's rendezvous weight), then the score, then the node key, so
/// that the order is total and identical on every node.
#[derive(Copy, Clone, Debug)]
struct Ranked {
    under_bound: bool,
    /// If its score is within the spread margin of the best: whether it takes the request
    /// without evicting, whether it is idle now, then the request's rendezvous weight on it.
    band: Option<(bool, bool, u64)>,
    score: f64,
    node_key: u64,
    entry: usize,
}

impl Ranked {
    fn cmp_rank(&self, other: &Self) -> Ordering {
        (self.under_bound.cmp(&other.under_bound))
            .then(self.band.is_some().cmp(&other.band.is_some()))
            .then(self.band.cmp(&other.band))
            .then(self.score.total_cmp(&other.score))
            .then(self.node_key.cmp(&other.node_key))
    }
}

/// One candidate's scores, before the band is known.
#[derive(Copy, Clone, Debug)]
struct Scored {
    under_bound: bool,
    /// Score without the session bonus.
    base: f64,
    bonus: f64,
}

/// Which ranking is built: the real one, or the counterfactuals that name the reason.
#[derive(Copy, Clone, Debug, PartialEq)]
enum View {
    Real,
    IgnoringBound,
    IgnoringSession,
}

impl View {
    fn key(self, scored: &Scored) -> (bool, f64) {
        match self {
            View::Real => (scored.under_bound, scored.base + scored.bonus),
            View::IgnoringBound => (true, scored.base + scored.bonus),
            View::IgnoringSession => (scored.under_bound, scored.base),
        }
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
        let gauges = candidate.gauges();
        if !digest.healthy || !digest.role.takes(request.role) || !digest.serves(request.model) {
            continue;
        }
        let fresh = now_ms.saturating_sub(candidate.digest_received_ms) <= config.max_digest_age_ms;
        any_fresh |= fresh;
        let on_gpu = summary_match(digest, candidate.summary, request.chain)
            .max(candidate.recent_match)
            .min(chain_len);
        // Blocks past the GPU match that an offload tier holds count at a discount.
        let offloaded =
            summary_match(digest, candidate.offload, request.chain).saturating_sub(on_gpu);
        let offload_worth =
            (f64::from(offloaded) * config.offload_weight.clamp(0.0, 1.0)).round() as u32;
        // In the chain's blocks, which the summary counts; the digest counts the engine's.
        let capacity = f64::from(digest.kv_capacity_blocks) * f64::from(digest.block_size)
            / f64::from(request.tokens_per_block).max(1.0);
        let adds = f64::from(chain_len - on_gpu);
        let held = candidate
            .held_blocks
            .or_else(|| candidate.summary.map(|s| s.estimated_blocks() as u64));
        let evicts_nothing = held.is_some_and(|held| held as f64 + adds <= capacity);
        entries.push(Considered {
            index,
            node_key: candidate.node_key,
            matched: on_gpu + offload_worth,
            evicts_nothing,
            shared_load: digest.load().saturating_add(candidate.digest_pending),
            bounded: match config.bound_on {
                BoundOn::InFlight => gauges.load(),
                BoundOn::Queued => gauges.waiting,
            }
            .saturating_add(candidate.pending),
            queued: gauges.waiting.saturating_add(candidate.pending),
            ready: match digest.loras.iter().any(|lora| lora == request.model) {
                true => digest.lora_use.readiness(request.model),
                false => LoraReadiness::Running,
            },
            idle_now: candidate.digest_received_ms >= now_ms
                && gauges.load() == 0
                && candidate.pending == 0,
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
    let total_load: u64 = entries.iter().map(|e| u64::from(e.bounded)).sum();
    let mean = (total_load + 1) as f64 / entries.len() as f64;
    let cap = config.load_cap(mean);

    let best_matched = entries.iter().map(|e| e.matched).max().unwrap_or(0);
    let short = request.chain.is_empty();
    let cold = !short && best_matched < config.min_hit_blocks;
    let session_node = request.session.map(|session| {
        entries
            .iter()
            .max_by_key(|e| (rendezvous_weight(session, e.node_key), e.node_key))
            .map_or(0, |e| e.node_key)
    });

    // A new prefix's choices: the engines with the highest rendezvous weights on its first
    // block, the same few on every entry node (more where prefixes do not recur, and then
    // every engine gossip shows idle too); for an adapter, among the engines readiest to run
    // it (gossiped: every entry node sees them alike).
    let best_ready = entries
        .iter()
        .map(|e| e.ready)
        .max()
        .unwrap_or(LoraReadiness::Running);
    let idle_choices = !request.prefixes_recur && config.unshared_to_idle;
    let is_choice = |e: &Considered, floor: u64| {
        e.ready == best_ready
            && (rendezvous_weight(request.chain[0], e.node_key) >= floor
                || (idle_choices && e.shared_load == 0))
    };
    let cold_floor = if cold {
        let weights = &mut scratch.weights;
        weights.clear();
        weights.extend(
            entries
                .iter()
                .filter(|e| e.ready == best_ready)
                .map(|e| rendezvous_weight(request.chain[0], e.node_key)),
        );
        // The `choices`-th highest weight, without sorting all of them.
        let choices = match request.prefixes_recur {
            true => config.cold_choices,
            false => config.cold_choices.max(config.unshared_choices),
        };
        let choices = (choices.max(1) as usize).min(weights.len());
        *weights
            .select_nth_unstable_by(choices - 1, |a, b| b.cmp(a))
            .1
    } else {
        0
    };
    // The least load among the choices: a choice counts as busier only beyond it plus the
    // margin, so that entry nodes whose views differ by a request or so (one reads its own
    // engine live, the others through gossip) still agree. Where prefixes do not recur, no
    // margin: nothing is gained by agreeing, and a request more is a request more.
    let cold_lightest = entries
        .iter()
        .filter(|e| cold && is_choice(e, cold_floor))
        .map(|e| e.shared_load)
        .min()
        .unwrap_or(0);
    let cold_margin = match request.prefixes_recur {
        true => cold_lightest.saturating_add(config.cold_load_margin),
        false => cold_lightest,
    };
    let (popular_blocks, everywhere) = owed_everywhere(entries, request.popular).unwrap_or((0, 0));
    let scored = &mut scratch.scored;
    scored.clear();
    for entry in entries.iter() {
        let candidate = &candidates[entry.index];
        let base = if cold {
            // Among the choices the least loaded, then the higher rendezvous weight; outside
            // them the weight alone (below any choice: the fallback order under the bound).
            // Loads as gossip shows them, not as this node alone knows them (its own engine
            // live, a peer's last report): every entry node sending the same new prefix must
            // rank its choices alike. Late binding corrects with the exact queue.
            let weight = rendezvous_weight(request.chain[0], entry.node_key);
            let unit = weight as f64 / u64::MAX as f64;
            if is_choice(entry, cold_floor) {
                2.0 + unit - f64::from(entry.shared_load.saturating_sub(cold_margin)) * 2.0
            } else {
                unit - f64::from(u32::MAX)
            }
        } else {
            base_score(
                candidate,
                entry.matched.max(everywhere),
                entry,
                request,
                config,
            )
        };
        let bonus = match session_node {
            Some(node) if !cold && node == entry.node_key => session_bonus(request, config),
            _ => 0.0,
        };
        scored.push(Scored {
            under_bound: f64::from(entry.bounded) + 1.0 <= cap,
            base,
            bonus,
        });
    }
    // A new prefix must land where every entry node sends it: no spreading on cold requests.
    let spread = request.spread.filter(|_| !cold);

    let keep = config.ranked_len.max(1);
    let mut top: Vec<Ranked> = Vec::with_capacity(keep + 1);
    rank(entries, scored, View::Real, spread, config, |ranked| {
        insert_top(&mut top, ranked, keep)
    });
    // The winner ignoring the load bound, and ignoring the session bonus, to name the reason.
    let best_of = |view: View| {
        let mut best: Option<Ranked> = None;
        rank(entries, scored, view, spread, config, |ranked| {
            if best.is_none_or(|b| ranked.cmp_rank(&b).is_gt()) {
                best = Some(ranked);
            }
        });
        best
    };
    let best_unbounded = best_of(View::IgnoringBound);
    let best_without_session = best_of(View::IgnoringSession);

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
        new_prefix: cold,
        popular_blocks: if cold { 0 } else { popular_blocks },
        estimates: top
            .iter()
            .map(|r| {
                let entry = &entries[r.entry];
                let candidate = &candidates[entry.index];
                Estimate {
                    matched: entry.matched,
                    queued: entry.queued,
                    pending: candidate.pending,
                    queued_tokens: candidate.gauges().queued_tokens,
                    worked_tokens: worked_tokens(candidate, config, now_ms),
                    ready: entry.ready,
                }
            })
            .collect(),
    })
}

/// Leading blocks of `chain` that `summary` shows, when its engine's node hashes as this one
/// does (another hash version's blocks never match).
pub(super) fn summary_match(
    digest: &LoadDigest,
    summary: Option<&PeerSummary>,
    chain: &[BlockHash],
) -> u32 {
    match summary {
        Some(summary) if digest.hash_version == HASH_VERSION => {
            (summary.longest_match(chain) as u32).min(chain.len() as u32)
        }
        _ => 0,
    }
}

/// Calls `each` with every entry's ranking key under `view`: candidates within the spread
/// margin of the best (among those with the best's bound status) are in the band.
fn rank(
    entries: &[Considered],
    scored: &[Scored],
    view: View,
    spread: Option<u64>,
    config: &RouteConfig,
    mut each: impl FnMut(Ranked),
) {
    let best = scored
        .iter()
        .map(|s| view.key(s))
        .max_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let floor = best.map(|(bound, score)| (bound, band_floor(score, config)));
    for (position, (entry, s)) in entries.iter().zip(scored).enumerate() {
        let (under_bound, score) = view.key(s);
        let band = match (spread, floor) {
            (Some(key), Some((best_bound, floor)))
                if under_bound == best_bound && score >= floor =>
            {
                Some((
                    entry.evicts_nothing,
                    entry.idle_now,
                    rendezvous_weight(key, entry.node_key),
                ))
            }
            _ => None,
        };
        each(Ranked {
            under_bound,
            band,
            score,
            node_key: entry.node_key,
            entry: position,
        });
    }
}

/// The lowest score still near-equal to `best`: `spread_margin` score units below it, or (cost
/// form, where the score is minus the estimated TTFT) that fraction of the best TTFT.
fn band_floor(best: f64, config: &RouteConfig) -> f64 {
    let margin = config.spread_margin.max(0.0);
    match config.policy {
        ScoreForm::Score => best - margin,
        ScoreForm::Cost => best - margin * best.abs(),
    }
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

/// The longest popular prefix held by fewer engines than its share of the traffic fills
/// (`⌊share × candidates⌋`), if any: its counted depth, and the blocks the decision credits
/// every engine with, as if each held it, so that the engine its next request fits best takes
/// it, holder or not, and becomes one (see [`super::PrefixTraffic`]). The credit spans what its
/// holders hold of the chain, up to where a longer prefix is no longer known to be as popular.
fn owed_everywhere(entries: &[Considered], popular: &[PrefixShare]) -> Option<(u32, u32)> {
    popular.iter().rev().find_map(|prefix| {
        // One holder is what any prefix gets: only a share over two engines' is owed more.
        let owed = (prefix.share * entries.len() as f64).floor() as usize;
        if owed < 2 {
            return None;
        }
        let holders = entries.iter().filter(|e| e.matched >= prefix.blocks);
        let (count, held) = holders.fold((0, 0), |(n, most), e| (n + 1, most.max(e.matched)));
        (count < owed).then(|| (prefix.blocks, held.min(prefix.until).max(prefix.blocks)))
    })
}

/// `matched`: the blocks the score credits the engine with (its own, or a popular prefix's
/// owed everywhere).
fn base_score(
    candidate: &Candidate<'_>,
    matched: u32,
    entry: &Considered,
    request: &RouteRequest<'_>,
    config: &RouteConfig,
) -> f64 {
    let gauges = candidate.gauges();
    let queued = f64::from(gauges.waiting) + f64::from(candidate.pending);
    let adapter = adapter_readiness(candidate.digest, entry.ready, request.model);
    match config.policy {
        ScoreForm::Score => {
            let matched = match request.chain.len() {
                0 => 0.0,
                len => f64::from(matched) / len as f64,
            };
            let queued = queued + config.running_weight.max(0.0) * f64::from(gauges.running);
            config.alpha * matched + config.beta * (1.0 - f64::from(gauges.kv_usage))
                - config.gamma * queued / config.waiting_threshold.max(1.0)
                + config.lora_weight * adapter.unwrap_or(0.0)
        }
        ScoreForm::Cost => {
            let loading = config.lora_load_ms.max(0.0) * (1.0 - adapter.unwrap_or(1.0));
            let ttft = estimated_ttft_ms(
                candidate.digest,
                gauges.waiting,
                matched,
                queued,
                request,
                config,
            );
            -(ttft + loading)
        }
    }
}

/// For a request naming a LoRA adapter the engine serves, how ready the engine is to run it,
/// 0..=1 (llm-d's scale: running 1, loadable into a free slot 0.8, queued 0.6, no slot 0);
/// `None` for a base model.
fn adapter_readiness(digest: &LoadDigest, ready: LoraReadiness, model: &str) -> Option<f64> {
    if !digest.loras.iter().any(|lora| lora == model) {
        return None;
    }
    Some(match ready {
        LoraReadiness::Running => 1.0,
        LoraReadiness::FreeSlot => 0.8,
        LoraReadiness::Waiting => 0.6,
        LoraReadiness::NoSlot => 0.0,
    })
}

/// The cost form: time to drain the queue ahead plus time to prefill what is not cached.
fn estimated_ttft_ms(
    digest: &LoadDigest,
    waiting: u32,
    matched: u32,
    queued: f64,
    request: &RouteRequest<'_>,
    config: &RouteConfig,
) -> f64 {
    let prefill_ms =
        request.uncached_tokens(matched) / prefill_tokens_per_s(digest, config) * 1000.0;
    queued * service_ms(digest, waiting, request, config) + prefill_ms
}

/// The prompt tokens `candidate`'s engine could have prefilled since its gauges were read:
/// their age (from when this node received them) at the engine's prefill speed. The gauges'
/// own age before they arrived is not known and not counted, so this errs low.
fn worked_tokens(candidate: &Candidate<'_>, config: &RouteConfig, now_ms: u64) -> u32 {
    let age_s = now_ms.saturating_sub(candidate.digest_received_ms) as f64 / 1000.0;
    (age_s * prefill_tokens_per_s(candidate.digest, config)).min(f64::from(u32::MAX)) as u32
}

/// An engine's prefill speed: what its digest reports, else the configured assumption.
fn prefill_tokens_per_s(digest: &LoadDigest, config: &RouteConfig) -> f64 {
    match f64::from(digest.prefill_tokens_per_s) {
        tps if tps > 0.0 => tps,
        _ => config.default_prefill_tokens_per_s.max(1.0),
    }
}

/// The time one queued request holds up the next on this engine: from the observed TTFT
/// (TTFT ≈ (waiting + 1) × service), or the prompt's own prefill time when nothing was
/// observed yet.
fn service_ms(
    digest: &LoadDigest,
    waiting: u32,
    request: &RouteRequest<'_>,
    config: &RouteConfig,
) -> f64 {
    match f64::from(digest.ttft_ewma_ms) {
        ttft if ttft > 0.0 => ttft / (1.0 + f64::from(waiting)),
        _ => f64::from(request.prompt_tokens) / prefill_tokens_per_s(digest, config) * 1000.0,
    }
}

/// The session bonus, in the policy's units: score units, or (cost form) that fraction of the
/// whole prompt's prefill time.
fn session_bonus(request: &RouteRequest<'_>, config: &RouteConfig) -> f64 {
    match config.policy {
        ScoreForm::Score => config.session_weight,
        ScoreForm::Cost => {
            config.session_weight * f64::from(request.prompt_tokens)
                / config.default_prefill_tokens_per_s.max(1.0)
                * 1000.0
        }
    }
}
