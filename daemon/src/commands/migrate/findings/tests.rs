//! The check on real objects: the ResourceClaim, ResourceClaimTemplate and ResourceSlice a
//! real API server returned for NVIDIA's driver (`kube-api/fixtures/`), NVIDIA's CRD as
//! it ships (outside data: `$DOMAIND_REFERENCE_DIR`, `../shared/reference/`, read only
//! by the test that is ignored unless asked for), ours as `deploy/crds/` holds it, and
//! objects shaped as NVIDIA's controller makes them.

use serde_json::json;

use super::*;

const DRIVER: &str = "compute-domain.nvidia.com";

fn fixture(name: &str) -> Value {
    let path = format!("{}/../kube-api/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn yaml(path: &str) -> Value {
    let path = format!("{}/{path}", env!("CARGO_MANIFEST_DIR"));
    serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn nvidia_crd() -> Value {
    const ENV: &str = "DOMAIND_REFERENCE_DIR";
    let dir = std::env::var_os(ENV).unwrap_or_else(|| panic!("{ENV} names no directory"));
    let path = std::path::Path::new(&dir).join("anchor-computedomains-crd.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap()
}

fn our_crd() -> Value {
    yaml("../deploy/crds/computedomains.resource.nvidia.com.yaml")
}

/// A domain as NVIDIA's stack leaves it: its finalizer, its daemons' status.
fn nvidia_domain() -> Value {
    json!({
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
        "metadata": {
            "name": "compute-domain-0", "namespace": "cd-ref",
            "uid": "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11",
            "finalizers": ["resource.nvidia.com/computeDomain"],
            "managedFields": [
                {"manager": "kubectl-client-side-apply", "operation": "Update"},
                {"manager": "compute-domain-daemon", "operation": "Update", "subresource": "status"}
            ]
        },
        "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "compute-domain-0-rct"}, "allocationMode": "Single"}},
        "status": {"status": "Ready", "nodes": [
            {"name": "gb200-rack1-n01", "ipAddress": "10.0.0.1", "cliqueID": "c.1", "index": 0, "status": "Ready"}
        ]}
    })
}

/// The per-domain IMEX DaemonSet NVIDIA's controller makes.
fn imex_daemon_set() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {
            "name": "compute-domain-0-7xk2p", "namespace": "nvidia-dra-driver-gpu",
            "labels": {"resource.nvidia.com/computeDomain": "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11"},
            "finalizers": ["resource.nvidia.com/computeDomain"]
        },
        "spec": {"template": {"spec": {"containers": [
            {"name": "compute-domain-daemon", "image": "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.8.0"}
        ]}}}
    })
}

fn nvidia_controller() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "nvidia-dra-driver-gpu-controller", "namespace": "nvidia-dra-driver-gpu"},
        "spec": {"template": {"spec": {"containers": [
            {"name": "compute-domain", "image": "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.8.0"}
        ]}}}
    })
}

fn ours(slice: &mut Value) {
    slice["metadata"]["managedFields"] = json!([{"manager": "domaind-node", "operation": "Apply"}]);
}

fn blocking(report: &Report) -> Vec<(String, String)> {
    report
        .findings
        .iter()
        .filter(|f| f.blocks)
        .map(|f| (f.kind.clone(), f.object.clone()))
        .collect()
}

#[test]
#[ignore = "needs reference data: NVIDIA's CRD in $DOMAIND_REFERENCE_DIR (../shared/reference)"]
fn a_cluster_on_nvidias_stack_is_blocked_by_its_driver_daemons_running_claims_and_crd() {
    let inventory = Inventory {
        crd: Some(nvidia_crd()),
        compute_domains: vec![nvidia_domain()],
        claims: vec![fixture("resourceclaim-allocated.json")],
        claim_templates: vec![fixture("resourceclaimtemplate.json")],
        slices: vec![fixture("resourceslice.json")],
        daemon_sets: vec![imex_daemon_set()],
        deployments: vec![nvidia_controller()],
        labelled_nodes: vec![],
    };
    let report = inspect(&inventory, DRIVER);
    assert!(report.blocked);
    assert_eq!(
        blocking(&report),
        [
            (
                "CustomResourceDefinition".to_string(),
                "computedomains.resource.nvidia.com".to_string()
            ),
            (
                "Deployment".to_string(),
                "nvidia-dra-driver-gpu/nvidia-dra-driver-gpu-controller".to_string()
            ),
            // A per-domain IMEX DaemonSet (its image is the driver's, said once).
            (
                "DaemonSet".to_string(),
                "nvidia-dra-driver-gpu/compute-domain-0-7xk2p".to_string()
            ),
            // The real claim: reserved for worker-0, from a slice domaind did not publish.
            (
                "ResourceClaim".to_string(),
                "cd-ref/worker-0-cd-0-2csgh".to_string()
            ),
        ]
    );
    let claim = report
        .findings
        .iter()
        .find(|f| f.kind == "ResourceClaim")
        .unwrap();
    assert!(
        claim.found.contains("gb200-rack1-n01/channel-0"),
        "{claim:?}"
    );
    assert!(claim.found.contains("worker-0"), "{claim:?}");
    let domain = report
        .findings
        .iter()
        .find(|f| f.kind == "ComputeDomain")
        .unwrap();
    assert!(!domain.blocks);
    assert!(domain.found.contains("compute-domain-daemon"), "{domain:?}");
    let slice = report
        .findings
        .iter()
        .find(|f| f.kind == "ResourceSlice")
        .unwrap();
    assert!(slice.found.contains("2 device(s)"), "{slice:?}");
    // The real template has no finalizer or daemon label: nothing to say about it.
    assert!(
        report
            .findings
            .iter()
            .all(|f| f.kind != "ResourceClaimTemplate")
    );
}

#[test]
fn a_cluster_on_domaind_has_nothing_to_say() {
    let mut slice = fixture("resourceslice.json");
    ours(&mut slice);
    let mut domain = nvidia_domain();
    domain["metadata"]["managedFields"] =
        json!([{"manager": "domaind-node", "operation": "Apply", "subresource": "status"}]);
    domain["status"]["conditions"] = json!([]);
    domain["status"]["readyNodes"] = json!(1);
    let inventory = Inventory {
        crd: Some(our_crd()),
        compute_domains: vec![domain],
        claims: vec![fixture("resourceclaim-allocated.json")],
        claim_templates: vec![fixture("resourceclaimtemplate.json")],
        slices: vec![slice],
        ..Inventory::default()
    };
    let report = inspect(&inventory, DRIVER);
    assert_eq!(report.findings, [], "{}", render_text(&report));
    assert!(!report.blocked);
    assert!(render_text(&report).ends_with("Nothing blocks the switch.\n"));
}

#[test]
fn leftovers_of_nvidias_controller_are_notes_with_what_to_do() {
    let mut daemon_template = fixture("resourceclaimtemplate.json");
    daemon_template["metadata"]["name"] = json!("compute-domain-0-daemon-claim-template-x");
    daemon_template["metadata"]["labels"] =
        json!({"resource.nvidia.com/computeDomainTarget": "Daemon"});
    let mut workload_template = fixture("resourceclaimtemplate.json");
    workload_template["metadata"]["finalizers"] = json!(["resource.nvidia.com/computeDomain"]);
    let mut daemon_claim = fixture("resourceclaim-allocated.json");
    daemon_claim["status"]["allocation"]["devices"]["results"][0]["device"] = json!("daemon-0");
    let mut released = fixture("resourceclaim-allocated.json");
    released["status"]["reservedFor"] = json!([]);
    let node = json!({"metadata": {"name": "gb200-rack1-n01", "labels": {"resource.nvidia.com/computeDomain": "5b0e"}}});
    let inventory = Inventory {
        crd: Some(our_crd()),
        claims: vec![daemon_claim, released],
        claim_templates: vec![daemon_template, workload_template],
        labelled_nodes: vec![node],
        ..Inventory::default()
    };
    let report = inspect(&inventory, DRIVER);
    assert!(!report.blocked, "{}", render_text(&report));
    let kinds: Vec<&str> = report.findings.iter().map(|f| f.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "ResourceClaim",
            "ResourceClaim",
            "ResourceClaimTemplate",
            "ResourceClaimTemplate",
            "Node"
        ]
    );
    assert!(report.findings[0].found.contains("IMEX daemon"));
    assert!(report.findings[1].found.contains("reserved for no pod"));
    assert!(report.findings[3].action.contains("finalizers"));
    assert!(
        report.findings[4]
            .action
            .contains("kubectl label node gb200-rack1-n01")
    );
}

#[test]
fn claims_of_other_drivers_and_unallocated_ones_are_none_of_its_business() {
    let mut other = fixture("resourceclaim-allocated.json");
    other["status"]["allocation"]["devices"]["results"][0]["driver"] = json!("gpu.nvidia.com");
    let mut pending = fixture("resourceclaim-allocated.json");
    pending["status"] = json!({});
    let inventory = Inventory {
        crd: Some(our_crd()),
        claims: vec![other, pending],
        ..Inventory::default()
    };
    assert_eq!(inspect(&inventory, DRIVER).findings, []);
}

#[test]
fn no_crd_is_a_note_and_the_text_puts_blocks_first() {
    let inventory = Inventory {
        deployments: vec![nvidia_controller()],
        ..Inventory::default()
    };
    let report = inspect(&inventory, DRIVER);
    let text = render_text(&report);
    let blocks = text.find("[BLOCKS] Deployment").unwrap();
    let note = text.find("[note] CustomResourceDefinition").unwrap();
    assert!(blocks < note, "{text}");
    assert!(
        text.ends_with("resolve the BLOCKS findings above.\n"),
        "{text}"
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["blocked"], true);
    assert_eq!(json["findings"][1]["kind"], "Deployment");
}
