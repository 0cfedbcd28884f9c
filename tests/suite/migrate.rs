//! `domaind migrate --check` as a process against the real API server, on objects shaped
//! as NVIDIA's ComputeDomain stack leaves them (`shared/reference/`'s claim, template and
//! slice, a ComputeDomain whose status NVIDIA's daemon wrote, its per-domain IMEX
//! DaemonSet, its driver's controller Deployment), in a namespace of the test's own.
//!
//! Our CRD stays installed: other tests of this binary run beside this one and need it,
//! so the check of NVIDIA's CRD is a unit test (`daemon/src/commands/migrate/`). Nothing
//! here runs: the workloads are scheduled nowhere.
//!
//! Needs `KUBECONFIG`.

use std::process::Command;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

use domaind_e2e::binaries::binaries;
use domaind_e2e::cluster::{create_namespace, install_crd_and_device_classes, repo_file, require};

/// The field manager NVIDIA's IMEX daemons write a domain's status with, as far as the
/// check is concerned: anything not domaind's.
const NVIDIA_DAEMON: &str = "compute-domain-daemon";

fn reference(name: &str) -> Value {
    serde_json::from_str(&repo_file(&format!("kube-api/fixtures/{name}"))).unwrap()
}

fn api(
    client: &Client,
    namespace: Option<&str>,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// Creates `obj` as `manager` would (server-side apply); its status too, if it has one.
async fn apply(api: &Api<DynamicObject>, mut obj: Value, manager: &str) {
    for key in ["uid", "resourceVersion", "creationTimestamp", "generation"] {
        obj["metadata"].as_object_mut().unwrap().remove(key);
    }
    let status = obj.as_object_mut().unwrap().remove("status");
    let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
    let params = PatchParams::apply(manager).force();
    api.patch(&name, &params, &Patch::Apply(&obj))
        .await
        .unwrap();
    if let Some(status) = status {
        let body = json!({"apiVersion": obj["apiVersion"], "kind": obj["kind"], "status": status});
        api.patch_status(&name, &params, &Patch::Apply(&body))
            .await
            .unwrap();
    }
}

fn check(kubeconfig: &str, output: &str) -> (i32, String) {
    let out = Command::new(&binaries().domaind)
        .args(["--log", "warn", "migrate", "--check", "--output", output])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
    )
}

#[tokio::test]
#[ignore = "needs a cluster: KUBECONFIG of a real API server (../shared/kube; docs/TESTING.md)"]
async fn the_check_finds_what_nvidias_stack_left_and_exits_non_zero() {
    require(&[]);
    let kubeconfig = std::env::var("KUBECONFIG").unwrap();
    let client = Client::try_default().await.unwrap();
    install_crd_and_device_classes(&client).await;
    let ns = format!("migrate-{}", std::process::id());
    let _cleared_on_panic = create_namespace(&client, &ns).await;
    let node = format!("{ns}-gb200-n01");

    // The pod the real claim is reserved for: the claim controller drops a reservation
    // for a pod that does not exist. Scheduled nowhere, it stays Pending.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "worker-0", "namespace": ns},
        "spec": {
            "nodeSelector": {"e2e.domaind.dev/schedule": "nowhere"},
            "resourceClaims": [{"name": "cd-0", "resourceClaimName": "worker-0-cd-0-2csgh"}],
            "containers": [{"name": "c", "image": "example.invalid/any:latest",
                            "resources": {"claims": [{"name": "cd-0"}]}}],
        },
    }))
    .unwrap();
    let pod = Api::<Pod>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();

    // The real claim, template and slice, moved to this namespace and node.
    let mut claim = reference("resourceclaim-allocated.json");
    claim["status"]["reservedFor"][0]["uid"] = json!(pod.metadata.uid);
    claim["metadata"]["namespace"] = json!(ns);
    claim["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("ownerReferences");
    claim["metadata"]["finalizers"] = json!([]);
    claim["status"]["allocation"]["devices"]["results"][0]["pool"] = json!(node);
    claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] =
        json!([node]);
    apply(
        &api(
            &client,
            Some(&ns),
            "resource.k8s.io",
            "v1",
            "ResourceClaim",
            "resourceclaims",
        ),
        claim,
        "kube-scheduler",
    )
    .await;
    let mut daemon_template = reference("resourceclaimtemplate.json");
    daemon_template["metadata"] = json!({
        "name": "compute-domain-0-daemon-claim-template", "namespace": ns,
        "labels": {"resource.nvidia.com/computeDomainTarget": "Daemon"},
    });
    apply(
        &api(
            &client,
            Some(&ns),
            "resource.k8s.io",
            "v1",
            "ResourceClaimTemplate",
            "resourceclaimtemplates",
        ),
        daemon_template,
        "compute-domain-controller",
    )
    .await;
    let mut slice = reference("resourceslice.json");
    slice["metadata"] = json!({"name": format!("{node}-compute-domain.nvidia.com")});
    slice["spec"]["nodeName"] = json!(node);
    slice["spec"]["pool"]["name"] = json!(node);
    let slices = api(
        &client,
        None,
        "resource.k8s.io",
        "v1",
        "ResourceSlice",
        "resourceslices",
    );
    let slice_name = slice["metadata"]["name"].as_str().unwrap().to_owned();
    apply(&slices, slice, "compute-domain-kubelet-plugin").await;

    // A domain whose status NVIDIA's daemons wrote, and NVIDIA's workloads.
    let domain = json!({
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
        "metadata": {"name": "compute-domain-0", "namespace": ns},
        "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "compute-domain-0-rct"}}},
        "status": {"status": "Ready", "nodes": [
            {"name": node, "ipAddress": "10.0.0.1", "cliqueID": "c.1", "index": 0, "status": "Ready"}
        ]},
    });
    apply(
        &api(
            &client,
            Some(&ns),
            "resource.nvidia.com",
            "v1beta1",
            "ComputeDomain",
            "computedomains",
        ),
        domain,
        NVIDIA_DAEMON,
    )
    .await;
    let nowhere = json!({"e2e.domaind.dev/schedule": "nowhere"});
    let workload = |kind: &str, name: &str, labels: Value, container: &str| {
        json!({
            "apiVersion": "apps/v1", "kind": kind,
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"nodeSelector": nowhere, "containers": [
                        {"name": container, "image": "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.8.0"}
                    ]},
                },
            },
        })
    };
    apply(
        &api(&client, Some(&ns), "apps", "v1", "DaemonSet", "daemonsets"),
        workload(
            "DaemonSet",
            "compute-domain-0-imex",
            json!({"resource.nvidia.com/computeDomain": "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11"}),
            "compute-domain-daemon",
        ),
        "compute-domain-controller",
    )
    .await;
    apply(
        &api(
            &client,
            Some(&ns),
            "apps",
            "v1",
            "Deployment",
            "deployments",
        ),
        workload(
            "Deployment",
            "nvidia-dra-driver-gpu-controller",
            json!({}),
            "compute-domain",
        ),
        "helm",
    )
    .await;

    let (code, json_out) = check(&kubeconfig, "json");
    let (text_code, text) = check(&kubeconfig, "text");

    slices
        .delete(&slice_name, &DeleteParams::default())
        .await
        .unwrap();
    Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();

    assert_eq!(code, 1, "blocked, so exit 1: {json_out}");
    assert_eq!(text_code, 1, "{text}");
    let report: Value = serde_json::from_str(&json_out).unwrap();
    assert_eq!(report["blocked"], true);
    let findings = report["findings"].as_array().unwrap();
    let found = |kind: &str, object: &str| {
        findings
            .iter()
            .find(|f| f["kind"] == kind && f["object"] == object)
            .unwrap_or_else(|| panic!("no finding for {kind} {object}: {json_out}"))
            .clone()
    };
    let driver = found(
        "Deployment",
        &format!("{ns}/nvidia-dra-driver-gpu-controller"),
    );
    assert_eq!(driver["blocks"], true);
    let imex = found("DaemonSet", &format!("{ns}/compute-domain-0-imex"));
    assert_eq!(imex["blocks"], true);
    assert!(
        imex["found"].as_str().unwrap().contains("IMEX DaemonSet"),
        "{imex}"
    );
    let claim = found("ResourceClaim", &format!("{ns}/worker-0-cd-0-2csgh"));
    assert_eq!(claim["blocks"], true);
    assert!(
        claim["found"].as_str().unwrap().contains("worker-0"),
        "{claim}"
    );
    let domain = found("ComputeDomain", &format!("{ns}/compute-domain-0"));
    assert_eq!(domain["blocks"], false);
    assert!(
        domain["found"].as_str().unwrap().contains(NVIDIA_DAEMON),
        "{domain}"
    );
    assert_eq!(
        found(
            "ResourceClaimTemplate",
            &format!("{ns}/compute-domain-0-daemon-claim-template")
        )["blocks"],
        false
    );
    assert_eq!(found("ResourceSlice", &slice_name)["blocks"], false);
    // Our CRD is installed: nothing to say about it.
    assert!(
        findings
            .iter()
            .all(|f| f["kind"] != "CustomResourceDefinition"),
        "{json_out}"
    );
    assert!(
        text.contains(&format!(
            "[BLOCKS] Deployment {ns}/nvidia-dra-driver-gpu-controller"
        )),
        "{text}"
    );
}
