//! `domaind topology simulate` writes a file `domaind run --gpu-topology` accepts.

use std::process::Command;

use domaind_node::gpu::{GpuInventory, Topology, TopologyInventory};

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
