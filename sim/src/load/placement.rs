//! `--pick placement`: a static placement computed before the run from the run's own
//! requests, the reference a router's hit rate is held against.
//!
//! A router decides one request at a time from what it has seen; this baseline sees the
//! whole run first. Each request gets an affinity key: its leading segments up to the first
//! one that not every request shares (the shared head, e.g. RAG's instruction, is cached
//! everywhere and says nothing; gsp's key is its system prompt, rag's its first document, a
//! chat's its session's opening). Every request of a key goes to one target, so a shared
//! context is computed once, and the keys are dealt to targets heaviest first, each to the
//! target with the fewest prompt tokens so far (longest-processing-time first), so the load
//! is as even as whole keys allow. It knows nothing of time: a burst of one key still lands
//! on one target, and a key heavier than a target's share overloads it, which is why it is a
//! reference for the hit rate and not for latency.
//!
//! Keys the plan did not see (a closed loop past its sampled requests) go to a target by
//! their hash.

use std::collections::HashMap;

use kvmesh_protocol::mix64;

use crate::workload::{Request, Segment};

/// Targets of affinity keys, dealt before the run.
#[derive(Debug, Clone)]
pub struct Placement {
    /// Leading segments every planned request shares (not part of any key).
    shared_head: usize,
    targets: usize,
    by_key: HashMap<u64, usize>,
}

impl Placement {
    /// Deals the affinity keys of `requests` (the run's, in order) to `targets` targets.
    pub fn plan(requests: &[Request], targets: usize) -> Self {
        let targets = targets.max(1);
        let shared_head = shared_head(requests);
        let mut weight: HashMap<u64, u64> = HashMap::new();
        let mut first_seen: HashMap<u64, usize> = HashMap::new();
        for (i, r) in requests.iter().enumerate() {
            let key = affinity_key(&r.segments, shared_head);
            *weight.entry(key).or_default() += r.prompt_tokens();
            first_seen.entry(key).or_insert(i);
        }
        // Heaviest first; ties in order of first appearance, so the deal is deterministic.
        let mut keys: Vec<(u64, u64)> = weight.into_iter().collect();
        keys.sort_by_key(|&(key, w)| (std::cmp::Reverse(w), first_seen[&key]));
        let mut load = vec![0u64; targets];
        let mut by_key = HashMap::with_capacity(keys.len());
        for (key, w) in keys {
            let lightest = (0..targets).min_by_key(|&t| (load[t], t)).unwrap_or(0);
            load[lightest] += w;
            by_key.insert(key, lightest);
        }
        Self {
            shared_head,
            targets,
            by_key,
        }
    }

    /// The target of `request`.
    pub fn target(&self, request: &Request) -> usize {
        let key = affinity_key(&request.segments, self.shared_head);
        self.by_key
            .get(&key)
            .copied()
            .unwrap_or_else(|| (mix64(key) % self.targets as u64) as usize)
    }

    /// Affinity keys the plan dealt.
    pub fn keys(&self) -> usize {
        self.by_key.len()
    }
}

/// How many leading segments every request has, the same in all.
fn shared_head(requests: &[Request]) -> usize {
    let Some((first, rest)) = requests.split_first() else {
        return 0;
    };
    let mut n = first.segments.len();
    for r in rest {
        n = n.min(
            first
                .segments
                .iter()
                .zip(&r.segments)
                .take_while(|(a, b)| a == b)
                .count(),
        );
    }
    n
}

/// The leading segments through the first one past the shared head, hashed.
fn affinity_key(segments: &[Segment], shared_head: usize) -> u64 {
    segments
        .iter()
        .take(shared_head + 1)
        .fold(0x706c_6163_656du64, |h, s| {
            mix64(h ^ mix64(s.key ^ u64::from(s.tokens)))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::gsp::{Gsp, GspArgs};
    use crate::workload::rag::{PRESSURE, Rag};
    use crate::workload::{Form, Workload};

    fn request(keys: &[u64], tokens: u32) -> Request {
        Request {
            segments: keys.iter().map(|&key| Segment { key, tokens }).collect(),
            form: Form::Prompt,
            output_tokens: 1,
            session: None,
            attachments: Vec::new(),
        }
    }

    #[test]
    fn a_key_stays_on_one_target_and_the_shared_head_is_skipped() {
        // Every request starts with segment 7; the second segment is the context.
        let requests: Vec<Request> = (0..40u64)
            .map(|i| request(&[7, 100 + i % 4, 1000 + i], 64))
            .collect();
        let p = Placement::plan(&requests, 2);
        assert_eq!(
            p.keys(),
            4,
            "one key per context, not one for the shared head"
        );
        for (i, r) in requests.iter().enumerate() {
            let same_context = &requests[i % 4];
            assert_eq!(p.target(r), p.target(same_context), "request {i}");
        }
        let on_first = (0..4).filter(|&i| p.target(&requests[i]) == 0).count();
        assert_eq!(on_first, 2, "four equal contexts split two and two");
    }

    #[test]
    fn heavy_keys_are_dealt_first_to_the_lightest_target() {
        // Context 1 carries 6 requests, contexts 2-4 two each: 6 | 2+2+2.
        let mut requests = Vec::new();
        for (context, n) in [(1u64, 6), (2, 2), (3, 2), (4, 2)] {
            for q in 0..n {
                requests.push(request(&[context, 50 + q], 100));
            }
        }
        let p = Placement::plan(&requests, 2);
        let heavy = p.target(&requests[0]);
        for r in &requests[6..] {
            assert_ne!(
                p.target(r),
                heavy,
                "the light contexts share the other target"
            );
        }
    }

    #[test]
    fn an_unseen_key_still_gets_a_valid_target() {
        let p = Placement::plan(&[request(&[1, 2], 8)], 3);
        for k in 0..50 {
            assert!(p.target(&request(&[1, 500 + k], 8)) < 3);
        }
        assert!(Placement::plan(&[], 2).target(&request(&[9], 8)) < 2);
    }

    #[test]
    fn gsp_groups_and_rag_first_documents_are_the_keys() {
        let gsp = Gsp::new(
            GspArgs {
                gsp_groups: 8,
                gsp_prompts_per_group: 4,
                gsp_system_len: 256,
                gsp_question_len: 16,
                gsp_output_len: 4,
            },
            3,
        );
        let requests: Vec<Request> = (0..32).map(|i| gsp.request(i)).collect();
        let p = Placement::plan(&requests, 2);
        assert_eq!(p.keys(), 8);

        let rag = Rag::new(PRESSURE, 3);
        let requests: Vec<Request> = (0..200).map(|i| rag.request(i)).collect();
        let p = Placement::plan(&requests, 2);
        assert_eq!(p.keys(), 6, "one key per first document");
        for (i, r) in requests.iter().enumerate() {
            let first_doc = rag.documents(i as u64)[0];
            let twin = (0..200)
                .find(|&j| rag.documents(j)[0] == first_doc)
                .expect("itself at least");
            assert_eq!(p.target(r), p.target(&requests[twin as usize]));
        }
    }
}
