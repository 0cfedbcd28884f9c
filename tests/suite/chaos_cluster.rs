//! `domaind-chaos run --cluster` against the real API server with real kubelets.
//!
//! Three fake nodes of their own clique (`kubelet.sh`, 127.0.0.8-10); the CRD and the
//! DeviceClasses as the chart installs them. The harness runs as a user runs it, as a
//! process with `KUBECONFIG`, with `--local-daemons $KV`: the kube scripts' nodes have
//! no container runtime that runs anything, so it runs a daemon per node and the
//! controller as processes beside the kubelets and plays their DaemonSet and
//! Deployment (`chaos/src/cluster/local.rs`); everything else (the ComputeDomain, the
//! workload, the scheduler's allocations, the kubelets' prepares, cordons, evictions,
//! the status, the events) is the real cluster's.
//!
//! 1. `--dry-run` prints the nodes, the objects and the faults and creates nothing.
//! 2. A run of every cluster fault (daemon-delete, imex-crash, drain, pod-delete,
//!    controller-restart, upgrade): exit 0, each kind injected and healed, no
//!    violation, and everything it made deleted (its namespace, no cordon left). Each
//!    node's IMEX runs under a runner, as the chart runs it, and the harness holds the
//!    jobs' imports through it: not one may break on a daemon deletion or the rolling
//!    upgrade (those two keep the node in the domain and its IMEX the same process).
//! 3. A run interrupted (SIGINT) while it holds a node cordoned: it injects nothing
//!    more and cleans up as at its end (the node uncordoned, the workload's claims
//!    released, the domain's finalizer let go, the namespace gone), exit 130.
//!
//! On failure the harness's output and JSON report stay in `target/e2e/chaos-cluster/`.

use std::path::PathBuf;
use std::process::Command;

use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::Api;
use serde_json::Value;

use crate::kubelet::{FakeCluster, kube_state_dir};
use domaind_e2e::cluster::{install_crd_and_device_classes, wait_for};

const CLIQUE: &str = "e2e-chaos.1";
/// A schedule of this seed and duration holds every cluster fault (the dry run shows).
const SEED: &str = "3";
const DURATION: &str = "60";

fn evidence_dir() -> PathBuf {
    let dir = domaind_e2e::binaries()
        .domaind
        .parent()
        .expect("the profile directory")
        .join("e2e")
        .join("chaos-cluster");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn harness(namespace: &str, extra: &[&str]) -> Command {
    let mut command = Command::new(&domaind_e2e::binaries().chaos);
    command
        .args(["run", "--cluster", "--nodes", "3", "--namespace", namespace])
        .arg("--node-selector")
        .arg(format!("nvidia.com/gpu.clique={CLIQUE}"))
        .arg("--local-daemons")
        .arg(kube_state_dir())
        .args(extra);
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with real kubelets, as root: KUBECONFIG and DOMAIND_E2E_KUBE_DIR (../shared/kube; docs/TESTING.md)"]
async fn the_chaos_harness_passes_on_a_real_cluster() {
    let cluster = FakeCluster::start(
        "domaind-chaos",
        domaind_loopback::kubelets::CHAOS_CLUSTER,
        CLIQUE,
    )
    .await;
    let (client, names) = (cluster.client.clone(), cluster.names.clone());
    install_crd_and_device_classes(&client).await;
    let namespace = format!("domaind-chaos-e2e-{}", std::process::id());
    let namespaces = Api::<Namespace>::all(client.clone());
    let evidence = evidence_dir();

    // 1. The dry run: the plan, and nothing made.
    let dry = harness(
        &namespace,
        &["--dry-run", "--seed", SEED, "--duration", DURATION],
    )
    .output()
    .unwrap();
    let printed = String::from_utf8_lossy(&dry.stdout);
    assert!(
        dry.status.success(),
        "--dry-run failed: {printed}\n{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    assert!(printed.contains("nothing is created"), "{printed}");
    assert!(printed.contains(&names.join(", ")), "{printed}");
    let kinds = [
        "daemon-delete",
        "imex-crash",
        "drain",
        "pod-delete",
        "controller-restart",
        "upgrade",
    ];
    for kind in ["kind: ComputeDomain", "kind: Deployment"]
        .iter()
        .chain(&kinds)
    {
        assert!(printed.contains(kind), "{kind} missing from:\n{printed}");
    }
    assert!(
        namespaces.get_opt(&namespace).await.unwrap().is_none(),
        "--dry-run made the namespace"
    );

    // 2. Every cluster fault, one at a time; the harness exits 0 only without violations.
    let report_path = evidence.join("report.json");
    let run = harness(
        &namespace,
        &["--seed", SEED, "--duration", DURATION, "--json"],
    )
    .arg(&report_path)
    .output()
    .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    std::fs::write(evidence.join("stdout.txt"), stdout.as_bytes()).unwrap();
    std::fs::write(evidence.join("stderr.txt"), stderr.as_bytes()).unwrap();
    assert!(
        run.status.success(),
        "domaind-chaos run --cluster failed ({}): evidence in {}\n{stdout}\n{stderr}",
        run.status,
        evidence.display()
    );
    let report: Value = serde_json::from_slice(&std::fs::read(&report_path).unwrap()).unwrap();
    assert_eq!(report["ok"], true, "{stdout}");
    assert_eq!(report["violations"], Value::Array(Vec::new()), "{stdout}");
    assert!(report["formation_ms"].is_u64(), "{stdout}");
    for kind in report["kinds"].as_array().unwrap() {
        let injected = kind["injected"].as_u64().unwrap();
        assert!(injected >= 1, "{} never injected:\n{stdout}", kind["kind"]);
        assert_eq!(
            kind["heal"]["samples"].as_u64(),
            Some(injected),
            "{} not healed every time:\n{stdout}",
            kind["kind"]
        );
    }
    assert_eq!(report["kinds"].as_array().unwrap().len(), 6, "{stdout}");
    // The jobs' imports: taken on every node, and none broken but by a fault that may
    // break them (imex-crash); none on a daemon deletion or the upgrade.
    let imports = &report["imports"];
    assert!(imports["taken"].as_u64().unwrap() >= 3, "{stdout}");
    for broken in imports["broken"].as_array().unwrap() {
        assert_eq!(broken["by"], "imex-crash", "{broken}\n{stdout}");
    }
    for kind in report["kinds"].as_array().unwrap() {
        if kind["kind"] == "daemon-delete" || kind["kind"] == "upgrade" {
            assert_eq!(kind["imports_broken"], 0, "{}:\n{stdout}", kind["kind"]);
        }
    }
    assert!(
        report["cleanup"].as_str().unwrap().starts_with("deleted"),
        "{stdout}"
    );
    // Nothing left: no cordon, the namespace going or gone.
    for name in &names {
        let node = Api::<Node>::all(client.clone()).get(name).await.unwrap();
        assert_ne!(
            node.spec.and_then(|s| s.unschedulable),
            Some(true),
            "{name} left cordoned"
        );
    }
    assert_gone(&namespaces, &namespace).await;

    // 3. Interrupted in the middle of a drain: nothing of the run may stay.
    let interrupted = format!("{namespace}-int");
    let mut child = harness(
        &interrupted,
        &["--seed", "1", "--duration", "60", "--scenario", "drain"],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::fs::File::create(evidence.join("interrupted.txt")).unwrap())
    .spawn()
    .unwrap();
    let nodes_api = Api::<Node>::all(client.clone());
    wait_for("the run cordons a node", || async {
        let cordoned: Vec<String> = nodes_api
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|n| {
                n.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("domaind-chaos/cordoned-by"))
                    == Some(&interrupted)
            })
            .map(|n| n.metadata.name.clone().unwrap_or_default())
            .collect();
        (!cordoned.is_empty(), cordoned)
    })
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(130), "{status}");
    for name in &names {
        let node = nodes_api.get(name).await.unwrap();
        assert_ne!(
            node.spec.and_then(|s| s.unschedulable),
            Some(true),
            "{name} left cordoned"
        );
        assert!(
            !node
                .metadata
                .annotations
                .unwrap_or_default()
                .contains_key("domaind-chaos/cordoned-by"),
            "{name} keeps the run's annotation"
        );
    }
    assert_gone(&namespaces, &interrupted).await;
}

/// The namespace goes, all of it: a finalizer left on its ComputeDomain would keep it
/// Terminating for good.
async fn assert_gone(namespaces: &Api<Namespace>, name: &str) {
    let left = namespaces.get_opt(name).await.unwrap();
    assert!(
        left.is_none_or(|ns| ns.metadata.deletion_timestamp.is_some()),
        "namespace {name} was left"
    );
    wait_for(&format!("namespace {name} is gone"), || async {
        let left = namespaces.get_opt(name).await.unwrap();
        (left.is_none(), left.and_then(|ns| ns.status))
    })
    .await;
}
