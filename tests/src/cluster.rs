//! What the end-to-end tests against a real API server share: reading the repository's
//! manifests, applying cluster objects, waiting for what the API shows, and deciding
//! whether to run at all.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// Bounds every wait: a step that takes longer fails the test with what was last seen.
pub const LIMIT: Duration = Duration::from_secs(120);
pub const MANAGER: &str = "domaind-e2e";
pub const DRIVER: &str = "compute-domain.nvidia.com";

/// Fails the test unless `KUBECONFIG` and each of `needs` are set. The tests that call
/// it are `#[ignore]`d with the reason, so a plain `cargo test` reports them as not
/// run; `cargo test -- --ignored` runs them, and then a missing variable is a failure,
/// never a skip.
pub fn require(needs: &[&str]) {
    let missing: Vec<&str> = std::iter::once("KUBECONFIG")
        .chain(needs.iter().copied())
        .filter(|name| std::env::var_os(name).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "this end-to-end test needs {missing:?}: start ../shared/kube \
         (eval \"$(../shared/kube/up.sh)\") and set them as docs/TESTING.md says"
    );
}

pub fn env_list(name: &str) -> Option<Vec<String>> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_owned()).collect())
}

pub fn repo_file(path: &str) -> String {
    let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// Every document of a YAML file, as JSON.
pub fn documents(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(yaml)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// Probes until `probe` says done, every `every`, for at most [`LIMIT`].
pub async fn wait_every<T: std::fmt::Debug, F: std::future::Future<Output = (bool, T)>>(
    what: &str,
    every: Duration,
    mut probe: impl FnMut() -> F,
) -> T {
    let last_seen = RefCell::new(None);
    domaind_testkit::poll_until_every(every, LIMIT, || {
        let probed = probe();
        let last_seen = &last_seen;
        async move {
            let (done, seen) = probed.await;
            if done {
                Some(seen)
            } else {
                last_seen.replace(Some(seen));
                None
            }
        }
    })
    .await
    .unwrap_or_else(|| {
        // Not done by the limit means it looked at least once.
        let seen = last_seen.into_inner().expect("a look before the limit");
        panic!("timed out after {LIMIT:?} waiting until {what}; last seen: {seen:#?}")
    })
}

/// [`wait_every`] at a pace a shared API server bears.
pub async fn wait_for<T: std::fmt::Debug, F: std::future::Future<Output = (bool, T)>>(
    what: &str,
    probe: impl FnMut() -> F,
) -> T {
    wait_every(what, Duration::from_millis(250), probe).await
}

/// Server-side applies every cluster-scoped CRD and DeviceClass of `yaml`.
pub async fn apply_cluster_objects(client: &Client, yaml: &str) {
    for document in documents(yaml) {
        let kind = document["kind"].as_str().unwrap_or_default().to_owned();
        let name = document["metadata"]["name"].as_str().unwrap().to_owned();
        let params = PatchParams::apply(MANAGER).force();
        match kind.as_str() {
            "CustomResourceDefinition" => {
                Api::<CustomResourceDefinition>::all(client.clone())
                    .patch(&name, &params, &Patch::Apply(&document))
                    .await
                    .unwrap();
            }
            "DeviceClass" => {
                Api::<DeviceClass>::all(client.clone())
                    .patch(&name, &params, &Patch::Apply(&document))
                    .await
                    .unwrap();
            }
            _ => {}
        }
    }
}

/// The CRD and DeviceClasses of `deploy/`, and the CRD established.
pub async fn install_crd_and_device_classes(client: &Client) {
    apply_cluster_objects(
        client,
        &repo_file("deploy/crds/computedomains.resource.nvidia.com.yaml"),
    )
    .await;
    apply_cluster_objects(client, &repo_file("deploy/deviceclasses.yaml")).await;
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    wait_for("the CRD is established", || async {
        let crd = crds.get("computedomains.resource.nvidia.com").await.ok();
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

/// `KUBECONFIG` for a process: the ServiceAccount's from `var` when set (the chart's
/// ServiceAccounts, from `tests/e2e/sa-kubeconfigs.sh`), else the test's own.
pub fn kubeconfig_for(var: &str) -> Vec<(String, String)> {
    std::env::var(var)
        .ok()
        .map(|path| vec![("KUBECONFIG".to_owned(), path)])
        .unwrap_or_default()
}

/// The scheduler's part: a claim from the template, allocated on `node`.
pub async fn allocate_claim(
    client: &Client,
    namespace: &str,
    template: &ResourceClaimTemplate,
    name: &str,
    node: &str,
) -> ResourceClaim {
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), namespace);
    let spec = serde_json::to_value(&template.spec.spec).unwrap();
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }))
    .unwrap();
    let claim = claims.create(&PostParams::default(), &claim).await.unwrap();
    let config: Vec<Value> = spec["devices"]["config"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|mut c| {
            c["source"] = json!("FromClaim");
            c
        })
        .collect();
    let status = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"driver": DRIVER, "pool": node, "device": "channel-0", "request": "channel"}],
                    "config": config,
                },
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}
                ]}]},
            },
            "reservedFor": [{"resource": "pods", "name": format!("{name}-pod"), "uid": format!("00000000-0000-4000-8000-{:012}", name.len())}],
        }
    });
    claims
        .patch_status(
            &claim.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&status),
        )
        .await
        .unwrap()
}

/// A `domaind controller` process, stopped with SIGTERM when dropped (a failing test
/// too), so that it releases its Lease for the next test's and leaves nothing behind.
#[derive(Debug)]
pub struct Controller(std::process::Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn spawn_controller(
    domaind: &std::path::Path,
    namespace: &str,
    log_dir: &std::path::Path,
) -> Controller {
    let kubeconfig = kubeconfig_for("DOMAIND_E2E_CONTROLLER_KUBECONFIG");
    let lease_namespace: &[&str] = if kubeconfig.is_empty() {
        &["--lease-namespace", namespace]
    } else {
        &[]
    };
    std::process::Command::new(domaind)
        .args(["controller", "--http-addr", "127.0.0.1:0"])
        .args(lease_namespace)
        .envs(kubeconfig)
        .stdout(std::fs::File::create(log_dir.join("controller.log")).unwrap())
        .stderr(std::fs::File::create(log_dir.join("controller.err")).unwrap())
        .spawn()
        .map(Controller)
        .unwrap()
}

/// A `domaind controller` with `args` (after `controller --http-addr 127.0.0.1:0`),
/// logging to `log_dir/<name>.log` and `.err`.
pub fn spawn_controller_with(
    domaind: &std::path::Path,
    args: &[String],
    kubeconfig: Vec<(String, String)>,
    log_dir: &std::path::Path,
    name: &str,
) -> Controller {
    std::process::Command::new(domaind)
        .args(["controller", "--http-addr", "127.0.0.1:0"])
        .args(args)
        .envs(kubeconfig)
        .stdout(std::fs::File::create(log_dir.join(format!("{name}.log"))).unwrap())
        .stderr(std::fs::File::create(log_dir.join(format!("{name}.err"))).unwrap())
        .spawn()
        .map(Controller)
        .unwrap()
}

/// A namespace of the test's own.
pub async fn create_namespace(client: &Client, name: &str) -> TestNamespace {
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
        )
        .await
        .unwrap();
    TestNamespace {
        name: name.to_owned(),
    }
}

/// A test's namespace. Should the test panic, dropping this clears what it left there,
/// so that the next run on the same cluster finds the nodes' devices free: its pods
/// force-deleted (which releases their claims' allocations), its ComputeDomains'
/// finalizers removed (their controller died with the test), the namespace deleted. A
/// test that ends well deletes the namespace itself, checking the teardown on the way.
/// `DOMAIND_E2E_KEEP=1` leaves it, as evidence.
#[must_use = "the namespace is cleared when this guard drops during a panic"]
#[derive(Debug)]
pub struct TestNamespace {
    name: String,
}

impl TestNamespace {
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if !std::thread::panicking() || std::env::var("DOMAIND_E2E_KEEP").as_deref() == Ok("1") {
            return;
        }
        let namespace = self.name.as_str();
        let kubectl = |args: &[&str]| {
            std::process::Command::new("kubectl")
                .args(["--namespace", namespace])
                .args(args)
                .stdin(std::process::Stdio::null())
                .output()
        };
        let _ = kubectl(&[
            "delete",
            "pods",
            "--all",
            "--force",
            "--grace-period=0",
            "--wait=false",
        ]);
        if let Ok(listed) = kubectl(&["get", "computedomains", "--output=name"]) {
            for domain in String::from_utf8_lossy(&listed.stdout).lines() {
                let _ = kubectl(&[
                    "patch",
                    domain,
                    "--type=merge",
                    "--patch",
                    r#"{"metadata":{"finalizers":null}}"#,
                ]);
            }
        }
        let _ = kubectl(&["delete", "namespace", namespace, "--wait=false"]);
        eprintln!("the test panicked: cleared and deleted namespace {namespace}");
    }
}

/// Waits for a `NodeLost` event on the ComputeDomain `cd_uid` that names `node`.
pub async fn wait_node_lost_event(client: &Client, namespace: &str, cd_uid: &str, node: &str) {
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), namespace);
    wait_for("a NodeLost event names the node", || async {
        let list = events.list(&Default::default()).await.unwrap();
        let found = list.items.iter().any(|e| {
            e.reason.as_deref() == Some("NodeLost")
                && e.involved_object.uid.as_deref() == Some(cd_uid)
                && e.message.as_deref().is_some_and(|m| m.contains(node))
        });
        let seen: Vec<_> = list
            .items
            .iter()
            .map(|e| (e.reason.clone(), e.message.clone()))
            .collect();
        (found, seen)
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_wait_looks_at_its_pace_until_done() {
        let started = tokio::time::Instant::now();
        let mut looks = 0;
        let seen = wait_every("the third look", Duration::from_secs(1), || {
            looks += 1;
            let look = looks;
            async move { (look == 3, look) }
        })
        .await;
        assert_eq!(seen, 3);
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "waiting until what never comes; last seen: \"not yet\"")]
    async fn a_wait_that_times_out_shows_what_it_last_saw() {
        wait_for("what never comes", || async { (false, "not yet") }).await;
    }
}
