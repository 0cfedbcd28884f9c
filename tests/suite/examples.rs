//! The acceptance examples of `deploy/examples/` on the real API server: every object of
//! every example is applied as a server-side dry run (field validation strict, so an
//! unknown or misspelt field is a refusal, not a warning) after our CRD and
//! DeviceClasses are installed. They need GPUs to run; this is what can be checked
//! without them: the API server accepts them as written, and each workload claims the
//! channel of a ComputeDomain of its own file.
//!
//! The MPI Operator is not part of `../shared/kube`: a minimal MPIJob CRD of ours
//! (`tests/fixtures/mpijob-crd.yaml`, the fields the example sets typed as the
//! operator's API defines them, pod templates left open) is applied first.
//!
//! Needs `KUBECONFIG`.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::core::params::ValidationDirective;
use kube::discovery::{Scope, pinned_kind};
use serde_json::{Value, json};

use domaind_e2e::cluster::{
    MANAGER, apply_cluster_objects, create_namespace, documents, install_crd_and_device_classes,
    repo_file, require, wait_for,
};

const MPIJOB_CRD: &str = "mpijobs.kubeflow.org";

fn examples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    files
}

/// Every value of `key` anywhere in `value`.
fn values_of<'a>(value: &'a Value, key: &str, found: &mut Vec<&'a str>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if k == key
                    && let Some(s) = v.as_str()
                {
                    found.push(s);
                }
                values_of(v, key, found);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| values_of(v, key, found)),
        _ => {}
    }
}

/// What is wrong with one example file as a whole, without a cluster: it holds a
/// ComputeDomain, its workload claims from a template one of them names, and every
/// template claimed is one a ComputeDomain of the file names.
fn check_claims_follow_domains(file: &str, docs: &[Value]) -> Vec<String> {
    let domains: Vec<&str> = docs
        .iter()
        .filter(|d| d["kind"] == "ComputeDomain")
        .filter_map(|d| d["spec"]["channel"]["resourceClaimTemplate"]["name"].as_str())
        .collect();
    let mut claimed = Vec::new();
    for doc in docs.iter().filter(|d| d["kind"] != "ComputeDomain") {
        values_of(doc, "resourceClaimTemplateName", &mut claimed);
    }
    let mut problems = Vec::new();
    if domains.is_empty() {
        problems.push(format!("{file}: no ComputeDomain naming a claim template"));
    }
    if claimed.is_empty() {
        problems.push(format!(
            "{file}: no workload claims a ComputeDomain's channel"
        ));
    }
    for name in claimed {
        if !domains.contains(&name) {
            problems.push(format!(
                "{file}: a workload claims from template {name}, which no ComputeDomain of the file names ({domains:?})"
            ));
        }
    }
    problems
}

/// A server-side dry run of `doc` in `namespace` (when the kind is namespaced): the
/// API server's refusal, if any.
async fn dry_run(client: &Client, namespace: &str, doc: &Value) -> Result<(), String> {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, capabilities) = pinned_kind(client, &gvk)
        .await
        .map_err(|e| format!("{api_version} {kind} is not served: {e}"))?;
    let api: Api<DynamicObject> = match capabilities.scope {
        Scope::Namespaced => Api::namespaced_with(client.clone(), namespace, &resource),
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let name = doc["metadata"]["name"].as_str().unwrap_or_default();
    let params = PatchParams {
        dry_run: true,
        force: true,
        field_manager: Some(MANAGER.to_owned()),
        field_validation: Some(ValidationDirective::Strict),
    };
    api.patch(name, &params, &Patch::Apply(doc))
        .await
        .map(|_| ())
        .map_err(|e| format!("{kind} {name}: {e}"))
}

async fn install_mpijob_crd(client: &Client) {
    apply_cluster_objects(client, &repo_file("tests/fixtures/mpijob-crd.yaml")).await;
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    wait_for("the MPIJob CRD is established", || async {
        let crd = crds.get(MPIJOB_CRD).await.ok();
        let established = crd
            .as_ref()
            .and_then(|c| c.status.as_ref()?.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        (established, crd.map(|c| c.status))
    })
    .await;
}

#[tokio::test]
#[ignore = "needs a cluster: KUBECONFIG of a real API server (../shared/kube; docs/TESTING.md)"]
async fn every_example_is_accepted_by_the_api_server_as_a_dry_run() {
    require(&[]);
    let client = Client::try_default().await.unwrap();
    install_crd_and_device_classes(&client).await;
    install_mpijob_crd(&client).await;
    let namespace = format!("examples-{}", std::process::id());
    let _cleared_on_panic = create_namespace(&client, &namespace).await;

    let files = examples();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for wanted in [
        "nvidia-blog-18-pods.yaml",
        "coreweave-mpijob-rack.yaml",
        "nvbandwidth-check.yaml",
    ] {
        assert!(
            names.iter().any(|n| n == wanted),
            "{wanted} missing from {names:?}"
        );
    }

    let mut refused = Vec::new();
    let mut applied = Vec::new();
    for (file, name) in files.iter().zip(&names) {
        let docs = documents(&std::fs::read_to_string(file).unwrap());
        refused.extend(check_claims_follow_domains(name, &docs));
        for doc in &docs {
            match dry_run(&client, &namespace, doc).await {
                Ok(()) => applied.push(format!(
                    "{name}: {} {}",
                    doc["kind"], doc["metadata"]["name"]
                )),
                Err(why) => refused.push(format!("{name}: {why}")),
            }
        }
    }

    // The same path refuses what the API server would: a misspelt field of a
    // ComputeDomain, and an MPIJob whose replicas are not a number. Without these, a dry
    // run that validated nothing would pass.
    let misspelt = json!({
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
        "metadata": {"name": "misspelt"},
        "spec": {"numNodes": 0, "channel": {"resourceClaimTemplat": {"name": "x"}}}
    });
    let bad_mpijob = json!({
        "apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
        "metadata": {"name": "bad"},
        "spec": {"mpiReplicaSpecs": {"Worker": {"replicas": "eighteen"}}}
    });
    let misspelt_answer = dry_run(&client, &namespace, &misspelt).await;
    let bad_mpijob_answer = dry_run(&client, &namespace, &bad_mpijob).await;

    Api::<Namespace>::all(client.clone())
        .delete(&namespace, &DeleteParams::default())
        .await
        .unwrap();

    assert!(
        refused.is_empty(),
        "refused: {refused:#?}\naccepted: {applied:#?}"
    );
    assert!(
        misspelt_answer
            .as_ref()
            .is_err_and(|e| e.contains("resourceClaimTemplat")),
        "a misspelt ComputeDomain field was not refused: {misspelt_answer:?}"
    );
    assert!(
        bad_mpijob_answer.is_err(),
        "an MPIJob with replicas \"eighteen\" was not refused"
    );
    // Every object of every file was tried: a ComputeDomain and a workload at least each.
    assert!(applied.len() >= 2 * files.len(), "{applied:#?}");
}

#[test]
fn a_workload_claiming_a_template_no_domain_names_is_found() {
    let docs = documents(
        "kind: ComputeDomain\nspec: {channel: {resourceClaimTemplate: {name: a}}}\n---\n\
         kind: Deployment\nspec: {template: {spec: {resourceClaims: [{name: c, resourceClaimTemplateName: b}]}}}\n",
    );
    let problems = check_claims_follow_domains("f.yaml", &docs);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("template b"), "{problems:?}");
    let fixed = documents(
        "kind: ComputeDomain\nspec: {channel: {resourceClaimTemplate: {name: b}}}\n---\n\
         kind: Deployment\nspec: {template: {spec: {resourceClaims: [{name: c, resourceClaimTemplateName: b}]}}}\n",
    );
    assert!(check_claims_follow_domains("f.yaml", &fixed).is_empty());
}
