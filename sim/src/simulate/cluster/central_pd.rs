//! The centralized policies in a disaggregated cluster, as the central PD routers do it
//! (vllm-router, the SGLang gateway, vLLM's toy proxy): every request is split (they know no
//! prefix to judge it by), its prefill engine is the policy's pick among the prefill engines,
//! and its decode engine the policy's pick among the decode engines, at arrival (counted there
//! from then on, as their per-worker counters do) or when the prefill ends.

use super::{Leg, Prepared, Sim, Submission};
use crate::simulate::pd::{DecodeChoice, PdSetup};
use crate::simulate::policy::{PolicyKind, least_loaded, power_of_two, random, round_robin};

impl Sim<'_> {
    /// Routes an arrival's prefill leg (and its decode leg, if chosen at arrival).
    pub(super) fn arrive_split(&mut self, prepared: Prepared, pd: PdSetup) -> Submission {
        let reason = kvmesh_protocol::lifecycle::PdReason::Pd.as_str();
        *self.pd_reasons.entry(reason.to_owned()).or_default() += 1;
        let entry = prepared.entry as usize;
        let prefill = self.pick(0..pd.prefill_nodes, entry, false);
        let decode = (pd.decode_choice == DecodeChoice::Arrival).then(|| {
            let decode = self.pick(pd.prefill_nodes..self.nodes.len(), entry, true);
            self.loads[decode] += 1;
            decode
        });
        self.awaiting_decode
            .insert(prepared.id, (prepared.clone(), decode));
        self.commit_leg(prefill, prepared, Leg::Prefill)
    }

    /// Request `id`'s prefill leg ended on node `prefill` at `now`: its decode leg, for the
    /// engine chosen at arrival or now.
    pub(super) fn decode_leg(&mut self, id: u64, prefill: u32, now: u64) -> Option<Submission> {
        let pd = self.config.pd?;
        let (prepared, decode) = self.awaiting_decode.remove(&id)?;
        let decode = match decode {
            Some(decode) => {
                // Counted since its arrival; the leg now counts as any request.
                self.loads[decode] -= 1;
                decode
            }
            None => self.pick(
                pd.prefill_nodes..self.nodes.len(),
                prepared.entry as usize,
                true,
            ),
        };
        let mut submission = self.commit_leg(decode, prepared, Leg::Decode);
        // Handed to the engine now (the centralized loop has no hops).
        submission.arrival_ns = now;
        self.track_decode(id, prefill, decode as u32, now);
        Some(submission)
    }

    /// The centralized policy's pick among engines `range` (`decode`: the decode pool's
    /// round-robin counter).
    fn pick(&mut self, range: std::ops::Range<usize>, entry: usize, decode: bool) -> usize {
        let loads = &self.loads[range.clone()];
        let offset = match self.policy {
            PolicyKind::RoundRobin => {
                let counter = match decode {
                    true => &mut self.rr_decode[entry],
                    false => &mut self.rr_counters[entry],
                };
                round_robin::pick(counter, loads.len())
            }
            PolicyKind::LeastLoaded => least_loaded::pick(loads, &mut self.rng),
            PolicyKind::PowerOfTwo => power_of_two::pick(loads, &mut self.rng),
            _ => random::pick(&mut self.rng, loads.len()),
        };
        range.start + offset
    }
}
