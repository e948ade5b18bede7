//! Certificates over time (issue 18), over real processes and real QUIC:
//! - a node's certificate is rotated on disk to one from a second CA, which every node
//!   trusts through a two-CA bundle appended with `kvmesh cert trust`: every node reloads
//!   without a restart, established connections stay, forwarding carries on, and a newcomer
//!   that trusts only the new CA reaches the rotated node (so its new handshakes present the
//!   new certificate); a corrupt bundle is refused and the old one kept;
//! - a node revoked with `kvmesh cert revoke` is cut off once the others have the new CRL:
//!   they close its connections and refuse its new ones, it can no longer forward to them,
//!   while the rest of the mesh keeps working;
//! - a node whose certificate has expired is refused, and the log says "expired" and names
//!   its address.

use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant};

use kvmesh_tests::certs::{ClusterCa, kvmesh_cert};
use kvmesh_tests::openai::served_by;
use kvmesh_tests::{
    CONVERGENCE_TIMEOUT, Call, Cluster, NodeSpec, Sidecar, SidecarConfig, holds_during, wait_for,
};

/// The nodes' TLS poll period in these tests (2 s by default).
const RELOAD_MS: &str = "200";
/// Bound on a node noticing a changed file: many poll periods on a busy machine.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Node `name` whose engine serves model `model-NAME` only, so a request for another node's
/// model must be forwarded there.
fn spec(name: &str, extra: &[&str]) -> NodeSpec {
    let mut args = vec!["--tls-reload-interval-ms", RELOAD_MS];
    args.extend_from_slice(extra);
    NodeSpec::new(name, &[&format!("model-{name}")]).sidecar_args(&args)
}

/// Who served a completion for `model-OWNER` entering at `entry`; `Err` says what came back.
fn served(entry: &Sidecar, owner: &str) -> Result<String, String> {
    let model = format!("model-{owner}");
    let response = entry
        .try_send(Call::Completion.request(&model, "certificates over time", 4))
        .map_err(|e| e.to_string())?;
    if response.status != 200 {
        return Err(response.describe());
    }
    Ok(served_by(&response))
}

/// Waits until a request for `owner`'s model entering at `entry` is served by `owner`.
fn wait_forwarded(entry: &Sidecar, owner: &str) -> Duration {
    let what = format!("{} forwards to {owner}", entry.node_id());
    wait_for(CONVERGENCE_TIMEOUT, &what, || match served(entry, owner)? {
        node if node == owner => Ok(()),
        node => Err(format!("served by {node}")),
    })
    .1
}

fn metric(sidecar: &Sidecar, name: &str, labels: &[(&str, &str)]) -> f64 {
    sidecar
        .metric(name, labels)
        .unwrap_or_else(|e| panic!("{}: /metrics: {e}", sidecar.node_id()))
        .unwrap_or_else(|| panic!("{}: no metric {name}", sidecar.node_id()))
}

fn reloads(sidecar: &Sidecar, outcome: &str) -> f64 {
    metric(sidecar, "kvmesh_tls_reloads_total", &[("outcome", outcome)])
}

/// Waits until `sidecar` has counted more than `before` reloads with `outcome`; how long.
fn wait_reload(sidecar: &Sidecar, outcome: &str, before: f64) -> Duration {
    let what = format!("{} counts a reload {outcome}", sidecar.node_id());
    wait_for(RELOAD_TIMEOUT, &what, || match reloads(sidecar, outcome) {
        n if n > before => Ok(()),
        n => Err(format!("{n} reloads {outcome}")),
    })
    .1
}

/// Replaces `to` with `from`'s contents the way operators and tools do: write beside it,
/// then rename over it.
fn install(from: &Path, to: &Path) {
    let temp = to.with_extension("incoming");
    std::fs::copy(from, &temp).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    std::fs::rename(&temp, to).unwrap_or_else(|e| panic!("rename to {}: {e}", to.display()));
}

fn os(path: &Path) -> &OsStr {
    path.as_os_str()
}

#[test]
fn a_node_rotates_to_a_second_ca_without_a_restart() {
    let cluster = Cluster::start(&[spec("a", &[]), spec("b", &[]), spec("c", &[])]);
    cluster.wait_membership(&["a", "b", "c"], CONVERGENCE_TIMEOUT);
    wait_forwarded(cluster.sidecar("b"), "a");
    let names = ["a", "b", "c"];

    // Phase 1: every node trusts the new CA as well as the old one.
    let new_ca = ClusterCa::init(cluster.ca().cluster_id());
    let started = Instant::now();
    for name in names {
        let bundle = cluster.ca().node_dir(name).join("ca.pem");
        let printed = kvmesh_cert(&[
            OsStr::new("trust"),
            OsStr::new("--bundle"),
            os(&bundle),
            OsStr::new("--ca"),
            os(&new_ca.ca_dir().join("ca.pem")),
        ]);
        assert!(printed.contains("trusts 2 CA"), "{printed}");
    }
    for name in names {
        wait_reload(cluster.sidecar(name), "ok", 0.0);
    }
    eprintln!(
        "bundle reloaded on 3 nodes within {:?} of the first write (poll every {RELOAD_MS} ms)",
        started.elapsed()
    );
    let opened_before: Vec<f64> = names
        .iter()
        .map(|name| {
            metric(
                cluster.sidecar(name),
                "kvmesh_mesh_connections_opened_total",
                &[],
            )
        })
        .collect();

    // Phase 2: a's certificate and key are replaced by ones from the new CA, key first.
    let issued = new_ca.issue("a");
    let a_dir = cluster.ca().node_dir("a");
    let started = Instant::now();
    install(&issued.join("a.key"), &a_dir.join("a.key"));
    install(&issued.join("a.pem"), &a_dir.join("a.pem"));
    let a = cluster.sidecar("a");
    wait_for(
        RELOAD_TIMEOUT,
        "a reloads its new certificate",
        || match reloads(a, "ok") {
            n if n >= 2.0 => Ok(()),
            n => Err(format!("{n} reloads ok")),
        },
    );
    eprintln!(
        "rotated certificate in use {:?} after the key was written",
        started.elapsed()
    );
    let expiry = metric(a, "kvmesh_tls_certificate_expiry_timestamp_seconds", &[]);
    assert!(expiry > 0.0, "a exports its certificate's expiry");

    // The mesh keeps exchanging and forwarding over the connections it had: none closed,
    // none redialed.
    holds_during(Duration::from_secs(2), "the mesh serves across", || {
        for (entry, owner) in [("b", "a"), ("a", "c"), ("c", "b")] {
            let node = served(cluster.sidecar(entry), owner)?;
            if node != owner {
                return Err(format!("{entry} → {owner} served by {node}"));
            }
        }
        Ok(())
    });
    cluster.wait_membership(&names, CONVERGENCE_TIMEOUT);
    for (name, before) in names.iter().zip(&opened_before) {
        let sidecar = cluster.sidecar(name);
        assert_eq!(
            metric(sidecar, "kvmesh_mesh_connections_opened_total", &[]),
            *before,
            "{name} redialed a peer: an established connection was dropped"
        );
        assert_eq!(
            metric(sidecar, "kvmesh_mesh_connections_untrusted_total", &[]),
            0.0,
            "{name} closed a connection as untrusted"
        );
    }

    // Phase 3: a newcomer that trusts only the new CA reaches a, which must therefore
    // present its new certificate in new handshakes.
    let engine = kvmesh_tests::EngineConfig::new("engine d", &["model-d"]).start();
    let mut d = SidecarConfig::new("d", &engine.url(), &new_ca)
        .seeds(&[cluster.sidecar("a").mesh_addr()])
        .arg("--tls-reload-interval-ms")
        .arg("3600000")
        .start();
    wait_forwarded(&d, "a");
    wait_forwarded(cluster.sidecar("a"), "d");
    // d polls its files once an hour: SIGHUP reloads them at once.
    let started = Instant::now();
    d.process().sighup();
    wait_reload(&d, "ok", 0.0);
    eprintln!("SIGHUP reload counted within {:?}", started.elapsed());
    assert!(
        d.output_contains("reason=\"SIGHUP\""),
        "{}",
        d.output_tail(5)
    );
    wait_forwarded(&d, "a");

    // Phase 4: a corrupt bundle is refused, counted, and the old material kept.
    let c = cluster.sidecar("c");
    let c_bundle = cluster.ca().node_dir("c").join("ca.pem");
    let good = std::fs::read(&c_bundle).expect("read c's bundle");
    let junk = c_bundle.with_extension("junk");
    std::fs::write(&junk, "-----BEGIN CERTIFICATE-----\nnot base64\n").expect("write junk");
    install(&junk, &c_bundle);
    wait_reload(c, "failed", 0.0);
    assert!(
        c.output_contains("TLS reload failed; keeping the current certificate"),
        "the failed reload is logged"
    );
    wait_forwarded(c, "a");
    wait_forwarded(cluster.sidecar("b"), "c");
    std::fs::write(&junk, good).expect("write the good bundle back");
    install(&junk, &c_bundle);
    wait_reload(c, "ok", reloads(c, "ok"));
    drop(d);
}

#[test]
fn a_revoked_node_is_cut_off_and_the_rest_carries_on() {
    // An empty CRL at first, one copy per node (as distributed to each host).
    let mut cluster = Cluster::empty();
    let crl = cluster.ca().ca_dir().join("crl.pem");
    let printed = kvmesh_cert(&[
        OsStr::new("crl"),
        OsStr::new("--dir"),
        os(&cluster.ca().ca_dir()),
    ]);
    assert!(printed.contains("0 revoked"), "{printed}");
    let names = ["a", "b", "c"];
    let node_crl = |ca: &ClusterCa, name: &str| ca.node_dir(name).join("crl.pem");
    for name in names {
        std::fs::create_dir_all(cluster.ca().node_dir(name)).expect("node dir");
        install(&crl, &node_crl(cluster.ca(), name));
        let path = node_crl(cluster.ca(), name);
        let flag = path.to_str().expect("a UTF-8 path");
        cluster.join(&spec(name, &["--crl", flag]));
    }
    cluster.wait_membership(&names, CONVERGENCE_TIMEOUT);
    wait_forwarded(cluster.sidecar("c"), "a");
    wait_forwarded(cluster.sidecar("a"), "c");

    let printed = kvmesh_cert(&[
        OsStr::new("revoke"),
        OsStr::new("--dir"),
        os(&cluster.ca().ca_dir()),
        OsStr::new("--node"),
        OsStr::new("c"),
        OsStr::new("--cert"),
        os(&cluster.ca().node_dir("c").join("c.pem")),
    ]);
    assert!(
        printed.contains("revoked") && printed.contains("1 revoked"),
        "{printed}"
    );
    let started = Instant::now();
    for name in ["a", "b"] {
        install(&crl, &node_crl(cluster.ca(), name));
    }

    // a and b drop c; c loses both.
    let what = "a and b see only each other, c sees nobody";
    wait_for(CONVERGENCE_TIMEOUT, what, || {
        let a = cluster.sidecar("a").peer_ids()?;
        let b = cluster.sidecar("b").peer_ids()?;
        let c = cluster.sidecar("c").peer_ids()?;
        match (a == ["b"], b == ["a"], c.is_empty()) {
            (true, true, true) => Ok(()),
            _ => Err(format!("a: {a:?}, b: {b:?}, c: {c:?}")),
        }
    });
    eprintln!(
        "revoked node cut off {:?} after the CRL was installed",
        started.elapsed()
    );
    // Requests entering at c can no longer reach a or b; a and b still forward to each other.
    for owner in ["a", "b"] {
        match served(cluster.sidecar("c"), owner) {
            Ok(node) => panic!("c still forwarded a request for model-{owner} to {node}"),
            Err(answer) => assert!(!answer.is_empty()),
        }
    }
    wait_forwarded(cluster.sidecar("a"), "b");
    wait_forwarded(cluster.sidecar("b"), "a");
    // Once cut off, it stays out: its redials are refused at every handshake.
    holds_during(Duration::from_secs(3), "c stays cut off", || {
        let a = cluster.sidecar("a").peer_ids()?;
        match a == ["b"] {
            true => Ok(()),
            false => Err(format!("a lists {a:?}")),
        }
    });
    let a = cluster.sidecar("a");
    let cut = metric(a, "kvmesh_mesh_connections_untrusted_total", &[])
        + metric(a, "kvmesh_mesh_handshakes_rejected_total", &[]);
    assert!(cut >= 1.0, "a neither closed nor refused c");
    let b = cluster.sidecar("b");
    assert!(
        [a, b]
            .iter()
            .any(|node| node.output_contains("certificate revoked")),
        "no log line names the revocation"
    );
}

#[test]
fn an_expired_certificate_is_refused_and_the_log_says_so() {
    let cluster = Cluster::start(&[spec("a", &[]), spec("b", &[])]);
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);

    // Valid for two seconds (and from an hour ago): expired by the time it is used.
    let issued_at = Instant::now();
    let dir = cluster.ca().issue_with("e", &["--seconds", "2"]);
    let engine = kvmesh_tests::EngineConfig::new("engine e", &["model-e"]).start();
    wait_for(
        Duration::from_secs(10),
        "the certificate expires",
        || match issued_at.elapsed() > Duration::from_secs(3) {
            true => Ok(()),
            false => Err(String::new()),
        },
    );
    let e = SidecarConfig::with_tls_dir("e", &engine.url(), cluster.ca(), dir)
        .seeds(&[cluster.sidecar("a").mesh_addr()])
        .start();
    assert!(
        e.output_contains("certificate has expired"),
        "the node says its own certificate expired"
    );

    let address = e.mesh_addr().to_string();
    let a = cluster.sidecar("a");
    let (line, _) = wait_for(CONVERGENCE_TIMEOUT, "a logs why it refused e", || {
        a.output_tail(1000)
            .lines()
            .find(|line| line.contains("expired") && line.contains(&address))
            .map(str::to_owned)
            .ok_or_else(|| a.output_tail(5))
    });
    eprintln!("a logged: {line}");
    assert!(metric(a, "kvmesh_mesh_handshakes_rejected_total", &[]) >= 1.0);
    holds_during(Duration::from_secs(3), "e stays out of the mesh", || {
        let seen_by_a = cluster.sidecar("a").peer_ids()?;
        let seen_by_e = e.peer_ids()?;
        match (seen_by_a == ["b"], seen_by_e.is_empty()) {
            (true, true) => Ok(()),
            _ => Err(format!("a: {seen_by_a:?}, e: {seen_by_e:?}")),
        }
    });
    assert!(
        served(&e, "a").is_err(),
        "e forwarded with an expired certificate"
    );
}
