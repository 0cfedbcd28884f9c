//! `domaind-chaos run` end to end: a real rack of three `domaind run` processes under a
//! few seeded faults (a daemon killed while its IMEX lives on, a whole node killed, an
//! IMEX crash), and one of two whose state directories fill up, through the binary's
//! command line, with the JSON report read back.
//!
//! Which `domaind` and `imex-sim`: `domaind_e2e::binaries`, which says why it builds
//! them.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};

use domaind_loopback::{
    CHAOS_REAL_RUN, CHAOS_REAL_RUN_FULL_DISK, CHAOS_REAL_RUN_SHARING, CHAOS_REAL_RUN_SOAK,
};
use serde_json::Value;

/// One rack of real daemons at a time: two side by side on a 2-core machine would
/// stretch every wait of both, and what failed would be the machine, not the daemons.
static ONE_RACK_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A rack of this file's: held while it runs, its report and files in `out`.
struct Rack {
    _one_at_a_time: MutexGuard<'static, ()>,
    out: tempfile::TempDir,
}

impl Rack {
    fn take() -> Self {
        Self {
            _one_at_a_time: ONE_RACK_AT_A_TIME
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
            out: tempfile::tempdir().unwrap(),
        }
    }

    fn json(&self) -> PathBuf {
        self.out.path().join("report.json")
    }

    /// `domaind-chaos run ARGS` on `subnet`, with the suite's binaries, gossip's logs
    /// quiet, the JSON report to [`Rack::json`].
    fn run(&self, subnet: u8, args: &[&str]) -> Command {
        let domaind_e2e::Binaries {
            domaind, imex_sim, ..
        } = domaind_e2e::binaries().clone();
        let mut command = Command::new(env!("CARGO_BIN_EXE_domaind-chaos"));
        command
            .arg("run")
            .args(args)
            .args(["--subnet", &subnet.to_string()])
            .args(["--daemon-log", "info,domaind_gossip=warn"])
            .arg("--domaind")
            .arg(domaind)
            .arg("--imex-sim")
            .arg(imex_sim)
            .arg("--json")
            .arg(self.json());
        command
    }
}

#[test]
fn three_nodes_under_seeded_faults_break_no_invariant() {
    let rack = Rack::take();
    let json = rack.json();
    let run = rack
        .run(
            CHAOS_REAL_RUN,
            &[
                "--nodes",
                "3",
                "--scenario",
                "daemon-kill,node-kill,imex-crash,churn",
                // Seed 7: a daemon-kill, an imex-crash, then a node-kill.
                "--seed",
                "7",
                "--duration",
                "25",
                "--quiet",
            ],
        )
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
        vec!["daemon-kill", "node-kill", "imex-crash", "churn"]
    );
    let kind = |name: &str| kinds.iter().find(|k| k["kind"] == name).unwrap();
    for name in ["daemon-kill", "node-kill", "imex-crash"] {
        assert_eq!(kind(name)["injected"], 1, "{report:#}");
    }

    // Imports (issue 28): a daemon killed while its IMEX lives on breaks none; a node
    // killed with its IMEX, or an IMEX crashed, breaks those of it and on it, allowed.
    let imports = &report["imports"];
    assert!(imports["taken"].as_u64().unwrap() >= 3, "{imports:#}");
    assert_eq!(kind("daemon-kill")["imports_broken"], 0, "{report:#}");
    assert!(
        kind("node-kill")["imports_broken"].as_u64().unwrap() > 0,
        "{report:#}"
    );
    for broken in imports["broken"].as_array().unwrap() {
        assert!(
            ["node-kill", "imex-crash"].contains(&broken["by"].as_str().unwrap()),
            "{broken:#}"
        );
    }
    assert!(stdout.contains("IMPORTS"), "{stdout}");
    let injected: u64 = kinds.iter().map(|k| k["injected"].as_u64().unwrap()).sum();
    assert_eq!(injected as usize, faults.len());
    for kind in kinds {
        if let Some(heal) = kind["heal"].as_object() {
            assert!(heal["p50_ms"].as_u64() <= heal["p99_ms"].as_u64());
            assert!(heal["p99_ms"].as_u64() <= heal["max_ms"].as_u64());
        }
    }
}

/// `disk-full` on real daemons: as root the state directory is filled and freed and
/// nothing else breaks; whatever the daemon does while it is full, only the prepares and
/// unprepares made meanwhile may fail (issue 15 item 3: until the daemon serves them
/// from memory, they do). Without root the fault is skipped, saying why. Either way no
/// tmpfs of the run outlives it.
#[test]
fn a_full_state_directory_breaks_no_invariant() {
    let rack = Rack::take();
    let json = rack.json();
    let harness = rack
        .run(
            CHAOS_REAL_RUN_FULL_DISK,
            &[
                "--nodes",
                "2",
                "--scenario",
                "disk-full",
                "--seed",
                "3",
                "--duration",
                "12",
                "--quiet",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its mounts are named after it.
    let source = format!("domaind-chaos-{} ", harness.id());
    let run = harness.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        matches!(run.status.code(), Some(0 | 1)),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        run.status
    );
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let faults = report["faults"].as_array().unwrap();
    assert!(!faults.is_empty(), "{report:#}");
    let root = nix::unistd::geteuid().is_root();
    for fault in faults {
        assert_eq!(fault["kind"], "disk-full", "{fault:#}");
        if root {
            assert_eq!(fault["outcome"], "healed", "{fault:#}");
            assert!(
                fault["notes"][0]
                    .as_str()
                    .unwrap()
                    .starts_with("state directory full"),
                "{fault:#}"
            );
        } else {
            assert_eq!(fault["outcome"], "skipped", "{fault:#}");
            assert!(
                fault["reason"].as_str().unwrap().contains("not root"),
                "{fault:#}"
            );
        }
    }
    assert_eq!(report["crashes"].as_array().unwrap().len(), 0, "{report:#}");
    // A full state directory is served from memory: the calls made while it is full
    // succeed, and nothing else breaks.
    assert_eq!(
        report["violations"].as_array().unwrap().len(),
        0,
        "{report:#}"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&source), "{mounts}");
}

/// Issue 16 item 3: three domains with `isolation: Channel` on the same four nodes,
/// under kills, pauses and domains created and deleted at random: no pod ever holds
/// another domain's channel, no two live domains share one, and every other invariant
/// holds as with one domain.
#[test]
fn sharing_domains_under_kills_pauses_and_domain_churn_break_no_invariant() {
    let rack = Rack::take();
    let json = rack.json();
    let run = rack
        .run(
            CHAOS_REAL_RUN_SHARING,
            &[
                "--nodes",
                "4",
                "--domains",
                "3",
                "--scenario",
                "node-kill,pause,domain-churn",
                // Seed 8's schedule deletes a domain, then creates one on a node and one
                // on three (seed 11's only deletes).
                "--seed",
                "8",
                "--duration",
                "60",
            ],
        )
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

    // Formed with a channel each, all distinct: the invariant had channels to check.
    let line = stderr
        .lines()
        .find_map(|l| l.split_once("] channels: ").map(|(_, c)| c.to_owned()))
        .unwrap_or_else(|| panic!("no channels line:\n{stderr}"));
    let channels: Vec<&str> = line
        .split(", ")
        .map(|d| d.rsplit_once(" channel ").unwrap().1)
        .collect();
    assert_eq!(channels.len(), 3, "{line}");
    assert!(channels.iter().all(|c| c.parse::<u32>().is_ok()), "{line}");
    let mut distinct = channels.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "{line}");

    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["ok"], true, "{report:#}");
    assert_eq!(report["domains"], 3);
    assert_eq!(report["violations"].as_array().unwrap().len(), 0);
    let faults = report["faults"].as_array().unwrap();
    assert_eq!(
        faults.len(),
        report["schedule"]["steps"].as_array().unwrap().len()
    );
    for fault in faults {
        assert_eq!(fault["outcome"], "healed", "{fault:#}");
        assert!(fault["heal_ms"].as_u64().is_some(), "{fault:#}");
        // A pause shorter than the peers' detection may go unnoticed (a note, as
        // with one domain); a node-kill and a domain created or deleted never do.
        if fault["kind"] != "pause" {
            assert!(fault["detect_ms"].as_u64().is_some(), "{fault:#}");
        }
    }
    // Domains were both created and deleted while the others lived.
    let churns: Vec<&str> = faults
        .iter()
        .filter(|f| f["kind"] == "domain-churn")
        .map(|f| f["notes"][0].as_str().unwrap())
        .collect();
    assert!(
        churns.iter().any(|n| n.starts_with("created ")),
        "{churns:?}"
    );
    assert!(
        churns.iter().any(|n| n.starts_with("deleted ")),
        "{churns:?}"
    );
}

/// A soak's machinery on a short run (`--sample-every`, `--spare`): every daemon is
/// sampled from outside (process, journal, metrics, gossip state), the spared node keeps
/// its one process through the others' faults, and a run too short for any life to be
/// judged is not passed as a soak.
#[test]
fn a_soak_samples_every_daemon_and_passes_no_life_too_short_to_judge() {
    let rack = Rack::take();
    let json = rack.json();
    let csv = rack.out.path().join("samples.csv");
    let run = rack
        .run(
            CHAOS_REAL_RUN_SOAK,
            &[
                "--nodes",
                "3",
                "--spare",
                "1",
                "--scenario",
                "daemon-kill",
                "--duration",
                "6",
                "--sample-every",
                "1s",
                "--quiet",
            ],
        )
        .arg("--samples")
        .arg(&csv)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(
        run.status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stdout.contains("invariants: 0 violations, 0 daemon crashes"),
        "{stdout}"
    );
    assert!(
        stdout.contains("no life was sampled long enough to judge"),
        "{stdout}"
    );
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["ok"], false, "{report:#}");
    assert!(
        report["soak"]["samples"].as_u64().unwrap() >= 6,
        "{report:#}"
    );
    // The spared node is never a target.
    for step in report["schedule"]["steps"].as_array().unwrap() {
        for target in step["targets"].as_array().unwrap() {
            assert!(target.as_u64().unwrap() < 2, "{step:#}");
        }
    }

    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(
            "at_s,node,pid,rss_kib,rss_anon_kib,fds,threads,journal_bytes,metric_series,gossip_nodes,gossip_keys,gossip_bytes,heap_allocated_bytes,heap_resident_bytes,heap_active_bytes,heap_metadata_bytes"
        )
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    for node in ["node-01", "node-02", "node-03"] {
        let of: Vec<&Vec<&str>> = rows.iter().filter(|r| r[1] == node).collect();
        // Once its claim is prepared, every vital of every node was read.
        assert!(
            of.iter().any(|r| r.iter().all(|cell| !cell.is_empty())),
            "{node} never had every vital:\n{text}"
        );
        let mut pids: Vec<&str> = of.iter().map(|r| r[2]).collect();
        pids.dedup();
        if node == "node-03" {
            assert_eq!(pids.len(), 1, "the spared node restarted:\n{text}");
        }
    }
}
