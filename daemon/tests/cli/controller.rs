//! `domaind controller`'s command line: bad settings are refused before anything
//! starts, with a message that says what to fix.

use std::process::Command;

fn controller(args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_domaind"))
        .arg("controller")
        .args(args)
        // No cluster here: make sure none is found by accident.
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_renew_deadline_as_long_as_the_lease_is_refused() {
    let (ok, stderr) = controller(&["--lease-duration=15s", "--renew-deadline=15s"]);
    assert!(!ok);
    assert!(
        stderr.contains("invalid leader election timing"),
        "{stderr}"
    );
    assert!(
        stderr.contains("two replicas could both act as leader"),
        "{stderr}"
    );
}

#[test]
fn rack_mode_needs_a_namespace() {
    let (ok, stderr) = controller(&["--rack-mode"]);
    assert!(!ok);
    assert!(stderr.contains("--rack-namespace"), "{stderr}");
}

#[test]
fn without_a_cluster_it_says_how_to_reach_one() {
    let (ok, stderr) = controller(&["--http-addr=127.0.0.1:0"]);
    assert!(!ok);
    assert!(stderr.contains("KUBECONFIG"), "{stderr}");
}

#[test]
fn help_documents_every_flag() {
    let output = Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args(["controller", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(output.stdout).unwrap();
    for flag in [
        "--driver-name",
        "--device-class",
        "--http-addr",
        "--leader-elect",
        "--lease-name",
        "--lease-namespace",
        "--leader-identity",
        "--lease-duration",
        "--renew-deadline",
        "--retry-period",
        "--deletion-poll",
        "--conflict-recheck",
        "--resync",
        "--rack-mode",
        "--rack-namespace",
        "--rack-label",
        "--shutdown-timeout",
    ] {
        let line = help
            .lines()
            .position(|l| l.trim_start().starts_with(flag))
            .unwrap_or_else(|| panic!("{flag} is not in --help"));
        // clap puts the flag's doc on the next line.
        assert!(
            !help
                .lines()
                .nth(line + 1)
                .unwrap_or_default()
                .trim()
                .is_empty(),
            "{flag} has no description"
        );
    }
}
