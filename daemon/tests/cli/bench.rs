//! `domaind bench prepare`, run tiny so that it keeps working: the command, not its
//! figures (those are printed for docs/BENCHMARKS.md, never asserted).

use std::process::Command;

use serde_json::Value;

#[test]
fn the_prepare_bench_runs_every_case_and_leaves_nothing_behind() {
    let output = Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args([
            "--log",
            "warn",
            "bench",
            "prepare",
            "--held",
            "3",
            "--samples",
            "5",
            "--concurrent",
            "4",
            "--rounds",
            "2",
            "--subnet",
            domaind_loopback::CLI_BENCH_PREPARE.to_string().as_str(),
            "--json",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["held"], 3, "{report}");
    assert_eq!(report["nodes"], 2, "{report}");
    let cases = report["cases"].as_array().unwrap();
    let calls: Vec<(&str, u64)> = cases
        .iter()
        .map(|c| (c["case"].as_str().unwrap(), c["calls"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        calls,
        vec![
            ("sequential prepare", 5),
            ("sequential unprepare", 5),
            ("concurrent prepare", 8),
            ("concurrent unprepare", 8),
        ]
    );
    for case in cases {
        let ms = |field: &str| case[field].as_f64().unwrap();
        assert!(
            0.0 < ms("p50_ms")
                && ms("p50_ms") <= ms("p90_ms")
                && ms("p90_ms") <= ms("p99_ms")
                && ms("p99_ms") <= ms("max_ms"),
            "{case}"
        );
    }
    let dir = report["rack_dir"].as_str().unwrap();
    assert!(!std::path::Path::new(dir).exists(), "{dir} was removed");
}

#[test]
fn a_held_count_of_zero_is_refused() {
    let output = Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args(["bench", "prepare", "--held", "0"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("0 is not in 1..=5000"), "{stderr}");
}
