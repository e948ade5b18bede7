//! The Kubernetes manifests (`deploy/kubernetes`) against the binary they deploy.
//!
//! For the base and every overlay, as `kubectl kustomize` renders them: every `kvmesh serve`
//! setting they pass is one the binary knows; ports, Service names and probe ports agree; vLLM's
//! flags agree with kvmesh's (block size, KV-event endpoints and topic, engine port); the
//! termination timings nest (kvmesh drains before vLLM stops, both before the grace period
//! ends, liveness never fires during a drain). Then a sidecar started with the manifest's own
//! environment and the certificates `make-certs.sh` made answers 200 on the manifest's probe
//! paths and applies the KV events of an engine started with the manifest's vLLM settings.
//!
//! Needs `kubectl` (for `kubectl kustomize`): see [`kvmesh_tests::tools`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use kvmesh_protocol::prometheus_text;
use kvmesh_tests::binaries::{KVMESH, workspace_root};
use kvmesh_tests::certs::ClusterCa;
use kvmesh_tests::tools::skipped_for_lack_of;
use kvmesh_tests::{Call, EngineConfig, SidecarConfig, call, wait_for};
use serde::Deserialize as _;
use serde_json::Value;

const KUSTOMIZATIONS: [&str; 3] = ["base", "overlays/example", "overlays/mock"];
/// What the live sidecar's probes and KV events get to answer.
const LIVE_TIMEOUT: Duration = Duration::from_secs(30);

fn deploy_dir() -> PathBuf {
    workspace_root().join("deploy").join("kubernetes")
}

/// `kubectl kustomize DIR`, every document as JSON.
fn render(kustomization: &str) -> Vec<Value> {
    let dir = deploy_dir().join(kustomization);
    let output = Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run `kubectl kustomize` ({e}): install kubectl (scripts/test.sh does)")
        });
    assert!(
        output.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("kustomize prints UTF-8");
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|document| {
            let yaml = serde_yaml_ng::Value::deserialize(document).expect("valid YAML");
            serde_json::to_value(yaml).expect("YAML maps to JSON")
        })
        .collect()
}

/// The rendered manifests of one kustomization, and lookups into them.
struct Manifests {
    name: &'static str,
    docs: Vec<Value>,
}

impl Manifests {
    fn one(&self, kind: &str) -> &Value {
        let found: Vec<&Value> = self.docs.iter().filter(|d| d["kind"] == kind).collect();
        assert_eq!(found.len(), 1, "{}: one {kind} expected", self.name);
        found[0]
    }

    fn services(&self) -> Vec<&Value> {
        self.docs
            .iter()
            .filter(|d| d["kind"] == "Service")
            .collect()
    }

    fn statefulset(&self) -> &Value {
        self.one("StatefulSet")
    }

    fn container(&self, name: &str) -> &Value {
        self.statefulset()["spec"]["template"]["spec"]["containers"]
            .as_array()
            .expect("containers")
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("{}: no container {name}", self.name))
    }

    fn config_map_value(&self, map: &str, key: &str) -> String {
        let map = self
            .docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == map)
            .unwrap_or_else(|| panic!("{}: no ConfigMap {map}", self.name));
        map["data"][key]
            .as_str()
            .unwrap_or_else(|| panic!("{}: ConfigMap {map} has no {key}", self.name))
            .to_string()
    }

    fn pod_name(&self) -> String {
        format!("{}-0", str_at(self.statefulset(), "/metadata/name"))
    }

    /// A container's environment as the kubelet would set it for pod NAME-0 with IP
    /// 127.0.0.1: ConfigMap references looked up, `$(VAR)` expanded from earlier variables.
    fn env(&self, container: &str) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        let entries = self.container(container)["env"].as_array().cloned();
        for entry in entries.unwrap_or_default() {
            let name = str_at(&entry, "/name").to_string();
            let value = if let Some(value) = entry["value"].as_str() {
                expand(value, &env)
            } else if let Some(field) = entry.pointer("/valueFrom/fieldRef/fieldPath") {
                match field.as_str() {
                    Some("metadata.name") => self.pod_name(),
                    Some("status.podIP") => "127.0.0.1".to_string(),
                    other => panic!("{}: env {name} from field {other:?}", self.name),
                }
            } else if let Some(reference) = entry.pointer("/valueFrom/configMapKeyRef") {
                self.config_map_value(str_at(reference, "/name"), str_at(reference, "/key"))
            } else if entry.pointer("/valueFrom/secretKeyRef").is_some() {
                continue; // optional credentials (HF_TOKEN); nothing kvmesh reads
            } else {
                panic!(
                    "{}: env {name} has no value I understand: {entry}",
                    self.name
                )
            };
            env.insert(name, value);
        }
        env
    }
}

fn str_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {pointer} in {value}"))
}

fn u64_at(value: &Value, pointer: &str) -> u64 {
    value
        .pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no integer at {pointer} in {value}"))
}

/// Kubernetes' `$(VAR)` expansion from the variables defined so far.
fn expand(text: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = text.to_string();
    for (name, value) in env {
        out = out.replace(&format!("$({name})"), value);
    }
    assert!(!out.contains("$("), "unexpanded variable in {text:?}");
    out
}

fn port_of(address: &str) -> u16 {
    address
        .rsplit(':')
        .next()
        .and_then(|port| port.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("no port in {address:?}"))
}

/// The container port named `name`, with its protocol.
fn container_port(container: &Value, name: &str) -> (u16, String) {
    let port = container["ports"]
        .as_array()
        .and_then(|ports| ports.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no port named {name} in {}", container["name"]));
    let protocol = port["protocol"].as_str().unwrap_or("TCP").to_string();
    (u64_at(port, "/containerPort") as u16, protocol)
}

/// `kvmesh serve --help`, without any KVMESH_* of this environment in it.
fn serve_help() -> String {
    let mut command = Command::new(KVMESH.path());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("KVMESH_") {
            command.env_remove(name);
        }
    }
    let output = command.args(["serve", "--help"]).output().expect("kvmesh");
    assert!(output.status.success());
    String::from_utf8(output.stdout).expect("UTF-8 help")
}

fn check_static(m: &Manifests, help: &str) {
    let kvmesh = m.container("kvmesh");
    let env = m.env("kvmesh");
    let name = m.name;

    // Every setting is one `kvmesh serve` reads (clap ignores unknown KVMESH_* variables,
    // so a misspelt one would silently do nothing).
    assert_eq!(kvmesh["args"][0], "serve", "{name}: kvmesh runs `serve`");
    for arg in kvmesh["args"].as_array().expect("args").iter().skip(1) {
        let flag = arg.as_str().expect("string arg").split('=').next().unwrap();
        assert!(
            help.contains(&format!("{flag} ")),
            "{name}: unknown flag {flag}"
        );
    }
    for variable in env.keys().filter(|v| v.starts_with("KVMESH_")) {
        assert!(
            help.contains(&format!("[env: {variable}=")),
            "{name}: `kvmesh serve` reads no {variable}"
        );
    }

    // Ports: what kvmesh listens on is what the pod declares and the Services target.
    let (http, http_protocol) = container_port(kvmesh, "http");
    let (mesh, mesh_protocol) = container_port(kvmesh, "mesh");
    assert_eq!(
        (http_protocol.as_str(), mesh_protocol.as_str()),
        ("TCP", "UDP")
    );
    assert_eq!(port_of(&env["KVMESH_LISTEN"]), http, "{name}: listen port");
    assert_eq!(port_of(&env["KVMESH_MESH"]), mesh, "{name}: mesh port");
    assert_eq!(
        port_of(&env["KVMESH_ADVERTISE"]),
        mesh,
        "{name}: advertised port"
    );
    for address in ["KVMESH_LISTEN", "KVMESH_MESH", "KVMESH_ADVERTISE"] {
        env[address]
            .parse::<std::net::SocketAddr>()
            .unwrap_or_else(|e| panic!("{name}: {address}={}: {e}", env[address]));
    }
    for (probe, path) in [
        ("readinessProbe", "/ready"),
        ("livenessProbe", "/health"),
        ("startupProbe", "/health"),
    ] {
        assert_eq!(
            str_at(kvmesh, &format!("/{probe}/httpGet/path")),
            path,
            "{name}: {probe}"
        );
        assert_eq!(
            str_at(kvmesh, &format!("/{probe}/httpGet/port")),
            "http",
            "{name}: {probe}"
        );
    }

    // Services: the seed list is the headless Service the StatefulSet names, on the mesh port.
    let statefulset = m.statefulset();
    let pod_labels = &statefulset["spec"]["template"]["metadata"]["labels"];
    let selects_pods = |selector: &Value| {
        selector
            .as_object()
            .is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| &pod_labels[k] == v))
    };
    let services = m.services();
    let headless = services
        .iter()
        .find(|s| s["spec"]["clusterIP"] == "None")
        .unwrap_or_else(|| panic!("{name}: no headless Service"));
    let headless_name = str_at(headless, "/metadata/name");
    assert_eq!(str_at(statefulset, "/spec/serviceName"), headless_name);
    assert_eq!(
        headless["spec"]["publishNotReadyAddresses"], true,
        "{name}: seeds before ready"
    );
    assert!(
        selects_pods(&headless["spec"]["selector"]),
        "{name}: headless selector"
    );
    let seeds: Vec<&str> = env["KVMESH_SEEDS"].split(',').collect();
    assert_eq!(seeds.len(), 1, "{name}: one seed, the headless Service");
    let (seed_host, seed_port) = seeds[0].rsplit_once(':').expect("HOST:PORT seed");
    assert_eq!(
        seed_host.split('.').next(),
        Some(headless_name),
        "{name}: seed host"
    );
    let seed_port: u16 = seed_port.parse().expect("seed port");
    assert!(
        headless["spec"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .any(|p| {
                p["port"] == seed_port && p["targetPort"] == "mesh" && p["protocol"] == "UDP"
            }),
        "{name}: the headless Service serves the seed port {seed_port} to the mesh port"
    );
    assert_eq!(seed_port, mesh, "{name}: seeds use the mesh port");
    let client = services
        .iter()
        .find(|s| s["spec"]["clusterIP"] != "None")
        .unwrap_or_else(|| panic!("{name}: no client Service"));
    assert!(
        selects_pods(&client["spec"]["selector"]),
        "{name}: client selector"
    );
    assert!(
        client["spec"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .any(|p| p["targetPort"] == "http"),
        "{name}: the client Service targets the sidecar's http port"
    );
    assert!(selects_pods(
        &m.one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"]
    ));

    // The engine's flags agree with kvmesh's: vLLM's, or the mock engine's in its overlay.
    let vllm = m.container("vllm");
    let vllm_env = m.env("vllm");
    let args: Vec<String> = vllm["args"]
        .as_array()
        .expect("engine args")
        .iter()
        .map(|a| expand(a.as_str().expect("string arg"), &vllm_env))
        .collect();
    let flag = |flag: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("{flag}=")))
            .unwrap_or_else(|| panic!("{name}: the engine has no {flag}=VALUE"))
            .to_string()
    };
    assert_eq!(
        flag("--block-size"),
        env["KVMESH_BLOCK_TOKENS"],
        "{name}: block size"
    );
    let engine_port: u16 = flag("--port").parse().expect("engine port");
    assert_eq!(
        port_of(&env["KVMESH_BACKEND"]),
        engine_port,
        "{name}: backend port"
    );
    assert_eq!(
        container_port(vllm, "vllm").0,
        engine_port,
        "{name}: engine's container port"
    );
    let (endpoint, replay, topic) = match vllm["command"][0].as_str() {
        Some("vllm") => {
            assert!(
                args.contains(&"--enable-prefix-caching".to_string()),
                "{name}: caching"
            );
            let events: Value = serde_json::from_str(&flag("--kv-events-config")).expect("JSON");
            assert_eq!(
                events["enable_kv_cache_events"], true,
                "{name}: KV events on"
            );
            assert_eq!(events["publisher"], "zmq", "{name}: the ZMQ publisher");
            let text = |key: &str| events[key].as_str().unwrap_or_default().to_string();
            (text("endpoint"), text("replay_endpoint"), text("topic"))
        }
        Some(command) if command.ends_with("kvmesh-sim") => {
            assert_eq!(vllm["command"][1], "engine", "{name}: kvmesh-sim engine");
            (
                flag("--kv-events"),
                flag("--kv-events-replay"),
                flag("--kv-events-topic"),
            )
        }
        other => panic!("{name}: an engine container running {other:?}"),
    };
    assert_eq!(
        endpoint, env["KVMESH_KV_EVENTS"],
        "{name}: KV-event endpoint"
    );
    assert_eq!(
        replay, env["KVMESH_KV_EVENTS_REPLAY"],
        "{name}: replay endpoint"
    );
    assert_eq!(topic, env["KVMESH_KV_EVENTS_TOPIC"], "{name}: topic");

    // Termination: kvmesh drains before vLLM stops, all within the grace period, and the
    // liveness probe cannot fire in between.
    let prestop = |c: &Value| u64_at(c, "/lifecycle/preStop/sleep/seconds");
    let drain: u64 = env["KVMESH_DRAIN_TIMEOUT_SECS"]
        .parse()
        .expect("drain seconds");
    let grace = u64_at(
        statefulset,
        "/spec/template/spec/terminationGracePeriodSeconds",
    );
    // 1 s of gossip rounds before the drain proper, 1 s to leave the mesh after it.
    let kvmesh_done = prestop(kvmesh) + 1 + drain + 1;
    assert!(
        prestop(vllm) >= kvmesh_done,
        "{name}: vLLM stops before kvmesh drained"
    );
    assert!(
        grace > prestop(vllm),
        "{name}: the grace period ends before vLLM stops"
    );
    let liveness = u64_at(kvmesh, "/livenessProbe/periodSeconds")
        * u64_at(kvmesh, "/livenessProbe/failureThreshold");
    assert!(
        liveness > grace,
        "{name}: liveness could restart a draining sidecar"
    );

    // Certificates: the Secret make-certs.sh writes, mounted where kvmesh reads it.
    let tls_volume = kvmesh["volumeMounts"]
        .as_array()
        .expect("volume mounts")
        .iter()
        .find(|v| v["mountPath"] == env["KVMESH_TLS_DIR"].as_str())
        .unwrap_or_else(|| panic!("{name}: nothing mounted at KVMESH_TLS_DIR"));
    let volume = statefulset["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == tls_volume["name"])
        .expect("the TLS volume");
    assert_eq!(
        str_at(volume, "/secret/secretName"),
        "kvmesh-tls",
        "{name}: make-certs.sh's"
    );
    assert_eq!(
        env["KVMESH_NODE_ID"],
        m.pod_name(),
        "{name}: node id is the pod name"
    );
}

/// Runs make-certs.sh for the StatefulSet and writes its Secret's files into a directory, as
/// the kubelet would mount them.
fn certificates_from_script(m: &Manifests, work: &Path) -> PathBuf {
    let statefulset = m.statefulset();
    let replicas = u64_at(statefulset, "/spec/replicas");
    let sts_name = str_at(statefulset, "/metadata/name");
    let out = work.join("ca");
    let status = Command::new(deploy_dir().join("make-certs.sh"))
        .args(["--replicas", &replicas.to_string(), "--name", sts_name])
        .arg("--out")
        .arg(&out)
        .arg("--kvmesh")
        .arg(KVMESH.path())
        .status()
        .expect("make-certs.sh runs");
    assert!(status.success(), "make-certs.sh failed");
    let text = std::fs::read_to_string(out.join("kvmesh-tls.yaml")).expect("the Secret");
    let secret: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("Secret YAML");
    let secret = serde_json::to_value(secret).expect("JSON");
    assert_eq!(secret["kind"], "Secret");
    assert_eq!(secret["metadata"]["name"], "kvmesh-tls");
    let data = secret["data"].as_object().expect("data");
    assert!(
        !data.contains_key("ca.key"),
        "the CA key must stay out of the cluster"
    );
    let tls = work.join("tls");
    std::fs::create_dir_all(&tls).expect("tls dir");
    for i in 0..replicas {
        for extension in ["pem", "key"] {
            let file = format!("{sts_name}-{i}.{extension}");
            assert!(
                data.contains_key(&file),
                "{}: no {file} in the Secret",
                m.name
            );
        }
    }
    for (file, encoded) in data {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().expect("base64 string"))
            .expect("base64");
        std::fs::write(tls.join(file), bytes).expect("write");
    }
    tls
}

fn check_live(m: &Manifests) {
    let work = tempfile::tempdir().expect("temp dir");
    let tls = certificates_from_script(m, work.path());
    let env = m.env("kvmesh");
    let vllm_env = m.env("vllm");

    // The mock engine with the manifest's model, block size and KV-event topic: for the mock
    // overlay, its engine container's own arguments (the address, port and model are the
    // harness's, the event endpoints on ephemeral ports); for vLLM, the same settings. The
    // engine connects its publisher to a loopback endpoint, as vLLM does with a host in its
    // `endpoint`, and the sidecar listens there as the manifest tells it to
    // (KVMESH_KV_EVENTS_BIND).
    assert_eq!(
        env["KVMESH_KV_EVENTS_BIND"], "true",
        "{}: vLLM connects to a loopback endpoint, so the sidecar must listen",
        m.name
    );
    let events = format!("tcp://{}", free_loopback_addr());
    let mut engine = EngineConfig::new("engine (manifest)", &[vllm_env["MODEL"].as_str()]);
    let container = m.container("vllm");
    if container["command"][0]
        .as_str()
        .is_some_and(|c| c.ends_with("kvmesh-sim"))
    {
        for arg in container["args"].as_array().expect("engine args") {
            let arg = expand(arg.as_str().expect("string arg"), &vllm_env);
            let flag = arg.split('=').next().unwrap_or_default();
            match flag {
                "--host" | "--port" | "--model" => {}
                "--kv-events" => engine = engine.arg(&format!("{flag}={events}")),
                "--kv-events-replay" => {
                    engine = engine.arg(&format!("{flag}=tcp://127.0.0.1:0"));
                }
                _ => engine = engine.arg(&arg),
            }
        }
    } else {
        engine = engine
            .arg("--block-size")
            .arg(&vllm_env["BLOCK_SIZE"])
            .arg("--kv-events")
            .arg(&events)
            .arg("--kv-events-replay")
            .arg("tcp://127.0.0.1:0")
            .arg("--kv-events-topic")
            .arg(&env["KVMESH_KV_EVENTS_TOPIC"]);
    }
    let engine = engine.start();

    // The manifest's whole environment; flags replace only what loopback and ephemeral ports
    // need (addresses, the engine's URL and event endpoints), and the join wait, since the
    // seed name does not resolve here.
    let unused_ca = ClusterCa::init("kvmesh");
    let mut config = SidecarConfig::new(&m.pod_name(), &engine.url(), &unused_ca).tls_dir(tls);
    for (variable, value) in env.iter().filter(|(v, _)| v.starts_with("KVMESH_")) {
        config = config.env(variable, value);
    }
    let sidecar = config
        .arg("--kv-events")
        .arg(&events)
        .arg("--kv-events-replay")
        .arg(&engine.printed_endpoint("kv events replay on "))
        .arg("--join-wait-secs")
        .arg("1")
        .start();

    let kvmesh = m.container("kvmesh");
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        let path = str_at(kvmesh, &format!("/{probe}/httpGet/path"));
        wait_for(LIVE_TIMEOUT, &format!("{} {probe} {path}", m.name), || {
            let response = sidecar.get(path);
            if response.status == 200 {
                Ok(())
            } else {
                Err(response.describe())
            }
        });
    }

    // Exact mode works with these settings: a request's blocks come back as KV events.
    call(
        &sidecar,
        Call::Completion,
        &vllm_env["MODEL"],
        &"a prompt ".repeat(40),
    );
    wait_for(LIVE_TIMEOUT, "KV-event batches applied", || {
        let text = sidecar.get("/metrics").text();
        match prometheus_text::sum(
            &text,
            "kvmesh_kv_event_batches_total",
            &[("outcome", "applied")],
        ) {
            Some(applied) if applied > 0.0 => Ok(()),
            other => Err(format!("applied batches: {other:?}")),
        }
    });
}

#[test]
fn manifests_agree_with_the_binary_and_with_vllm() {
    if skipped_for_lack_of("kubectl") {
        return;
    }
    let help = serve_help();
    for name in KUSTOMIZATIONS {
        let manifests = Manifests {
            name,
            docs: render(name),
        };
        check_static(&manifests, &help);
        check_live(&manifests);
    }
}

/// deploy/prometheus's Kubernetes scrape configuration finds these pods: its `keep` rules
/// name the pods' label and the port each job scrapes, on the container that serves it.
/// (Debian's promtool is built without Kubernetes discovery, so it cannot check this file.)
#[test]
fn prometheus_discovers_the_manifests_pods_and_ports() {
    if skipped_for_lack_of("kubectl") {
        return;
    }
    let manifests = Manifests {
        name: "base",
        docs: render("base"),
    };
    let path = workspace_root().join("deploy/prometheus/prometheus-kubernetes.yml");
    let text = std::fs::read_to_string(&path).expect("prometheus-kubernetes.yml");
    let config: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("YAML");
    let config = serde_json::to_value(config).expect("JSON");
    let pod_labels = &manifests.statefulset()["spec"]["template"]["metadata"]["labels"];
    let mut jobs = Vec::new();
    for scrape in config["scrape_configs"].as_array().expect("scrape_configs") {
        let job = str_at(scrape, "/job_name");
        let keep = |source: &str| -> String {
            scrape["relabel_configs"]
                .as_array()
                .expect("relabel_configs")
                .iter()
                .find(|r| r["action"] == "keep" && r["source_labels"][0] == source)
                .map(|r| str_at(r, "/regex").to_string())
                .unwrap_or_else(|| panic!("job {job}: no keep rule on {source}"))
        };
        assert_eq!(
            pod_labels["app.kubernetes.io/name"],
            keep("__meta_kubernetes_pod_label_app_kubernetes_io_name").as_str(),
            "job {job}: pod label"
        );
        // Job kvmesh scrapes the sidecar, job vllm the engine: each on its own container.
        let container = match job {
            "kvmesh" => "kvmesh",
            "vllm" => "vllm",
            other => panic!("unexpected job {other}"),
        };
        let port = keep("__meta_kubernetes_pod_container_port_name");
        container_port(manifests.container(container), &port);
        jobs.push(job.to_string());
    }
    jobs.sort();
    assert_eq!(jobs, ["kvmesh", "vllm"]);
}

/// A loopback address with a port nothing listens on now (the sidecar binds it later).
fn free_loopback_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
}
