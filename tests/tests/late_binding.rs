//! Late binding and fresh load over real processes (issue 14 §2–§3): an answer carries the
//! serving engine's load back to the entry, whose view shows it at once; a serving node whose
//! queue is longer than the entry believed the next candidate's declines the request, which is
//! served by that candidate.
//!
//! Two nodes with slow modelled engines (a 1,000-token prefill takes about 2 s), so that
//! requests stay queued (no first token yet) while the test looks.

use std::time::Duration;

use kvmesh_tests::openai::{completion_body, served_by};
use kvmesh_tests::slow_pair::{
    PREFILL_TIMEOUT, estimate_of, finish, long_streamed, metric, queue_three_at_b,
    sessions_preferring, two_nodes, two_slow_nodes,
};
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Cluster, NodeSpec, Request, Timing, wait_until};

#[test]
fn an_answer_carries_the_serving_engines_load_back_to_the_entry() {
    let cluster = two_slow_nodes();
    let reports_before = metric(&cluster, "a", "kvmesh_load_reports_total");
    // Only b serves `only-b`: a forwards it, and b's answer head comes back while the engine
    // is still prefilling (no first token, so queued there).
    let request = cluster
        .sidecar("a")
        .try_start(long_streamed("only-b", "reported"))
        .expect("the request sent");
    wait_until(Duration::from_secs(10), "b's report to reach a", || {
        metric(&cluster, "a", "kvmesh_load_reports_total") > reports_before
    });
    let estimate = estimate_of(&cluster, "a", "b");
    let report = &estimate["last_report"];
    assert_eq!(
        (report["waiting"].as_u64(), report["inflight"].as_u64()),
        (Some(1), Some(1)),
        "b reported its queue with the head: {estimate}"
    );
    assert!(
        report["age_ms"].as_u64().is_some_and(|age| age < 10_000),
        "{estimate}"
    );
    // The queue in prompt tokens: the request's own (~1,000), less what the engine may have
    // prefilled of it before the head left.
    let tokens = report["queued_tokens"].as_u64();
    assert!(
        tokens.is_some_and(|t| t > 0 && t < 4_000),
        "b reported its queue in prompt tokens: {estimate}"
    );
    match estimate["source"].as_str() {
        Some("report") => assert_eq!(estimate["queued_tokens"].as_u64(), tokens, "{estimate}"),
        // b's digest can overtake its report (gossip's values reach the view as they arrive):
        // the newer wins, and the engine can only have worked some of the request off since.
        Some("digest") => assert!(
            estimate["queued_tokens"]
                .as_u64()
                .is_some_and(|t| t > 0 && Some(t) <= tokens),
            "{estimate}"
        ),
        _ => panic!("a's estimate of b names its source: {estimate}"),
    }
    assert_eq!(
        estimate["waiting"].as_u64(),
        Some(1),
        "a's view of b counts the request at once: {estimate}"
    );
    assert_eq!(
        metric(&cluster, "a", "kvmesh_load_reports_total"),
        reports_before + 1.0
    );
    let response = request.finish().expect("the response head");
    assert_eq!(response.header("x-kvmesh-node"), Some("b"));
    let mut body = String::new();
    std::io::Read::read_to_string(&mut { response }, &mut body).expect("response body");
    assert!(
        body.contains("data: [DONE]"),
        "the stream completes: {body}"
    );
}

#[test]
fn a_node_whose_queue_is_longer_than_the_next_candidates_declines_and_the_next_serves() {
    let cluster = two_slow_nodes();
    let busy = queue_three_at_b(&cluster);
    // a must rank b first: a session whose preferred node is b (its bonus outweighs the queue
    // term of 3 requests).
    let session = sessions_preferring("b", "a")
        .next()
        .expect("half of all sessions prefer b");
    let declined_before = labelled(&cluster, "b", "kvmesh_declined_total", "queue");
    // A prompt shorter than a block: nothing cached anywhere to weigh against the queue.
    let request = Request::post_json(
        "/v1/completions",
        &completion_body("shared", "hi", 1, false),
    )
    .header("x-session-id", &session)
    .timeout(PREFILL_TIMEOUT);
    let response = cluster.sidecar("a").send(request);
    assert_eq!(response.status, 200, "{}", response.describe());
    assert_eq!(
        served_by(&response),
        "a",
        "b declined it; a, the next in rank, served it"
    );
    assert_eq!(response.header("x-kvmesh-reason"), Some("declined"));
    assert_eq!(
        labelled(&cluster, "b", "kvmesh_declined_total", "queue"),
        declined_before + 1.0
    );
    assert_eq!(metric(&cluster, "a", "kvmesh_attempts_declined_total"), 1.0);
    for response in busy {
        finish(response);
    }
}

fn labelled(cluster: &Cluster, node: &str, name: &str, reason: &str) -> f64 {
    cluster
        .sidecar(node)
        .metric(name, &[("reason", reason)])
        .expect("metrics")
        .unwrap_or(0.0)
}

/// A request handed to an engine is in its peers' views after a gossip exchange, not at the
/// sidecar's next digest tick: with the tick at 3 s, each of four requests queued at b shows
/// in a's view of b's digest within 1.5 s of the one before (at the next tick, each would
/// with a chance of about four in ten).
#[test]
fn a_queue_change_reaches_the_peers_before_the_next_tick() {
    let cluster = two_nodes(Timing::Scaled(40.0), &["--digest-interval-ms", "3000"]);
    // What b's gossiped digest says is in flight there (a sent b nothing: no report).
    let in_flight_at_b = || -> Option<u64> {
        let digest = cluster.sidecar("a").digest_of("b")?;
        Some(digest["running"].as_u64()? + digest["waiting"].as_u64()?)
    };
    let mut queued = Vec::new();
    for count in 1..=4u64 {
        let request = long_streamed("only-b", &format!("queued {count}"));
        queued.push(cluster.sidecar("b").try_start(request).expect("sent"));
        let what = format!("a to see {count} in flight at b");
        wait_until(Duration::from_millis(1_500), &what, || {
            in_flight_at_b().is_some_and(|n| n >= count)
        });
    }
    // Dropping the connections cancels the requests.
    drop(queued);
}

/// Every request placed as it arrives records how old the load was that its decision read for
/// the engine it ranked first (`kvmesh_route_load_age_seconds`): nothing for the entry's own
/// engine, read live; for a peer, the age of its digest or last report, which a healthy mesh
/// keeps to about a second (a quiet node still gossips its digest every second; the bound
/// checked leaves room for a loaded machine's stalls).
#[test]
fn every_request_records_how_old_the_load_was_that_placed_it() {
    // Only b serves `shared`: entering at a, it is placed on b's load as a knows it; entering
    // at b, on b's engine read live.
    let cluster = Cluster::start(&[
        NodeSpec::new("a", &["other"]),
        NodeSpec::new("b", &["shared"]),
    ]);
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);
    cluster.wait_models(&["a", "b"], &["other", "shared"], CONVERGENCE_TIMEOUT);
    let (through_a, through_b) = (6, 4);
    for (entry, requests) in [("a", through_a), ("b", through_b)] {
        for i in 0..requests {
            let body =
                completion_body("shared", &format!("question {i} through {entry}"), 1, false);
            let request = Request::post_json("/v1/completions", &body).timeout(PREFILL_TIMEOUT);
            let response = cluster.sidecar(entry).send(request);
            assert_eq!(response.status, 200, "{}", response.describe());
            assert_eq!(served_by(&response), "b");
        }
    }
    assert_eq!(
        load_ages(&cluster, "a", "live", "0.001").0,
        0.0,
        "a's engine serves no `shared`"
    );
    let mut peer_placed = 0.0;
    for source in ["digest", "report"] {
        let (count, within) = load_ages(&cluster, "a", source, "4.096");
        assert_eq!(within, count, "a load from a {source} read over 4 s old");
        peer_placed += count;
    }
    assert_eq!(peer_placed, f64::from(through_a));
    let (live, now) = load_ages(&cluster, "b", "live", "0.001");
    assert_eq!(live, f64::from(through_b));
    assert_eq!(now, live, "its own engine, read now");
}

/// Of `node`'s requests placed on load from `source` (`kvmesh_route_load_age_seconds`): how
/// many, and how many on load at most `le` seconds old (a bucket bound as the sidecar exports
/// it).
fn load_ages(cluster: &Cluster, node: &str, source: &str, le: &str) -> (f64, f64) {
    let read = |name: &str, labels: &[(&str, &str)]| {
        let sidecar = cluster.sidecar(node);
        sidecar
            .metric(name, labels)
            .expect("metrics")
            .unwrap_or(0.0)
    };
    let count = read("kvmesh_route_load_age_seconds_count", &[("source", source)]);
    let labels = [("source", source), ("le", le)];
    (count, read("kvmesh_route_load_age_seconds_bucket", &labels))
}
