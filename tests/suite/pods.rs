//! The chaos harness's [`PodAccess`] against the real API server and real kubelets: a
//! DaemonSet and a Deployment whose pods carry the Helm chart's labels stand for an
//! installed chart (the fake runtime "runs" any image), on two fake nodes of this
//! test's own.
//!
//! 1. Before any pod exists, `start` fails naming both nodes, the selector and the
//!    namespace; once the pods run, it passes (and still names a node it is asked
//!    about that has none).
//! 2. `daemon` finds each node's pod; `delete_daemon` deletes it and the DaemonSet's
//!    replacement is seen under a new id, the other node's untouched.
//! 3. `restart_controller` deletes the controller pod, and `controllers` sees its
//!    replacement.
//! 4. `state` and `stop_imex` fail, fast and saying what was refused: this runtime
//!    implements neither port-forward nor exec.
//!
//! Needs `../shared/kube` and root, as `kubelet` does: runs when `KUBECONFIG` and
//! `DOMAIND_E2E_KUBE_DIR` are set. Its nodes are `domaind-pods-1` and `-2` on
//! 127.0.0.41 and .42, tainted so that no other test's pods land there.

use std::time::{Duration, Instant};

use domaind_chaos::cluster::access::ClusterAccess;
use domaind_chaos::cluster::pods::{PodAccess, PodAccessConfig};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use domaind_e2e::cluster::{create_namespace, wait_for};

use crate::kubelet::FakeCluster;

const CLIQUE: &str = "domaind-pods";
const RELEASE: &str = "domaind-pods";
const TAINT: &str = "e2e.domaind.dev/pods";
/// The bound given to each port-forward and exec.
const TIMEOUT: Duration = Duration::from_secs(10);
/// How long the namespace may take to go at the end.
const CLEANUP_LIMIT: Duration = Duration::from_secs(60);

/// The chart's labels for `component`, as `deploy/helm/domaind` sets them.
fn labels(component: &str) -> Value {
    json!({
        "app.kubernetes.io/name": "domaind",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": component,
    })
}

/// A pod template on this test's nodes alone, with one container named as the
/// chart's.
fn template(component: &str, container: &str) -> Value {
    json!({
        "metadata": {"labels": labels(component)},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.clique": CLIQUE},
            "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": container, "image": "domaind.invalid/domaind:e2e"}],
        },
    })
}

fn selector(component: &str) -> Value {
    json!({"matchLabels": {
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": component,
    }})
}

/// Deletes the namespace when dropped, unless `DOMAIND_E2E_KEEP=1`, and waits (bounded)
/// until it is gone: dropped before the nodes, so that their kubelets still run to end
/// its pods.
struct NamespaceGuard {
    client: Client,
    name: String,
}

impl Drop for NamespaceGuard {
    fn drop(&mut self) {
        if std::env::var("DOMAIND_E2E_KEEP").as_deref() == Ok("1") {
            return;
        }
        let namespaces = Api::<Namespace>::all(self.client.clone());
        let name = self.name.clone();
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async move {
                let _ = namespaces.delete(&name, &DeleteParams::default()).await;
                let deadline = Instant::now() + CLEANUP_LIMIT;
                while Instant::now() < deadline
                    && !matches!(namespaces.get_opt(&name).await, Ok(None))
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        });
    }
}

/// Polls `access.daemon(node)` until it gives an instance whose id `accept` takes.
async fn wait_daemon(
    access: &PodAccess,
    node: &str,
    what: &str,
    accept: impl Fn(&str) -> bool,
) -> String {
    let accept = &accept;
    let seen = wait_for(what, || {
        let mut access = access.clone();
        async move {
            let seen = access.daemon(node).await.unwrap();
            let id = seen.map(|d| d.id);
            (id.as_deref().is_some_and(accept), id)
        }
    })
    .await;
    seen.expect("accepted")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with real kubelets, as root: KUBECONFIG and DOMAIND_E2E_KUBE_DIR (../shared/kube; docs/TESTING.md)"]
async fn pod_access_finds_deletes_and_restarts_the_charts_pods() {
    let cluster =
        FakeCluster::start("domaind-pods", domaind_loopback::kubelets::PODS, CLIQUE).await;
    let (client, names) = (cluster.client.clone(), cluster.names.clone());
    let nodes = Api::<Node>::all(client.clone());
    let taint =
        json!({"spec": {"taints": [{"key": TAINT, "value": "e2e", "effect": "NoSchedule"}]}});
    for name in &names {
        nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&taint))
            .await
            .unwrap();
    }
    let namespace = format!("domaind-pods-{}", std::process::id());
    let _cleared_on_panic = create_namespace(&client, &namespace).await;
    let _namespace = NamespaceGuard {
        client: client.clone(),
        name: namespace.clone(),
    };
    let config = PodAccessConfig {
        timeout: TIMEOUT,
        ..PodAccessConfig::chart(&namespace, Some(RELEASE))
    };
    let mut access = PodAccess::new(client.clone(), config);
    let described = access.describe();
    assert!(described.contains(&namespace), "{described}");
    assert!(described.contains("port-forward"), "{described}");
    assert_eq!(
        access.controller_lease(),
        (namespace.clone(), "domaind-controller".to_owned())
    );

    // 1. No pods yet: start says where it looked and which nodes lack a daemon.
    let error = access.start(&names).await.unwrap_err().to_string();
    for wanted in [
        "no Running, Ready daemon pod on node(s) domaind-pods-1, domaind-pods-2",
        "app.kubernetes.io/component=node,app.kubernetes.io/instance=domaind-pods",
        &format!("namespace {namespace}"),
        "no Ready controller pod",
    ] {
        assert!(error.contains(wanted), "{wanted:?} not in: {error}");
    }

    let params = PostParams::default();
    let daemonset: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "domaind-node", "labels": labels("node")},
        "spec": {"selector": selector("node"), "template": template("node", "domaind")},
    }))
    .unwrap();
    Api::<DaemonSet>::namespaced(client.clone(), &namespace)
        .create(&params, &daemonset)
        .await
        .unwrap();
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "domaind-controller", "labels": labels("controller")},
        "spec": {
            "replicas": 1,
            "selector": selector("controller"),
            "template": template("controller", "controller"),
        },
    }))
    .unwrap();
    Api::<Deployment>::namespaced(client.clone(), &namespace)
        .create(&params, &deployment)
        .await
        .unwrap();

    wait_for("start passes once the chart's pods run", || {
        let mut access = access.clone();
        let names = names.clone();
        async move {
            let outcome = access.start(&names).await;
            (outcome.is_ok(), outcome.err().map(|e| e.to_string()))
        }
    })
    .await;
    let mut asked = names.clone();
    asked.push("domaind-pods-absent".into());
    let error = access.start(&asked).await.unwrap_err().to_string();
    assert!(
        error.contains("daemon pod on node(s) domaind-pods-absent ("),
        "{error}"
    );
    assert!(!error.contains("controller"), "{error}");

    // 2. Each node's daemon is its own pod; deleting one brings a new one.
    let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
    let mut ids = Vec::new();
    for name in &names {
        let daemon = access.daemon(name).await.unwrap().unwrap();
        assert_eq!(daemon.restarts, 0, "{daemon:?}");
        let (pod, uid) = daemon.id.split_once('/').unwrap();
        let pod = pods.get(pod).await.unwrap();
        assert_eq!(pod.uid().as_deref(), Some(uid));
        assert_eq!(
            pod.spec.as_ref().unwrap().node_name.as_deref(),
            Some(name.as_str())
        );
        ids.push(daemon.id);
    }
    assert_ne!(ids[0], ids[1]);
    assert_eq!(access.daemon("domaind-pods-absent").await.unwrap(), None);

    access.delete_daemon(&names[0]).await.unwrap();
    let old = ids[0].clone();
    let new = wait_daemon(
        &access,
        &names[0],
        "the DaemonSet replaces the deleted daemon pod",
        |id| id != old,
    )
    .await;
    assert_ne!(new, ids[0]);
    let other = access.daemon(&names[1]).await.unwrap().unwrap();
    assert_eq!(other.id, ids[1], "the other node's daemon is untouched");

    // 3. The controller restarted: its pod deleted, a new one Ready.
    let before = access.controllers().await.unwrap();
    assert_eq!(before.len(), 1, "{before:?}");
    let restarted = access.restart_controller().await.unwrap();
    assert_eq!(restarted, before);
    wait_for("a new controller pod is Ready", || {
        let mut access = access.clone();
        let before = before.clone();
        async move {
            let now = access.controllers().await.unwrap();
            let replaced = now.len() == 1 && !now.iter().any(|n| before.contains(n));
            (replaced, now)
        }
    })
    .await;

    // 4. No port-forward and no exec in this runtime: both fail at once, saying so.
    let pod = new.split_once('/').unwrap().0.to_owned();
    let asked = Instant::now();
    let error = format!("{:#}", access.state(&names[0]).await.unwrap_err());
    let took = asked.elapsed();
    assert!(
        error.contains(&format!("port-forward to pod {namespace}/{pod} port 9466")),
        "{error}"
    );
    // What the API server relays from this runtime, which implements no streaming.
    assert!(error.contains("URL is not set"), "{error}");
    assert!(
        !error.contains("took over"),
        "refused, not timed out: {error}"
    );
    assert!(took < TIMEOUT, "{took:?}: {error}");
    eprintln!("state, refused in {took:?}: {error}");

    let asked = Instant::now();
    let error = format!("{:#}", access.stop_imex(&names[0]).await.unwrap_err());
    let took = asked.elapsed();
    assert!(
        error.contains(&format!(
            "exec of `domaind imex kill` in pod {namespace}/{pod} (container domaind)"
        )),
        "{error}"
    );
    assert!(error.contains("URL is not set"), "{error}");
    assert!(
        !error.contains("took over"),
        "refused, not timed out: {error}"
    );
    assert!(took < TIMEOUT, "{took:?}: {error}");
    eprintln!("stop_imex, refused in {took:?}: {error}");

    access.stop().await;
}
