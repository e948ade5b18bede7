//! The request path of a disaggregated request: its prefill leg on the prefill engine chosen
//! when it arrived, then its decode leg on the decode engine chosen when the prefill answered
//! (runtime redirection), which streams to the client.
//!
//! Failures are typed per leg. A prefill leg that fails before answering (an unreachable
//! node, an engine error) goes to the next prefill engine in rank; when none is left, the
//! whole request runs on one engine. A decode leg that fails to connect goes to the next
//! decode engine with the same transfer parameters; one whose engine answers an error (a
//! failed pull: the prefill's blocks may be gone) runs the prefill once more and places its
//! decode again; after a second such failure the request runs whole. A prefill engine's
//! client error (4xx) is the client's answer, as any engine's would be. Every fallback is
//! counted (`kvmesh_pd_fallbacks_total`) and labelled `pd-fallback`; nothing reaches the
//! client before its decode leg's (or its fallback's) head, so nothing reaches it twice.
//!
//! A client that leaves between the legs is counted (`kvmesh_pd_abandoned_total`); the
//! prefill engine frees the blocks it kept when its lease ends (vLLM's
//! `kv_lease_duration`, 30 s by default), as no decode engine will pull them.

use super::body::ResponseBody;
use super::inference::{forward_whole, response_headers, route_failure};
use super::recent::RecentRequest;
use crate::forward::attempts::{self, Leg};
use crate::forward::headers::is_event_stream;
use crate::forward::relay::{leg_body, relay};
use crate::forward::transfer::{CachedTokensBody, decode_body, prefill_body, read_prefill_answer};
use crate::serve::routing::{Placement, Routed, route, route_decode, route_whole};
use crate::serve::state::{SharedState, lock};
use crate::view::unix_ms;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response};
use http_body_util::BodyExt;
use kvmesh_protocol::RequestHashes;
use kvmesh_protocol::lifecycle::PdReason;
use kvmesh_protocol::wire::RequestHead;
use serde_json::Value;
use std::time::Instant;

/// The reason label of a disaggregated request.
const PD: &str = PdReason::Pd.as_str();

/// A request to serve in two legs.
pub struct Disaggregated {
    pub state: SharedState,
    /// The head every leg is sent with (its body and routing fields change per leg).
    pub head: RequestHead,
    /// The client's body, as it came (a fallback sends it unchanged) and parsed.
    pub body: Bytes,
    pub json: Value,
    pub hashes: RequestHashes,
    pub session: Option<u64>,
}

/// A prefill that answered with blocks to pull.
struct Prefilled {
    transfer_params: Value,
    cached_tokens: Option<u64>,
    node_key: u64,
    served_by: String,
}

/// How a prefill leg ended.
enum PrefillEnd {
    Prefilled(Prefilled),
    /// The prefill engine refused the request itself (4xx): the client's answer.
    Refused(Response<ResponseBody>),
    /// Disaggregation cannot go on; the cause labels `kvmesh_pd_fallbacks_total`.
    Fallback(&'static str),
}

/// Counts a client that leaves between the legs (its future dropped) unless disarmed.
struct BetweenLegs {
    state: SharedState,
    armed: bool,
}

impl Drop for BetweenLegs {
    fn drop(&mut self) {
        if self.armed {
            self.state.metrics.pd_abandoned.inc();
            tracing::debug!("client left between the prefill and the decode leg");
        }
    }
}

impl Disaggregated {
    pub async fn serve(self, prefill: Routed) -> Response<ResponseBody> {
        let started = Instant::now();
        let mut prefill = prefill;
        let mut rerun = false;
        loop {
            let prefilled = match self.prefill(prefill).await {
                PrefillEnd::Prefilled(prefilled) => prefilled,
                PrefillEnd::Refused(response) => return response,
                PrefillEnd::Fallback(cause) => return self.fallback(cause).await,
            };
            let mut between = BetweenLegs {
                state: self.state.clone(),
                armed: true,
            };
            let decode = route_decode(
                &self.state,
                &self.hashes,
                prefilled.node_key,
                &self.head.request_id,
            );
            let Ok(decode) = decode else {
                between.armed = false;
                return self.fallback("no_decode").await;
            };
            let body = decode_body(&self.json, &prefilled.transfer_params);
            let mut head = self.head.clone();
            let chain = &self.hashes.chain;
            let result = attempts::run(&self.state, decode, &mut head, &body, chain, Leg::Decode);
            let result = result.await;
            between.armed = false;
            match result {
                Ok(answered) => {
                    let now = self.state.now_ms();
                    lock(&self.state.entry).record_pair(prefilled.node_key, answered.node_key, now);
                    return self.relay_decode(answered, &prefilled, started);
                }
                Err(unanswered) if unanswered.engine_error && !rerun => {
                    rerun = true;
                    self.state.metrics.pd_prefill_reruns.inc();
                    tracing::warn!(
                        failures = unanswered.failures.join("; "),
                        "decode leg failed; running the prefill again"
                    );
                    // Not on the engine whose blocks could not be pulled: it may be gone,
                    // or unreachable from the decode engines.
                    let placement = route(
                        &self.state,
                        &self.hashes,
                        self.session,
                        &self.head.request_id,
                        true,
                        Some(prefilled.node_key),
                    );
                    match placement {
                        Ok(Placement::Split { prefill: again }) => prefill = again,
                        Ok(Placement::Whole { .. } | Placement::LoadAdapter { .. }) | Err(_) => {
                            return self.fallback("decode_failed").await;
                        }
                    }
                }
                Err(unanswered) => {
                    tracing::warn!(
                        failures = unanswered.failures.join("; "),
                        "decode leg failed"
                    );
                    return self.fallback("decode_failed").await;
                }
            }
        }
    }

    /// Runs the prefill leg and reads its answer.
    async fn prefill(&self, routed: Routed) -> PrefillEnd {
        let state = &self.state;
        let mut head = self.head.clone();
        // One token, unstreamed: the answer's first byte still ends the prefill, which is
        // what the serving node counts its queue by.
        head.streamed = true;
        let body = prefill_body(&self.json);
        let chain = &self.hashes.chain;
        let result = attempts::run(state, routed, &mut head, &body, chain, Leg::Prefill).await;
        let Ok(answered) = result else {
            return PrefillEnd::Fallback("prefill_failed");
        };
        let served_by = answered.upstream.served_by.clone();
        if !(200..300).contains(&answered.upstream.status) {
            let mut headers = response_headers(&served_by, PD, &head.request_id);
            headers.extend(prefill_node_header(&served_by));
            state.metrics.inflight.inc();
            let response = relay(state.clone(), answered.upstream, answered.plan, headers, PD);
            return PrefillEnd::Refused(response);
        }
        let node_key = answered.node_key;
        let answer = leg_body(state.clone(), answered.upstream, answered.plan);
        let limit = state.config.max_body_bytes;
        let collected = tokio::time::timeout(state.config.request_timeout, collect(answer, limit));
        let read = match collected.await {
            Ok(Ok(bytes)) => read_prefill_answer(&bytes),
            Ok(Err(why)) => Err(format!("reading the prefill answer: {why}")),
            Err(_) => Err("the prefill answer did not end in time".to_owned()),
        };
        match read {
            Ok(answer) => match answer.transfer_params {
                Some(transfer_params) => PrefillEnd::Prefilled(Prefilled {
                    transfer_params,
                    cached_tokens: answer.cached_tokens,
                    node_key,
                    served_by,
                }),
                None => PrefillEnd::Fallback("no_transfer_params"),
            },
            Err(why) => {
                tracing::warn!(prefill = served_by, %why, "prefill answer unusable");
                PrefillEnd::Fallback("prefill_failed")
            }
        }
    }

    /// Relays the decode leg's answer, its `cached_tokens` set to the prefill engine's.
    fn relay_decode(
        &self,
        answered: attempts::Answered,
        prefilled: &Prefilled,
        started: Instant,
    ) -> Response<ResponseBody> {
        let state = &self.state;
        let served_by = answered.upstream.served_by.clone();
        state.recent.record(RecentRequest {
            at_unix_ms: unix_ms(),
            request_id: self.head.request_id.clone(),
            model: self.head.model.clone(),
            reason: PD,
            served_by: Some(served_by.clone()),
            outcome: "forwarded",
            attempts: answered.attempts,
            head_ms: started.elapsed().as_millis() as u64,
        });
        let sse = is_event_stream(&answered.upstream.headers);
        let mut headers = response_headers(&served_by, PD, &self.head.request_id);
        headers.extend(prefill_node_header(&prefilled.served_by));
        state.metrics.inflight.inc();
        let response = relay(state.clone(), answered.upstream, answered.plan, headers, PD);
        match prefilled.cached_tokens {
            Some(cached) => response.map(|body| CachedTokensBody::new(body, cached, sse).boxed()),
            None => response,
        }
    }

    /// Runs the request whole, as it came, after disaggregation could not go on.
    async fn fallback(self, cause: &'static str) -> Response<ResponseBody> {
        let state = &self.state;
        state
            .metrics
            .pd_fallbacks
            .get_or_create(&crate::metrics::ReasonLabels {
                reason: cause.to_owned(),
            })
            .inc();
        tracing::warn!(cause, "disaggregation fell back to a whole request");
        let routed = route_whole(state, &self.hashes, self.session, &self.head.request_id);
        let routed = match routed {
            Ok(routed) => routed,
            Err(failure) => return route_failure(state, failure, &self.head.model),
        };
        let label = Some(PdReason::Fallback.as_str());
        let chain = self.hashes.chain.clone();
        forward_whole(
            self.state,
            routed,
            self.head,
            self.body,
            chain,
            label,
            Leg::Whole,
        )
        .await
    }
}

/// A leg's whole body, of at most `limit` bytes. (Not `http_body_util::Limited`: its error
/// conversion makes the handler's future not `Send`, a limit of rustc's higher-ranked
/// lifetimes in async functions.)
async fn collect(mut body: ResponseBody, limit: usize) -> Result<Bytes, String> {
    let mut bytes = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        if let Ok(data) = frame.into_data() {
            if bytes.len() + data.len() > limit {
                return Err(format!("longer than {limit} bytes"));
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(bytes.freeze())
}

fn prefill_node_header(served_by: &str) -> Option<(HeaderName, HeaderValue)> {
    HeaderValue::from_str(served_by)
        .ok()
        .map(|value| (HeaderName::from_static("x-kvmesh-prefill-node"), value))
}
