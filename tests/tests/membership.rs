//! Membership over the mesh: a node joins through its seeds and serves, a killed node is
//! dropped and traffic goes on without failures, and a node whose certificate comes from
//! another CA never gets in.
//!
//! How long joining and failure detection take is printed, not asserted (beyond
//! `CONVERGENCE_TIMEOUT`, past which something is broken): on a loaded 2-core machine with
//! debug binaries it is noise. The figures (targets 2 s) are in BENCHMARKS.md#membership,
//! from this test's `--nocapture` output and the
//! commands of `node/MESH-NOTES.md`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kvmesh_tests::certs::ClusterCa;
use kvmesh_tests::{
    CONVERGENCE_TIMEOUT, Call, Cluster, EngineConfig, NodeSpec, SidecarConfig, call,
    every_call_served_by, holds_during, try_call, wait_for,
};

#[test]
fn a_fourth_node_joins_through_the_seeds_and_serves() {
    let mut cluster = Cluster::start(&[
        NodeSpec::new("a", &["shared", "only-a"]),
        NodeSpec::new("b", &["shared"]),
        NodeSpec::new("c", &["shared"]),
    ]);
    cluster.wait_membership(&["a", "b", "c"], CONVERGENCE_TIMEOUT);
    cluster.wait_models(&["a", "b", "c"], &["only-a", "shared"], CONVERGENCE_TIMEOUT);

    // `join` seeds d with the mesh addresses of a, b and c and returns once d is ready.
    cluster.join(&NodeSpec::new("d", &["shared", "only-d"]));
    let ready = Instant::now();
    let d = cluster.sidecar("d");

    // Inbound: every old node forwards requests for d's model to d.
    let (inbound, _) = wait_for(
        CONVERGENCE_TIMEOUT,
        "a, b and c forward only-d to d",
        || {
            for entry in ["a", "b", "c"] {
                let served = try_call(cluster.sidecar(entry), Call::Completion, "only-d", "join")?;
                if served.node != "d" {
                    return Err(format!(
                        "only-d entering at {entry} served by {}",
                        served.node
                    ));
                }
            }
            Ok(ready.elapsed())
        },
    );
    // Outbound: d forwards requests for a's model to a.
    let (outbound, _) = wait_for(CONVERGENCE_TIMEOUT, "d forwards only-a to a", || {
        let served = try_call(d, Call::Completion, "only-a", "join")?;
        match served.node.as_str() {
            "a" => Ok(ready.elapsed()),
            other => Err(format!("only-a entering at d served by {other}")),
        }
    });
    cluster.wait_membership(&["a", "b", "c", "d"], CONVERGENCE_TIMEOUT);
    let membership = ready.elapsed();
    println!(
        "after d was ready: served traffic from the others in {inbound:?}, forwarded to a in \
         {outbound:?}, full membership on all four nodes in {membership:?}"
    );

    // From now on every kind of call works in both directions.
    for kind in Call::ALL {
        assert_eq!(
            call(cluster.sidecar("b"), kind, "only-d", "joined").node,
            "d"
        );
        assert_eq!(call(d, kind, "only-a", "joined").node, "a");
        call(d, kind, "shared", "joined");
    }
}

/// What sequential traffic saw while a death was being detected.
#[derive(Default)]
struct DetectionWindow {
    succeeded: usize,
    failures: Vec<String>,
    slowest: Duration,
}

#[test]
fn a_killed_sidecar_is_dropped_and_then_no_request_fails() {
    let mut cluster = Cluster::start(&[
        NodeSpec::new("a", &["shared"]),
        NodeSpec::new("b", &["shared"]),
        NodeSpec::new("c", &["shared"]),
    ]);
    cluster.wait_membership(&["a", "b", "c"], CONVERGENCE_TIMEOUT);
    for entry in ["a", "b", "c"] {
        call(cluster.sidecar(entry), Call::Completion, "shared", "before");
    }

    let killed_at = Instant::now();
    cluster.node_mut("c").sidecar.kill9();
    let cluster = &cluster;

    // Until the survivors notice, traffic is recorded (and printed), not judged.
    let stop = AtomicBool::new(false);
    let (detection, window) = std::thread::scope(|scope| {
        let traffic = scope.spawn(|| {
            let mut window = DetectionWindow::default();
            for round in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let entry = if round % 2 == 0 { "a" } else { "b" };
                let kind = Call::ALL[round % 4];
                let started = Instant::now();
                let outcome = try_call(cluster.sidecar(entry), kind, "shared", "during detection");
                window.slowest = window.slowest.max(started.elapsed());
                match outcome {
                    Ok(served) if served.node != "c" => window.succeeded += 1,
                    Ok(served) => window
                        .failures
                        .push(format!("served by the dead node: {served:?}")),
                    Err(problem) => window.failures.push(problem),
                }
            }
            window
        });
        cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);
        let detection = killed_at.elapsed();
        stop.store(true, Ordering::Relaxed);
        (detection, traffic.join().expect("traffic thread"))
    });
    println!(
        "kill -9 of c detected by a and b after {detection:?}; meanwhile {} requests \
         succeeded and {} failed{}; the slowest took {:?}",
        window.succeeded,
        window.failures.len(),
        window
            .failures
            .first()
            .map(|first| format!(", first: {first}"))
            .unwrap_or_default(),
        window.slowest,
    );

    // After detection, not one request fails.
    let entries = [cluster.sidecar("a"), cluster.sidecar("b")];
    let served_by = every_call_served_by(&entries, "shared", 5, &["a", "b"]);
    println!("40 requests after detection served by {served_by:?}");
    for entry in ["a", "b"] {
        let sidecar = cluster.sidecar(entry);
        wait_for(
            CONVERGENCE_TIMEOUT,
            "kvmesh_mesh_peers_alive drops to 1",
            || match sidecar.metric("kvmesh_mesh_peers_alive", &[])? {
                Some(1.0) => Ok(()),
                other => Err(format!("{entry}: {other:?}")),
            },
        );
    }
}

#[test]
fn a_sidecar_with_a_foreign_certificate_is_shut_out() {
    let cluster = Cluster::start(&[
        NodeSpec::new("a", &["shared", "only-a"]),
        NodeSpec::new("b", &["shared"]),
    ]);
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);
    cluster.wait_models(&["a", "b"], &["only-a", "shared"], CONVERGENCE_TIMEOUT);

    // Same cluster id, same node-naming scheme, right seeds: only the CA differs.
    let foreign_ca = ClusterCa::init(cluster.ca().cluster_id());
    let mut foreign_engine = EngineConfig::new("engine f", &["shared", "only-f"]).start();
    let seeds = [
        cluster.sidecar("a").mesh_addr(),
        cluster.sidecar("b").mesh_addr(),
    ];
    let foreign = SidecarConfig::new("f", &foreign_engine.url(), &foreign_ca)
        .seeds(&seeds)
        .start();

    // Several gossip rounds: f never shows up, sees nobody, and adds no model.
    holds_during(
        Duration::from_secs(3),
        "f stays outside the cluster",
        || {
            for (member, other) in [("a", "b"), ("b", "a")] {
                let peers = cluster.sidecar(member).peer_ids()?;
                if peers != [other] {
                    return Err(format!("{member} lists {peers:?}"));
                }
                let models = cluster.sidecar(member).model_ids()?;
                if models != ["only-a", "shared"] {
                    return Err(format!("{member} lists models {models:?}"));
                }
            }
            match foreign.peer_ids()? {
                peers if peers.is_empty() => Ok(()),
                peers => Err(format!("f lists {peers:?}")),
            }
        },
    );

    // The cluster never sends f anything, even though f's engine serves `shared` too.
    for entry in ["a", "b"] {
        for kind in Call::ALL {
            let served = call(cluster.sidecar(entry), kind, "shared", "members only");
            assert!(
                served.node == "a" || served.node == "b",
                "served by {served:?}"
            );
        }
        let response =
            cluster
                .sidecar(entry)
                .send(Call::Completion.request("only-f", "foreign model", 4));
        assert_eq!(
            response.status,
            404,
            "only-f via {entry}: {}",
            response.describe()
        );
    }
    assert_eq!(
        foreign_engine.finished_requests(),
        0.0,
        "f's engine got cluster traffic"
    );

    // And f cannot forward into the cluster: a's model is unknown to it ...
    let a_finished = cluster.node("a").engine.finished_requests();
    let response = foreign.send(Call::Completion.request("only-a", "let me in", 4));
    assert!(
        response.status == 404 || response.status == 503,
        "only-a via f: {}",
        response.describe()
    );
    // ... and once its own engine is gone it has no target at all.
    foreign_engine.kill9();
    let what = "f answers 503 without its engine (and never forwards)";
    wait_for(CONVERGENCE_TIMEOUT, what, || {
        let response = foreign.send(Call::Completion.request("shared", "let me in", 4));
        match response.status {
            503 => Ok(()),
            200 => panic!("f got an answer from someone else: {}", response.describe()),
            _ => Err(response.describe()),
        }
    });
    assert_eq!(cluster.node("a").engine.finished_requests(), a_finished);
}
