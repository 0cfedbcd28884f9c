//! `domaind-chaos run` end to end: a real rack of three `domaind run` processes under a
//! few seeded faults, through the binary's command line, with the JSON report read
//! back.
//!
//! Which `domaind` and `imex-sim`: `domaind_e2e::binaries`, which says why it builds
//! them.

use std::process::Command;

use serde_json::Value;

#[test]
fn three_nodes_under_seeded_faults_break_no_invariant() {
    let domaind_e2e::Binaries { domaind, imex_sim } = domaind_e2e::binaries().clone();
    let out = tempfile::tempdir().unwrap();
    let json = out.path().join("report.json");
    let run = Command::new(env!("CARGO_BIN_EXE_domaind-chaos"))
        .args([
            "run",
            "--nodes",
            "3",
            "--scenario",
            "kill,imex-crash,churn",
            "--seed",
            "7",
            "--duration",
            "25",
            "--subnet",
            "44",
            "--daemon-log",
            "info,domaind_gossip=warn",
            "--quiet",
        ])
        .arg("--domaind")
        .arg(&domaind)
        .arg("--imex-sim")
        .arg(&imex_sim)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        run.status
    );
    assert!(
        stdout.contains("invariants: 0 violations, 0 daemon crashes"),
        "{stdout}"
    );

    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["ok"], true, "{report:#}");
    assert_eq!(report["seed"], 7);
    assert_eq!(report["nodes"], 3);
    assert_eq!(report["violations"].as_array().unwrap().len(), 0);
    assert_eq!(report["crashes"].as_array().unwrap().len(), 0);
    assert!(report["formation_ms"].as_u64().is_some(), "{report:#}");
    assert!(report["observations"].as_u64().unwrap() > 10, "{report:#}");

    // Every scheduled fault was injected, noticed (churn's extra claim changes no
    // membership: nothing to notice) and healed.
    let steps = report["schedule"]["steps"].as_array().unwrap();
    let faults = report["faults"].as_array().unwrap();
    assert!(faults.len() >= 2, "{report:#}");
    assert_eq!(faults.len(), steps.len(), "{report:#}");
    for fault in faults {
        assert_eq!(fault["outcome"], "healed", "{fault:#}");
        assert!(fault["injected_at_ms"].as_u64().is_some(), "{fault:#}");
        assert!(fault["heal_ms"].as_u64().is_some(), "{fault:#}");
        let extra_claim = fault["kind"] == "churn"
            && steps[fault["step"].as_u64().unwrap() as usize]["churn"] == "extra-claim";
        assert_eq!(
            fault["detect_ms"].as_u64().is_some(),
            !extra_claim,
            "{fault:#}"
        );
    }

    // The per-kind figures add up to the faults.
    let kinds = report["kinds"].as_array().unwrap();
    assert_eq!(
        kinds
            .iter()
            .map(|k| k["kind"].as_str().unwrap())
            .collect::<Vec<_>>(),
        vec!["kill", "imex-crash", "churn"]
    );
    let injected: u64 = kinds.iter().map(|k| k["injected"].as_u64().unwrap()).sum();
    assert_eq!(injected as usize, faults.len());
    for kind in kinds {
        if let Some(heal) = kind["heal"].as_object() {
            assert!(heal["p50_ms"].as_u64() <= heal["p99_ms"].as_u64());
            assert!(heal["p99_ms"].as_u64() <= heal["max_ms"].as_u64());
        }
    }
}
