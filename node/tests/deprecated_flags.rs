//! `kvmesh serve`'s deprecated names, through the real process and its real environment (a
//! unit test cannot set a variable safely): `--policy` and `KVMESH_POLICY`, the score form's
//! names before `--route-form`, still parse and log a warning naming the new flag.

use std::process::Command;

/// `kvmesh serve` with `args` and `env`, without this environment's `KVMESH_*`: its stderr.
/// No `--tls-dir`, so it stops after reading its options.
fn serve_stderr(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kvmesh"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("KVMESH_") {
            command.env_remove(name);
        }
    }
    let output = command
        .arg("serve")
        .args(["--backend", "http://127.0.0.1:9"])
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .output()
        .expect("kvmesh runs");
    assert!(!output.status.success(), "no --tls-dir: it exits");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn the_old_names_of_the_route_form_parse_and_warn() {
    let deprecated = "use --route-form (KVMESH_ROUTE_FORM";
    for stderr in [
        serve_stderr(&["--policy", "cost"], &[]),
        serve_stderr(&[], &[("KVMESH_POLICY", "cost")]),
    ] {
        assert!(stderr.contains(deprecated), "{stderr}");
        assert!(stderr.contains("--tls-dir is required"), "{stderr}");
    }
    for stderr in [
        serve_stderr(&["--route-form", "cost"], &[]),
        serve_stderr(&[], &[("KVMESH_ROUTE_FORM", "cost")]),
    ] {
        assert!(!stderr.contains("deprecated"), "{stderr}");
        assert!(stderr.contains("--tls-dir is required"), "{stderr}");
    }
    let stderr = serve_stderr(&[], &[("KVMESH_POLICY", "fastest")]);
    assert!(
        stderr.contains("KVMESH_POLICY") || stderr.contains("--policy"),
        "a bad value is still refused: {stderr}"
    );
}
