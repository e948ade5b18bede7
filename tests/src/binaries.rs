//! Locating the `kvmesh` and `kvmesh-sim` executables the tests start.
//!
//! The tests do not build anything themselves: `scripts/test.sh` runs
//! `cargo build --workspace --bins` before the tests, and a missing binary is reported with that
//! command rather than silently rebuilt (a build inside a test would hold the cargo lock and blow
//! every time bound).

use std::path::{Path, PathBuf};

/// The sidecar binary (package kvmesh-node).
pub const KVMESH: Binary = Binary {
    file_name: "kvmesh",
    env_var: "KVMESH_BIN",
};
/// The mock engine binary (package kvmesh-sim).
pub const KVMESH_SIM: Binary = Binary {
    file_name: "kvmesh-sim",
    env_var: "KVMESH_SIM_BIN",
};

/// A workspace binary and the environment variable that overrides where it is found.
#[derive(Debug, Clone, Copy)]
pub struct Binary {
    pub file_name: &'static str,
    pub env_var: &'static str,
}

impl Binary {
    /// The path of the executable, or a panic that says how to build it.
    ///
    /// Looked up in order: the override environment variable; the profile directory of the
    /// running test executable (`<target>/<profile>/deps/<test>` → `<target>/<profile>`), which
    /// follows `CARGO_TARGET_DIR` and `--release` by construction; `$CARGO_TARGET_DIR/debug`;
    /// `<workspace>/target/debug`.
    pub fn path(&self) -> PathBuf {
        if let Some(explicit) = std::env::var_os(self.env_var) {
            let explicit = PathBuf::from(explicit);
            assert!(
                explicit.is_file(),
                "{}={} does not name a file",
                self.env_var,
                explicit.display()
            );
            return explicit;
        }
        let candidates = self.candidates();
        if let Some(found) = candidates.iter().find(|path| path.is_file()) {
            return found.clone();
        }
        let tried: Vec<String> = candidates
            .iter()
            .map(|path| path.display().to_string())
            .collect();
        panic!(
            "the `{}` binary was not found (tried {}); run `cargo build --workspace --bins` \
             first, or set {} to its path",
            self.file_name,
            tried.join(", "),
            self.env_var
        );
    }

    fn candidates(&self) -> Vec<PathBuf> {
        let file_name = format!("{}{}", self.file_name, std::env::consts::EXE_SUFFIX);
        let mut dirs = Vec::new();
        if let Some(profile_dir) = test_profile_dir() {
            dirs.push(profile_dir);
        }
        let workspace = workspace_root();
        if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
            let target = PathBuf::from(target);
            let target = if target.is_absolute() {
                target
            } else {
                workspace.join(target)
            };
            dirs.push(target.join("debug"));
        }
        dirs.push(workspace.join("target").join("debug"));
        dirs.dedup();
        dirs.into_iter().map(|dir| dir.join(&file_name)).collect()
    }
}

/// `<workspace>`: the parent of this crate's manifest directory.
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// `<target>/<profile>` when the running executable sits in `<target>/<profile>/deps/`, as cargo
/// places test executables.
fn test_profile_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    if deps.file_name()? != "deps" {
        return None;
    }
    deps.parent().map(Path::to_path_buf)
}
