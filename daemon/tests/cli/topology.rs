//! `domaind topology simulate` writes a file `domaind run --gpu-topology` accepts, and
//! `domaind gpus` reads GPUs as `domaind run` does.

use std::process::Command;

use domaind_gpu::{GpuInventory, Topology, TopologyInventory};

#[test]
fn a_simulated_rack_is_one_clique_and_names_its_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("topology.json");
    let status = Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args([
            "topology",
            "simulate",
            "--node",
            "node-1,node-2",
            "--node",
            "node-3",
        ])
        .arg("--rack")
        .arg("7")
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    for node in ["node-1", "node-2", "node-3"] {
        let clique = TopologyInventory::open(&out, node)
            .unwrap()
            .clique()
            .unwrap();
        assert_eq!(clique, Topology::simulated_clique(7));
    }
    assert!(TopologyInventory::open(&out, "node-4").is_err());
}

#[test]
fn a_bad_node_name_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("topology.json");
    let output = Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args(["topology", "simulate", "--node", "Not_A_Node"])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("Not_A_Node"));
    assert!(!out.exists());
}

#[test]
fn gpus_reads_the_fake_topology_as_run_does() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("topology.json");
    Topology::simulated_rack(3, ["node-a", "node-b"])
        .unwrap()
        .write(&out)
        .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args([
            "gpus",
            "--node-name",
            "node-b",
            "--output",
            "json",
            "--gpu-topology",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        report["clique"],
        Topology::simulated_clique(3).to_string().as_str()
    );
    assert_eq!(report["gpus"].as_array().unwrap().len(), 4);
    assert_eq!(report["gpus"][0]["fabric"]["state"], "completed");
    assert_eq!(report["transient"], false);

    let text = Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args(["gpus", "--node-name", "node-b", "--gpu-topology"])
        .arg(&out)
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains(&format!("clique {}: ", Topology::simulated_clique(3))),
        "{text}"
    );
}

/// Without a driver (this machine, CI) the answer is the one line `domaind run` gives.
#[test]
fn gpus_without_nvml_fails_in_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args([
            "gpus",
            "--nvml-library",
            "libnvidia-ml-not-here.so.1",
            "--driver-root",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("cannot read this node's GPUs") && stderr.contains("--gpu-topology"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
}
