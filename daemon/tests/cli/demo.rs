//! `domaind demo --json`: the README's first command, end to end.

use std::process::Command;

use domaind_loopback::{CLI_DEMO, CLI_DEMO_CLIQUES, CLI_DEMO_DOMAINS};
use serde_json::Value;

#[test]
fn the_demo_forms_heals_and_rejoins_and_leaves_nothing_behind() {
    let output = Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args([
            "--log",
            "warn",
            "demo",
            "--json",
            "--nodes",
            "3",
            "--subnet",
            CLI_DEMO.to_string().as_str(),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["ok"], true, "{summary}");
    assert_eq!(summary["nodes"], 3);
    assert_eq!(summary["killed"], "node-03");
    for field in ["formed_ms", "heal_ms", "status_ms", "rejoin_ms"] {
        assert!(summary[field].as_u64().is_some(), "{field} in {summary}");
    }
    // The status follows the survivors' IMEX peers, never the other way round.
    assert!(summary["status_ms"].as_u64() >= summary["heal_ms"].as_u64());
    assert_eq!(summary["compute_domain"]["name"], "demo-domain");
    // Nothing of the rack outlives the demo: its files are gone, and no process runs
    // with them.
    let dir = summary["rack_dir"].as_str().unwrap();
    assert!(!std::path::Path::new(dir).exists(), "{dir} was removed");
    let survivors: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| std::fs::read(entry.ok()?.path().join("cmdline")).ok())
        .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
        .filter(|cmdline| cmdline.contains(dir))
        .collect();
    assert_eq!(survivors, Vec::<String>::new());
}

#[test]
fn bad_flags_are_refused_with_the_reason() {
    let output = Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args(["demo", "--nodes", "19"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("19 is not in 1..=18"), "{stderr}");

    let output = Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args(["demo", "--cliques", "9"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("9 is not in 1..=8"), "{stderr}");
}

#[test]
fn a_rack_of_cliques_forms_a_domain_per_clique_and_nothing_crosses() {
    let output = Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args([
            "--log",
            "warn",
            "demo",
            "--json",
            "--nodes",
            "2",
            "--cliques",
            "2",
            "--subnet",
            CLI_DEMO_CLIQUES.to_string().as_str(),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    let fleet: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(fleet["ok"], true, "{fleet}");
    assert_eq!(fleet["crossings"], serde_json::json!([]), "{fleet}");
    let cliques = fleet["cliques"].as_array().unwrap();
    assert_eq!(cliques.len(), 2, "{fleet}");
    // Contiguous blocks: node-01 and node-02, then node-03 and node-04; each clique
    // loses its last node.
    for (clique, killed) in cliques.iter().zip(["node-02", "node-04"]) {
        assert_eq!(clique["ok"], true, "{clique}");
        assert_eq!(clique["nodes"], 2);
        assert_eq!(clique["killed"], killed);
        for field in ["formed_ms", "heal_ms", "status_ms", "rejoin_ms"] {
            assert!(clique[field].as_u64().is_some(), "{field} in {clique}");
        }
    }
    assert_eq!(cliques[0]["compute_domain"]["name"], "demo-domain-1");
    assert_eq!(cliques[1]["compute_domain"]["name"], "demo-domain-2");
    assert_ne!(
        cliques[0]["compute_domain"]["uid"],
        cliques[1]["compute_domain"]["uid"]
    );
}

/// Issue 16 item 3: two domains with `isolation: Channel` share a rack. Each gets a
/// channel of its own, every node's claim of a domain has that domain's channel device
/// in its CDI spec and no other, and deleting the first leaves the second Ready on its
/// channel.
#[test]
fn two_domains_share_a_rack_each_pod_with_its_own_channel() {
    let output = Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args([
            "--log",
            "warn",
            "demo",
            "--json",
            "--nodes",
            "3",
            "--domains",
            "2",
            "--subnet",
            CLI_DEMO_DOMAINS.to_string().as_str(),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["ok"], true, "{summary}");
    assert_eq!(summary["nodes"], 3);
    let domains = summary["domains"].as_array().unwrap();
    assert_eq!(domains.len(), 2, "{summary}");
    let channels: Vec<u64> = domains
        .iter()
        .map(|d| d["channel"].as_u64().unwrap())
        .collect();
    assert_ne!(channels[0], channels[1], "{summary}");
    for (domain, channel) in domains.iter().zip(&channels) {
        let name = domain["compute_domain"]["name"].as_str().unwrap();
        let pods = domain["pods"].as_array().unwrap();
        let mut nodes: Vec<&str> = pods.iter().map(|p| p["node"].as_str().unwrap()).collect();
        nodes.sort_unstable();
        assert_eq!(nodes, ["node-01", "node-02", "node-03"], "{domain}");
        for pod in pods {
            assert_eq!(pod["cdi_channel"].as_u64(), Some(*channel), "{name}: {pod}");
            assert_eq!(
                pod["device"],
                format!("/dev/nvidia-caps-imex-channels/channel{channel}"),
                "{name}: {pod}"
            );
            assert!(
                pod["claim"].as_str().unwrap().contains(name),
                "{name}: {pod}"
            );
        }
    }
    assert_eq!(summary["deleted"]["name"], "demo-domain-1");
    assert!(summary["deleted_ms"].as_u64().is_some(), "{summary}");
    let remaining = summary["remaining"].as_array().unwrap();
    assert_eq!(remaining.len(), 1, "{summary}");
    assert_eq!(remaining[0]["name"], "demo-domain-2");
    assert_eq!(remaining[0]["status"], "Ready");
    assert_eq!(remaining[0]["ready_nodes"], 3);
    assert_eq!(remaining[0]["channel"].as_u64(), Some(channels[1]));
    let dir = summary["rack_dir"].as_str().unwrap();
    assert!(!std::path::Path::new(dir).exists(), "{dir} was removed");
}

#[test]
fn several_domains_run_on_one_clique_only() {
    let output = Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args(["demo", "--domains", "2", "--cliques", "2"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot be combined with --cliques"),
        "{stderr}"
    );
}
