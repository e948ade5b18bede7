//! An engine that stalls (SIGSTOP: a hung GPU, a long pause) and one that crashes and comes
//! back on its port, while clients keep sending through the other nodes: no request is lost
//! (they are not streamed, so none has started when its engine goes), the node stops being a
//! target while its engine is unhealthy, and it serves again once its engine is back. The
//! detection times are printed; RELIABILITY.md has them.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kvmesh_tests::process::send_signal;
use kvmesh_tests::sidecar::peer_entry;
use kvmesh_tests::{
    CONVERGENCE_TIMEOUT, Call, Cluster, EngineConfig, NodeSpec, Sidecar, call, try_call, wait_for,
};

const NODES: [&str; 3] = ["a", "b", "c"];
const MODEL: &str = "shared";

/// Whether `observer` believes `peer`'s engine healthy, by the digest it holds.
fn believes_healthy(observer: &Sidecar, peer: &str) -> Result<bool, String> {
    let cluster = observer.debug_cluster()?;
    peer_entry(&cluster, peer)
        .and_then(|p| p["digest"]["healthy"].as_bool())
        .ok_or_else(|| format!("no digest of {peer} at {}", observer.node_id()))
}

/// Waits until both other nodes believe `b`'s engine is `healthy`; returns how long it took.
fn until_b_is(cluster: &Cluster, healthy: bool) -> Duration {
    let what = format!("a and c to see b's engine healthy={healthy}");
    wait_for(CONVERGENCE_TIMEOUT, &what, || {
        for observer in ["a", "c"] {
            if believes_healthy(cluster.sidecar(observer), "b")? != healthy {
                return Err(format!("{observer} does not yet"));
            }
        }
        Ok(())
    })
    .1
}

/// Sends fresh prompts through a until one is served by b.
fn until_b_serves(cluster: &Cluster, label: &str) {
    let mut n = 0;
    wait_for(
        CONVERGENCE_TIMEOUT,
        &format!("b to serve again ({label})"),
        || {
            n += 1;
            let served = try_call(
                cluster.sidecar("a"),
                Call::Completion,
                MODEL,
                &format!("{label} {n}"),
            )?;
            match served.node.as_str() {
                "b" => Ok(()),
                other => Err(format!("served by {other}")),
            }
        },
    );
}

/// Sends `signal` to b's engine, a child of this test that is not reaped yet.
fn signal(pid: u32, signal: &str) {
    let status = send_signal(pid, signal).expect("kill runs");
    assert!(status.success(), "kill -{signal} {pid}");
}

#[test]
fn a_stalling_and_a_crashing_engine_lose_no_request_and_stop_being_targets() {
    let mut cluster = Cluster::start(&NODES.map(|n| NodeSpec::new(n, &[MODEL])));
    cluster.wait_membership(&NODES, CONVERGENCE_TIMEOUT);
    for entry in NODES {
        call(cluster.sidecar(entry), Call::Completion, MODEL, "before");
    }
    let engine = &mut cluster.node_mut("b").engine;
    let (port, pid) = (engine.addr().port(), engine.process().pid());
    let cluster = &cluster;

    // Clients keep sending through a and c the whole time; every failure is kept.
    let stop = AtomicBool::new(false);
    let failures = Mutex::new(Vec::<String>::new());
    let sent = Mutex::new(0usize);
    let restarted = std::thread::scope(|scope| {
        for entry in ["a", "c"] {
            let (stop, failures, sent) = (&stop, &failures, &sent);
            scope.spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let prompt = format!("traffic {entry} {n}");
                    let result = try_call(cluster.sidecar(entry), Call::Completion, MODEL, &prompt);
                    *sent.lock().expect("count") += 1;
                    if let Err(problem) = result {
                        failures.lock().expect("failures").push(problem);
                    }
                }
            });
        }

        // A stall: requests already at b's engine wait for it; new ones go elsewhere once
        // b's sidecar finds its engine unresponsive.
        signal(pid, "STOP");
        let stall_detected = until_b_is(cluster, false);
        for entry in ["a", "c"] {
            for n in 0..4 {
                let served = call(
                    cluster.sidecar(entry),
                    Call::Completion,
                    MODEL,
                    &format!("stalled {n}"),
                );
                assert_ne!(
                    served.node, "b",
                    "b is a target while its engine is stalled"
                );
            }
        }
        signal(pid, "CONT");
        let stall_recovered = until_b_is(cluster, true);
        until_b_serves(cluster, "after the stall");

        // A crash, and the engine back on its port.
        signal(pid, "KILL");
        let crash_detected = until_b_is(cluster, false);
        let restarted = EngineConfig::new("engine b again", &[MODEL])
            .port(port)
            .start();
        let crash_recovered = until_b_is(cluster, true);
        until_b_serves(cluster, "after the crash");
        stop.store(true, Ordering::Relaxed);
        println!(
            "stall: b unhealthy at a and c after {stall_detected:?}, healthy again {stall_recovered:?} \
             after SIGCONT; crash: unhealthy after {crash_detected:?}, healthy {crash_recovered:?} \
             after the restart"
        );
        restarted
    });
    let failures = failures.into_inner().expect("failures");
    let sent = sent.into_inner().expect("count");
    println!(
        "{sent} requests during the faults, {} failed",
        failures.len()
    );
    assert!(failures.is_empty(), "requests lost: {failures:#?}");
    assert!(
        sent > 20,
        "only {sent} requests were sent during the faults"
    );
    drop(restarted);
}
