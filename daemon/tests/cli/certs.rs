//! `domaind certs init` and `issue`, run as a user would.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use domaind_gossip::NodeName;
use domaind_gossip::tls::{NodeTls, TlsPaths};
use domaind_node::certs::carries_imex_shared_name;

fn domaind(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args(args)
        .output()
        .expect("domaind runs")
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn init_then_issue_gives_loadable_node_material() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    let node = dir.path().join("node-1");

    let out = domaind(&["certs", "init", "--out", path(&ca)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key_mode = std::fs::metadata(ca.join("ca.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        key_mode & 0o077,
        0,
        "ca.key is readable by others: {key_mode:o}"
    );

    let out = domaind(&[
        "certs",
        "issue",
        "--ca",
        path(&ca),
        "--node",
        "gb200-node-1",
        "--out",
        path(&node),
        "--ip",
        "127.0.0.7",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tls = NodeTls::load(
        TlsPaths::in_dir(&node),
        NodeName::new("gb200-node-1").unwrap(),
    );
    assert!(tls.is_ok(), "{:?}", tls.err());
    let cert = TlsPaths::in_dir(&node).cert;
    assert!(!carries_imex_shared_name(&cert), "only when asked for");

    // Issuing again rotates in place.
    let out = domaind(&[
        "certs",
        "issue",
        "--ca",
        path(&ca),
        "--node",
        "gb200-node-1",
        "--out",
        path(&node),
        "--imex-shared-name",
    ]);
    assert!(out.status.success());
    assert!(tls.unwrap().reload_if_changed().unwrap());
    assert!(carries_imex_shared_name(&cert));
}

#[test]
fn init_never_overwrites_a_ca() {
    let dir = tempfile::tempdir().unwrap();
    assert!(
        domaind(&["certs", "init", "--out", path(dir.path())])
            .status
            .success()
    );
    let before = std::fs::read(dir.path().join("ca.key")).unwrap();
    let out = domaind(&["certs", "init", "--out", path(dir.path())]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("refusing to overwrite"));
    assert_eq!(std::fs::read(dir.path().join("ca.key")).unwrap(), before);
}

#[test]
fn bad_node_name_and_missing_ca_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = domaind(&[
        "certs",
        "issue",
        "--ca",
        path(dir.path()),
        "--node",
        "Bad_Name",
        "--out",
        path(dir.path()),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("DNS-1123"), "{stderr}");

    let out = domaind(&[
        "certs",
        "issue",
        "--ca",
        path(dir.path()),
        "--node",
        "node-1",
        "--out",
        path(dir.path()),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("certs init"), "{stderr}");
    assert!(stderr.contains("ca.crt"), "{stderr}");
}
