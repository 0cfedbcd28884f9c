//! `adminAccess` on real Kubernetes with real kubelets: monitoring pods claim a
//! ComputeDomain's channel from a namespace labelled for admin access, one beside the
//! workload's pod and one on a node that holds no claim of the domain. Both run; the
//! ComputeDomain's status lists the workload's node alone all along; neither node joins
//! a domain for them; each admin pod gets the channel it was allocated.
//!
//! 1. The workload (one pod, on the first node); the domain Ready 1/1.
//! 2. The API server refuses `adminAccess` in a namespace without the label.
//! 3. The admin pods Running, their claims prepared; no status ever listed the second
//!    node, no node holds a domain for them, and the CDI specs hold the allocated
//!    channels.
//! 4. The workload goes while the admin pods run: the domain leaves its node and its
//!    status is vacated; the ComputeDomain is deleted (its finalizer released) with
//!    the admin pods still running; the admin pods go, and every CDI spec with them.
//!
//! Needs what `kubelet` needs (`../shared/kube`, root). Its nodes are its own:
//! `domaind-admin-1` and `-2` on 127.0.0.11 and .12, with a clique label of their own.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::time::Duration;

use domaind_kube_api::crd::ComputeDomain;
use domaind_testbed::rack::{LocalRack, node_view, short_temp_dir};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::kubelet::{
    FakeCluster, cdi_specs, create_from_yaml, pods_of, start_daemons, wait_registered, wait_running,
};
use domaind_e2e::cluster::{
    DRIVER, create_namespace, install_crd_and_device_classes, spawn_controller, wait_every,
    wait_for,
};
use domaind_kube_api::names::{DEFAULT_CHANNEL_DEVICE_CLASS, channel_of_device};

const CLIQUE_LABEL: &str = "nvidia.com/gpu.clique";
const CLIQUE: &str = "e2e-admin.1";
const CD_NAME: &str = "watched";
const ADMIN_LABEL: &str = "resource.kubernetes.io/admin-access";
const ADMIN_TEMPLATE: &str = "watch-channel";

fn compute_domain() -> Value {
    json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": CD_NAME},
        "spec": {
            "numNodes": 0,
            "channel": {"resourceClaimTemplate": {"name": format!("{CD_NAME}-rct")}},
        },
    })
}

/// A pod spec on `node` of this test's nodes, with the claim `cd` from `template`. No
/// GPUs, so that no other test's pods land on these nodes, nor these on theirs.
fn pod_spec(node: &str, template: &str) -> Value {
    json!({
        "resourceClaims": [{"name": "cd", "resourceClaimTemplateName": template}],
        "nodeSelector": {CLIQUE_LABEL: CLIQUE, "kubernetes.io/hostname": node},
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "ctr",
            "image": "ubuntu:22.04",
            "command": ["sleep", "infinity"],
            "resources": {"claims": [{"name": "cd"}]},
        }],
    })
}

fn workload(node: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "workload"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"job": "workload"}},
            "template": {
                "metadata": {"labels": {"job": "workload"}},
                "spec": pod_spec(node, &format!("{CD_NAME}-rct")),
            },
        },
    })
}

/// A monitoring pod's claim of the domain's channel: `adminAccess`, with the domain's
/// config, as an operator writes it in the monitoring namespace.
fn admin_template(cd_uid: &str) -> ResourceClaimTemplate {
    serde_json::from_value(json!({
        "metadata": {"name": ADMIN_TEMPLATE},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "channel", "exactly": {
                "deviceClassName": DEFAULT_CHANNEL_DEVICE_CLASS,
                "adminAccess": true,
            }}],
            "config": [{"requests": ["channel"], "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "resource.nvidia.com/v1beta1",
                    "kind": "ComputeDomainChannelConfig",
                    "domainID": cd_uid,
                },
            }}],
        }}},
    }))
    .unwrap()
}

fn admin_pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"job": "monitor"}},
        "spec": pod_spec(node, ADMIN_TEMPLATE),
    }))
    .unwrap()
}

async fn status_of(cds: &Api<ComputeDomain>) -> Value {
    cds.get_opt(CD_NAME)
        .await
        .unwrap()
        .and_then(|cd| cd.status)
        .map(|s| serde_json::to_value(s).unwrap())
        .unwrap_or(Value::Null)
}

fn listed(status: &Value) -> Vec<String> {
    status["nodes"]
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .filter_map(|n| n["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The channel devices a CDI spec gives its containers.
fn channels_in_spec(spec: &str) -> BTreeSet<u32> {
    spec.split("nvidia-caps-imex-channels/channel")
        .skip(1)
        .filter_map(|after| {
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// Each node's domains (uid and members) and claims, from its `/state`.
async fn node_domains(rack: &LocalRack) -> Vec<(Vec<(String, Vec<String>)>, Vec<String>)> {
    let mut out = Vec::new();
    for node in rack.nodes() {
        let view = node_view(node.info().unwrap()).await.unwrap();
        let domains = view
            .domains
            .iter()
            .map(|d| (d.uid.clone(), d.members.clone()))
            .collect();
        out.push((domains, view.claims));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with real kubelets, as root: KUBECONFIG and DOMAIND_E2E_KUBE_DIR (../shared/kube; docs/TESTING.md)"]
async fn an_admin_access_pod_runs_beside_the_workload_and_is_never_listed_among_the_domains_members()
 {
    let cluster =
        FakeCluster::start("domaind-admin", domaind_loopback::kubelets::ADMIN, CLIQUE).await;
    let (client, names, ips) = (
        cluster.client.clone(),
        cluster.names.clone(),
        cluster.ips.clone(),
    );
    install_crd_and_device_classes(&client).await;
    let id = std::process::id();
    let namespace = format!("domaind-admin-e2e-{id}");
    let monitoring = format!("domaind-admin-mon-{id}");
    let _cleared_on_panic = create_namespace(&client, &namespace).await;
    let _monitoring_cleared_on_panic = create_namespace(&client, &monitoring).await;
    let tmp = short_temp_dir("dmad").unwrap();
    let controller = spawn_controller(&domaind_e2e::binaries().domaind, &namespace, tmp.path());
    let (mut rack, _tokens) = start_daemons(&client, &names, &ips, tmp.path(), "admin-e2e").await;
    wait_registered(&client, &names, &rack).await;

    let cds = Api::<ComputeDomain>::namespaced(client.clone(), &namespace);
    let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
    let templates = Api::<ResourceClaimTemplate>::namespaced(client.clone(), &namespace);
    let monitor_pods = Api::<Pod>::namespaced(client.clone(), &monitoring);
    let monitor_claims = Api::<ResourceClaim>::namespaced(client.clone(), &monitoring);
    let monitor_templates = Api::<ResourceClaimTemplate>::namespaced(client.clone(), &monitoring);

    // 1. The domain and its workload, on the first node.
    create_from_yaml(&client, &namespace, &compute_domain()).await;
    wait_for("the controller creates the template", || async {
        let t = templates.get_opt(&format!("{CD_NAME}-rct")).await.unwrap();
        (t.is_some(), ())
    })
    .await;
    let cd_uid = cds.get(CD_NAME).await.unwrap().uid().unwrap();
    create_from_yaml(&client, &namespace, &workload(&names[0])).await;
    wait_running(&pods, "job=workload", 1, 1).await;
    wait_every(
        "the domain is Ready 1/1 on the first node",
        Duration::from_millis(100),
        || async {
            let s = status_of(&cds).await;
            (
                s["status"] == "Ready" && listed(&s) == [names[0].clone()],
                s,
            )
        },
    )
    .await;

    // 2. adminAccess needs the namespace's label: refused without it.
    let refused = monitor_templates
        .create(&PostParams::default(), &admin_template(&cd_uid))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains(ADMIN_LABEL), "{refused}");
    let label = json!({"metadata": {"labels": {ADMIN_LABEL: "true"}}});
    Api::<Namespace>::all(client.clone())
        .patch(&monitoring, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    monitor_templates
        .create(&PostParams::default(), &admin_template(&cd_uid))
        .await
        .unwrap();

    // 3. A monitoring pod beside the workload, and one where the domain has no pod.
    // Every status seen from here until the workload left lists the first node at most.
    // The status is written from gossip, so the proof that it never will list the
    // second node is that the second node advertises nothing: a node joins a domain
    // when it admits the claim, before the kubelet is answered, and stays in it while
    // the claim is held, so once the pod runs its /state shows any domain it joined.
    let statuses: RefCell<BTreeSet<Vec<String>>> = RefCell::default();
    for (pod, node) in [("monitor-beside", &names[0]), ("monitor-alone", &names[1])] {
        monitor_pods
            .create(&PostParams::default(), &admin_pod(pod, node))
            .await
            .unwrap();
    }
    let (_, admin_claims, _) = wait_every(
        "both monitoring pods run, their claims prepared as admin claims",
        Duration::from_millis(100),
        || async {
            let seen = listed(&status_of(&cds).await);
            statuses.borrow_mut().insert(seen);
            let running = pods_of(&monitor_pods, "job=monitor").await;
            let claims: Vec<ResourceClaim> = monitor_claims
                .list(&ListParams::default())
                .await
                .unwrap()
                .items;
            let held = node_domains(&rack).await;
            let prepared = claims.len() == 2
                && claims.iter().all(|c| {
                    let uid = c.uid().unwrap();
                    held.iter().any(|(_, claims)| claims.contains(&uid))
                });
            let done = running.len() == 2 && running.iter().all(|(_, _, p)| p == "Running");
            (done && prepared, (running, claims, held))
        },
    )
    .await;
    let held = node_domains(&rack).await;
    assert_eq!(
        held[0].0,
        [(cd_uid.clone(), vec![names[0].clone()])],
        "the first node holds the domain, alone in it: {held:?}"
    );
    assert!(
        held[1].0.is_empty(),
        "the second node joins nothing: {held:?}"
    );
    let status = status_of(&cds).await;
    assert!(
        status["status"] == "Ready" && status["readyNodes"] == json!(1),
        "{status}"
    );

    // Each admin pod's CDI spec holds the channel its claim was allocated: whichever
    // device the scheduler gave it, held by the workload or not.
    for claim in &admin_claims {
        let results = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.clone())
            .unwrap_or_default();
        assert_eq!(results.len(), 1, "{results:?}");
        assert_eq!(results[0].admin_access, Some(true), "{results:?}");
        let node = rack
            .nodes()
            .iter()
            .find(|n| n.name() == results[0].pool)
            .expect("allocated on a node of the test");
        let uid = claim.uid().unwrap();
        let file = cdi_specs(&node.cdi_dir())
            .into_iter()
            .find(|f| f.contains(&uid))
            .unwrap_or_else(|| panic!("{}: no CDI spec for {uid}", node.name()));
        let text = std::fs::read_to_string(node.cdi_dir().join(file)).unwrap();
        let allocated = channel_of_device(&results[0].device).expect("a channel device");
        assert_eq!(
            channels_in_spec(&text),
            BTreeSet::from([allocated]),
            "{text}"
        );
    }
    assert_eq!(
        cdi_specs(&rack.node(0).cdi_dir()).len(),
        2,
        "workload and monitor"
    );
    assert_eq!(
        cdi_specs(&rack.node(1).cdi_dir()).len(),
        1,
        "the monitor alone"
    );

    // 4. The workload goes: the domain leaves the first node although a monitoring pod
    // of it runs there, and the status is vacated.
    Api::<Deployment>::namespaced(client.clone(), &namespace)
        .delete("workload", &DeleteParams::default())
        .await
        .unwrap();
    wait_every(
        "the domain leaves its node and its status is vacated",
        Duration::from_millis(100),
        || async {
            let s = status_of(&cds).await;
            statuses.borrow_mut().insert(listed(&s));
            let held = node_domains(&rack).await;
            let left = pods_of(&pods, "job=workload").await;
            let vacated = s["status"] == "NotReady" && listed(&s).is_empty();
            (
                vacated && left.is_empty() && held.iter().all(|(d, _)| d.is_empty()),
                (s, held, left),
            )
        },
    )
    .await;
    assert_eq!(
        statuses.into_inner(),
        BTreeSet::from([vec![], vec![names[0].clone()]]),
        "the domain's status listed the workload's node, then none; never another"
    );
    cds.delete(CD_NAME, &DeleteParams::default()).await.unwrap();
    wait_for(
        "the ComputeDomain is gone, monitoring pods still running",
        || async {
            let cd = cds.get_opt(CD_NAME).await.unwrap();
            let monitors = pods_of(&monitor_pods, "job=monitor").await;
            let running = monitors.iter().filter(|(_, _, p)| p == "Running").count();
            (
                cd.is_none() && running == 2,
                (cd.map(|c| c.metadata.finalizers), monitors),
            )
        },
    )
    .await;
    monitor_pods
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    wait_for("every claim unprepared", || async {
        let specs: Vec<Vec<String>> = rack
            .nodes()
            .iter()
            .map(|n| cdi_specs(&n.cdi_dir()))
            .collect();
        let held = node_domains(&rack).await;
        let done = specs.iter().all(Vec::is_empty) && held.iter().all(|(_, c)| c.is_empty());
        (done, (specs, held))
    })
    .await;

    rack.stop_all(Duration::from_secs(20));
    assert!(rack.unexpected_exits().is_empty());
    drop(controller);
    if std::env::var("DOMAIND_E2E_KEEP").as_deref() != Ok("1") {
        for ns in [&namespace, &monitoring] {
            Api::<Namespace>::all(client.clone())
                .delete(ns, &DeleteParams::default())
                .await
                .unwrap();
        }
    }
}
