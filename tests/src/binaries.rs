//! The workspace's binaries (`domaind`, `imex-sim`, `domaind-chaos`) for tests in other packages.
//!
//! Cargo gives an integration test the paths of its own package's binaries only
//! (`CARGO_BIN_EXE_*`), and these live in `domaind` and `domaind-testbed`. So the test has
//! cargo build them, with the cargo that runs the test, in the same profile and target
//! directory, and takes them from the directory the test binary's `deps/` sits in,
//! where cargo puts every binary of the workspace. Building rather than hoping they are
//! there keeps them from being missing (`cargo test -p domaind-e2e` builds only the
//! libraries it links) or stale. The build asked for is the README's test command
//! without running it (`cargo test --workspace --no-run`): after `cargo test
//! --workspace`, as in CI, every artifact is fresh and it costs a second. A narrower
//! build (`cargo build -p domaind`) would resolve other features for shared
//! dependencies (tests turn on tokio's test-util, for one) and rebuild half the
//! workspace next to the first.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Paths of the workspace's binaries, fresh.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub domaind: PathBuf,
    pub imex_sim: PathBuf,
    /// `domaind-chaos`, for the cluster run on real Kubernetes.
    pub chaos: PathBuf,
}

/// Builds the binaries once per test process and says where they are. Panics with
/// cargo's output when the build fails.
pub fn binaries() -> &'static Binaries {
    static BUILT: OnceLock<Binaries> = OnceLock::new();
    BUILT.get_or_init(build)
}

/// `target/<profile>/`, from `target/<profile>/deps/<test>-<hash>`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary's directory");
    assert_eq!(
        deps.file_name().and_then(|n| n.to_str()),
        Some("deps"),
        "{} is not in a cargo target's deps/",
        exe.display()
    );
    deps.parent()
        .expect("the profile directory above deps/")
        .to_path_buf()
}

fn build() -> Binaries {
    let dir = profile_dir();
    let profile = dir
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a profile directory name")
        .to_owned();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["test", "--workspace", "--no-run"]);
    match profile.as_str() {
        "debug" => {}
        "release" => {
            command.arg("--release");
        }
        other => {
            command.args(["--profile", other]);
        }
    }
    // The target directory this test was built into, whatever chose it.
    command.env(
        "CARGO_TARGET_DIR",
        dir.parent().expect("the target directory"),
    );
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_for_this_test) {
            command.env_remove(&name);
        }
    }
    let built = command.output().expect("cannot run cargo");
    assert!(
        built.status.success(),
        "building the workspace failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    Binaries {
        domaind: dir.join("domaind"),
        imex_sim: dir.join("imex-sim"),
        chaos: dir.join("domaind-chaos"),
    }
}

/// Whether cargo set `name` for this test process (its package's manifest, name and
/// version, its cfg, its binaries) rather than the user for cargo. Build scripts such
/// as ring's rerun when one of these changes (`rerun-if-env-changed=CARGO_PKG_NAME`),
/// so a nested cargo that inherited them from `cargo test` rebuilt ring and all that
/// links it (about two minutes on two cores), and the next top-level cargo rebuilt it
/// all again.
fn set_by_cargo_for_this_test(name: &str) -> bool {
    const PREFIXES: [&str; 6] = [
        "CARGO_MANIFEST_",
        "CARGO_PKG_",
        "CARGO_CFG_",
        "CARGO_CRATE_",
        "CARGO_BIN_",
        "CARGO_TARGET_TMPDIR",
    ];
    name == "OUT_DIR"
        || name == "CARGO_PRIMARY_PACKAGE"
        || name == "CARGO_RUSTC_CURRENT_DIR"
        || PREFIXES.iter().any(|prefix| name.starts_with(prefix))
}

#[cfg(test)]
mod tests {
    use super::set_by_cargo_for_this_test;

    #[test]
    fn what_cargo_sets_for_a_test_is_dropped_and_what_configures_cargo_is_kept() {
        for set in [
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_CRATE_NAME",
            "CARGO_BIN_EXE_domaind",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "OUT_DIR",
        ] {
            assert!(set_by_cargo_for_this_test(set), "{set}");
        }
        for kept in [
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_INCREMENTAL",
            "CARGO_TERM_COLOR",
            "CARGO_BUILD_JOBS",
            "CARGO",
            "PATH",
        ] {
            assert!(!set_by_cargo_for_this_test(kept), "{kept}");
        }
    }
}
