//! The IMEX-failing taint on real Kubernetes with the real scheduler and kubelets (issue
//! 31, part 3), and the figures behind the binding-conditions decision (part 6).
//!
//! Two fake nodes of a clique of their own (`domaind-taint-1` and `-2` on 127.0.0.43
//! and .44, node-tainted so that no other test's pods land there), a daemon each with
//! `--imex-untaint-after 10s` (the taint after the default 5 s), and `isolation:
//! Channel` ComputeDomains, so that one node can hold pods of several domains and the
//! scheduler has a real choice for each new pod.
//!
//! 1. Domain `held` runs a pod on each node. Baseline: a batch of pods of domain
//!    `healthy`, every node healthy: where they land, how long to Running; deleted.
//! 2. Node 1's IMEX is killed and kept down (its port taken, as the IMEX-failing test
//!    does). At once a batch of pods of domain `late` (the "window": created before the
//!    taint can exist). Node 1's ResourceSlice gets `<driver>/imex-failing:NoSchedule`
//!    on every device, a `ChannelsTainted` event on its Node and `domaind_imex_tainted`
//!    1; node 2's stays untainted.
//! 3. While tainted: a batch of pods of `late`: none on node 1; a pod preferring node 1
//!    (node affinity, weight 100) runs on node 2. The same with claims that tolerate the
//!    taint: some land on node 1, and the tolerating pod that prefers it does (so the
//!    preference is real, and the taint is what moved the other).
//! 4. The port is freed: IMEX recovers, the taint goes (`ChannelsUntainted`), and every
//!    pod that landed on node 1 runs.
//!
//! Prints `FIGURE taints ...` lines (docs/BENCHMARKS.md). `DOMAIND_E2E_TAINT_PODS` sets
//! each batch's size (default 4), `DOMAIND_E2E_TAINT_AFTER_MS` the daemons'
//! `--imex-taint-after` (default theirs, 5 s).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use domaind_testbed::rack::{LocalRack, http_get, short_temp_dir};
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceToleration, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::kubelet::{FakeCluster, create_from_yaml, start_daemons_with, wait_registered};
use domaind_e2e::cluster::{
    DRIVER, create_namespace, install_crd_and_device_classes, spawn_controller, wait_every,
    wait_for,
};

const CLIQUE: &str = "e2e-taint.1";
const CLIQUE_LABEL: &str = "nvidia.com/gpu.clique";
/// On this test's Nodes, so that only its pods land there.
const NODE_TAINT: &str = "e2e.domaind.dev/taints";
const IMEX_TAINT: &str = "compute-domain.nvidia.com/imex-failing";
const VICTIM: usize = 0;

fn compute_domain(name: &str) -> Value {
    json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": name},
        "spec": {
            "numNodes": 0,
            "isolation": "Channel",
            "channel": {
                "resourceClaimTemplate": {"name": format!("{name}-rct")},
                "allocationMode": "Single",
            },
        },
    })
}

/// Where a pod's claim comes from.
enum Claim<'a> {
    /// A claim of its own from the domain's template.
    Template(&'a str),
    /// A claim made beforehand (one that tolerates the taint).
    Named(&'a str),
}

/// A pod on this test's nodes, with one channel claim; preferring `prefer` if given.
fn pod(name: &str, batch: &str, claim: &Claim, prefer: Option<&str>) -> Pod {
    let claim = match claim {
        Claim::Template(domain) => {
            json!({"name": "cd", "resourceClaimTemplateName": format!("{domain}-rct")})
        }
        Claim::Named(claim) => json!({"name": "cd", "resourceClaimName": claim}),
    };
    let mut spec = json!({
        "resourceClaims": [claim],
        "nodeSelector": {CLIQUE_LABEL: CLIQUE},
        "tolerations": [{"key": NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "ctr",
            "image": "ubuntu:22.04",
            "command": ["sleep", "infinity"],
            "resources": {"claims": [{"name": "cd"}]},
        }],
    });
    if let Some(node) = prefer {
        spec["affinity"] = json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "preference": {"matchExpressions": [{
                "key": "kubernetes.io/hostname", "operator": "In", "values": [node],
            }]},
        }]}});
    }
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"batch": batch}},
        "spec": spec,
    }))
    .unwrap()
}

/// A node's channel devices: how many, and how many carry the IMEX taint (NoSchedule),
/// with its value.
async fn devices_of(client: &Client, node: &str) -> (usize, usize, Option<String>) {
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node},spec.driver={DRIVER}")))
        .await
        .unwrap();
    let devices: Vec<_> = slices
        .items
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .collect();
    let ours: Vec<_> = devices
        .iter()
        .flat_map(|d| d.taints.iter().flatten())
        .filter(|t| t.key == IMEX_TAINT && t.effect == "NoSchedule")
        .collect();
    let value = ours.first().and_then(|t| t.value.clone());
    (devices.len(), ours.len(), value)
}

/// The reasons of the events recorded on Node `node` by our daemons.
async fn node_events(client: &Client, node: &str) -> Vec<String> {
    Api::<Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default().fields(&format!(
            "involvedObject.kind=Node,involvedObject.name={node}"
        )))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reporting_component.as_deref() == Some("domaind"))
        .filter_map(|e| e.reason)
        .collect()
}

async fn metric(rack: &LocalRack, node: usize, name: &str) -> Option<f64> {
    let (_, text) = http_get(rack.node(node).info().unwrap().http_addr, "/metrics")
        .await
        .ok()?;
    text.lines()
        .find(|l| l.split([' ', '{']).next() == Some(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// A batch of pods: their names and when they were created.
struct Batch {
    label: String,
    names: Vec<String>,
    created: Instant,
}

async fn create_batch(pods: &Api<Pod>, label: &str, claims: &[Claim<'_>]) -> Batch {
    let created = Instant::now();
    let mut names = Vec::new();
    for (i, claim) in claims.iter().enumerate() {
        let name = format!("{label}-{i}");
        pods.create(&PostParams::default(), &pod(&name, label, claim, None))
            .await
            .unwrap();
        names.push(name);
    }
    Batch {
        label: label.into(),
        names,
        created,
    }
}

/// Each pod's node once the scheduler has bound it.
async fn placed(pods: &Api<Pod>, names: &[String]) -> BTreeMap<String, String> {
    wait_for("every pod of the batch is bound to a node", || async {
        let mut nodes = BTreeMap::new();
        for name in names {
            let pod = pods.get(name).await.unwrap();
            if let Some(node) = pod.spec.and_then(|s| s.node_name) {
                nodes.insert(name.clone(), node);
            }
        }
        (nodes.len() == names.len(), nodes)
    })
    .await
}

fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// How long pods may take to run: a kubelet whose prepare failed (the node's IMEX not
/// ready) tries again at its next pod sync, up to a minute later, so one failure more
/// than [`LIMIT`](domaind_e2e::cluster::LIMIT) can bear.
const RUN_LIMIT: Duration = Duration::from_secs(240);

/// Polls until every pod of `names` runs; returns when each was first seen running.
async fn wait_running(pods: &Api<Pod>, names: &[String], what: &str) -> BTreeMap<String, Instant> {
    let mut seen = BTreeMap::new();
    let waited = domaind_testkit::poll_every(Duration::from_millis(100), RUN_LIMIT, async || {
        let mut waiting = Vec::new();
        for name in names {
            if seen.contains_key(name) {
                continue;
            }
            if running(&pods.get(name).await.unwrap()) {
                seen.insert(name.clone(), Instant::now());
            } else {
                waiting.push(name.clone());
            }
        }
        if waiting.is_empty() {
            Ok(())
        } else {
            Err(waiting)
        }
    })
    .await;
    if let Err(waiting) = waited {
        panic!("not within {RUN_LIMIT:?}: {what}; still waiting for {waiting:?}");
    }
    seen
}

/// Where a batch landed and how long its pods took to run: from their creation, and
/// for those on the failing node from when its IMEX port was freed.
fn figure(
    batch: &Batch,
    nodes: &BTreeMap<String, String>,
    victim: &str,
    running_at: &BTreeMap<String, Instant>,
    freed: Option<Instant>,
) {
    let on_victim = |name: &String| nodes.get(name).map(String::as_str) == Some(victim);
    let ms = |on: bool, since: Option<Instant>| -> Vec<u128> {
        let mut t: Vec<u128> = batch
            .names
            .iter()
            .filter(|n| on_victim(n) == on)
            .filter_map(|n| running_at.get(n))
            .map(|at| {
                at.duration_since(since.unwrap_or(batch.created))
                    .as_millis()
            })
            .collect();
        t.sort_unstable();
        t
    };
    let count = batch.names.iter().filter(|n| on_victim(n)).count();
    let after_freed = freed
        .map(|freed| {
            format!(
                ", on it after the port was freed {:?}",
                ms(true, Some(freed))
            )
        })
        .unwrap_or_default();
    eprintln!(
        "FIGURE taints {}: {count}/{} on the failing node; created -> Running ms: on it {:?}, elsewhere {:?}{after_freed}",
        batch.label,
        batch.names.len(),
        ms(true, None),
        ms(false, None),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with real kubelets, as root: KUBECONFIG and DOMAIND_E2E_KUBE_DIR (../shared/kube; docs/TESTING.md)"]
async fn a_node_whose_imex_keeps_failing_is_tainted_and_new_pods_go_elsewhere() {
    let per_batch: usize = std::env::var("DOMAIND_E2E_TAINT_PODS")
        .map_or(4, |n| n.parse().expect("DOMAIND_E2E_TAINT_PODS: a count"));
    let taint_after: u64 = std::env::var("DOMAIND_E2E_TAINT_AFTER_MS").map_or(5000, |ms| {
        ms.parse()
            .expect("DOMAIND_E2E_TAINT_AFTER_MS: milliseconds")
    });
    let cluster =
        FakeCluster::start("domaind-taint", domaind_loopback::kubelets::TAINTS, CLIQUE).await;
    let (client, names, ips) = (
        cluster.client.clone(),
        cluster.names.clone(),
        cluster.ips.clone(),
    );
    let taint =
        json!({"spec": {"taints": [{"key": NODE_TAINT, "value": "e2e", "effect": "NoSchedule"}]}});
    for name in &names {
        Api::<Node>::all(client.clone())
            .patch(name, &PatchParams::default(), &Patch::Merge(&taint))
            .await
            .unwrap();
    }
    let (victim, survivor) = (names[VICTIM].clone(), names[1 - VICTIM].clone());
    install_crd_and_device_classes(&client).await;
    let namespace = format!("domaind-taint-e2e-{}", std::process::id());
    let _cleared_on_panic = create_namespace(&client, &namespace).await;
    let tmp = short_temp_dir("dmtn").unwrap();
    let controller = spawn_controller(&domaind_e2e::binaries().domaind, &namespace, tmp.path());
    // Room for every batch on one node.
    let channels = (4 * per_batch + 4).to_string();
    let (mut rack, _tokens) = start_daemons_with(
        &client,
        &names,
        &ips,
        tmp.path(),
        "taint-e2e",
        &[
            "--imex-untaint-after",
            "10s",
            "--imex-taint-after",
            &format!("{taint_after}ms"),
            "--channel-devices",
            &channels,
        ],
    )
    .await;
    wait_registered(&client, &names, &rack).await;

    let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
    let templates = Api::<ResourceClaimTemplate>::namespaced(client.clone(), &namespace);
    for domain in ["held", "healthy", "late"] {
        create_from_yaml(&client, &namespace, &compute_domain(domain)).await;
    }
    for domain in ["held", "healthy", "late"] {
        wait_for("the controller creates the templates", || async {
            let t = templates.get_opt(&format!("{domain}-rct")).await.unwrap();
            (t.is_some(), ())
        })
        .await;
    }

    // 1. A pod of `held` on each node (pinned), then the baseline batch.
    for (i, node) in names.iter().enumerate() {
        let mut held = pod(&format!("held-{i}"), "held", &Claim::Template("held"), None);
        held.spec.as_mut().unwrap().node_selector = Some(BTreeMap::from([(
            "kubernetes.io/hostname".into(),
            node.clone(),
        )]));
        pods.create(&PostParams::default(), &held).await.unwrap();
    }
    wait_running(
        &pods,
        &["held-0".into(), "held-1".into()],
        "held runs on both nodes",
    )
    .await;
    assert_eq!(
        devices_of(&client, &victim).await.1,
        0,
        "nothing tainted yet"
    );

    let healthy_claims: Vec<Claim> = (0..per_batch).map(|_| Claim::Template("healthy")).collect();
    let healthy = create_batch(&pods, "healthy", &healthy_claims).await;
    let nodes = placed(&pods, &healthy.names).await;
    let running_at = wait_running(&pods, &healthy.names, "the baseline batch runs").await;
    figure(&healthy, &nodes, &victim, &running_at, None);
    pods.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("batch=healthy"),
    )
    .await
    .unwrap();
    wait_for("the baseline batch is gone", || async {
        let left = pods
            .list(&ListParams::default().labels("batch=healthy"))
            .await
            .unwrap()
            .items
            .len();
        (left == 0, left)
    })
    .await;

    // 2. Node 1's IMEX killed and kept down; at once, the window batch.
    let failed = Instant::now();
    let held_port = tokio::task::block_in_place(|| rack.take_imex_port(VICTIM, &mut 0)).unwrap();
    let late_claims: Vec<Claim> = (0..per_batch).map(|_| Claim::Template("late")).collect();
    let window = create_batch(&pods, "window", &late_claims).await;
    let window_nodes = placed(&pods, &window.names).await;
    let (devices, tainted, value) = wait_every(
        "every channel device of the failing node is tainted",
        Duration::from_millis(100),
        || async {
            let seen = devices_of(&client, &victim).await;
            (seen.0 > 0 && seen.1 == seen.0, seen)
        },
    )
    .await;
    let taint_took = failed.elapsed();
    eprintln!(
        "FIGURE taints: IMEX killed and kept down -> {tainted}/{devices} devices tainted in the API {} ms (value {value:?})",
        taint_took.as_millis()
    );
    assert!(
        taint_took >= Duration::from_millis(taint_after),
        "tainted only once failing {taint_after} ms: {taint_took:?}"
    );
    assert_eq!(devices_of(&client, &survivor).await.1, 0);
    wait_for("a ChannelsTainted event on the failing node", || async {
        let reasons = node_events(&client, &victim).await;
        (reasons.iter().any(|r| r == "ChannelsTainted"), reasons)
    })
    .await;
    assert_eq!(
        metric(&rack, VICTIM, "domaind_imex_tainted").await,
        Some(1.0)
    );

    // 3. While tainted: new pods go to node 2, even one that prefers node 1.
    let tainted_batch = create_batch(&pods, "tainted", &late_claims).await;
    let mut nodes = placed(&pods, &tainted_batch.names).await;
    assert!(
        nodes.values().all(|n| *n == survivor),
        "no new pod on the tainted node: {nodes:?}"
    );
    pods.create(
        &PostParams::default(),
        &pod(
            "prefers-failing",
            "prefers",
            &Claim::Template("late"),
            Some(&victim),
        ),
    )
    .await
    .unwrap();
    let prefers = placed(&pods, &["prefers-failing".into()]).await;
    assert_eq!(
        prefers["prefers-failing"], survivor,
        "the taint outweighs the preference"
    );

    // The same with claims that tolerate the taint: the scheduler may use node 1.
    let template = templates.get("late-rct").await.unwrap();
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), &namespace);
    let mut tolerating = Vec::new();
    for i in 0..=per_batch {
        let mut spec = template.spec.spec.clone();
        for request in spec.devices.as_mut().unwrap().requests.iter_mut().flatten() {
            request.exactly.as_mut().unwrap().tolerations = Some(vec![DeviceToleration {
                key: Some(IMEX_TAINT.into()),
                operator: Some("Exists".into()),
                effect: Some("NoSchedule".into()),
                ..DeviceToleration::default()
            }]);
        }
        let name = format!("tolerating-{i}");
        claims
            .create(
                &PostParams::default(),
                &ResourceClaim {
                    metadata: kube::api::ObjectMeta {
                        name: Some(name.clone()),
                        ..Default::default()
                    },
                    spec,
                    status: None,
                },
            )
            .await
            .unwrap();
        tolerating.push(name);
    }
    let tolerating_claims: Vec<Claim> = tolerating[..per_batch]
        .iter()
        .map(|c| Claim::Named(c))
        .collect();
    let tolerated = create_batch(&pods, "tolerating", &tolerating_claims).await;
    nodes.extend(placed(&pods, &tolerated.names).await);
    pods.create(
        &PostParams::default(),
        &pod(
            "tolerates-prefers-failing",
            "prefers",
            &Claim::Named(&tolerating[per_batch]),
            Some(&victim),
        ),
    )
    .await
    .unwrap();
    let tolerates = placed(&pods, &["tolerates-prefers-failing".into()]).await;
    assert_eq!(
        tolerates["tolerates-prefers-failing"], victim,
        "a claim that tolerates the taint may go where the pod prefers"
    );
    nodes.extend(window_nodes);

    // 4. Every pod on node 2 runs (once node 2's IMEX has dropped node 1's), none on node
    // 1: its IMEX is down. Then IMEX is back: the taint goes, and node 1's pods run.
    let (on_victim, on_survivor): (Vec<String>, Vec<String>) = nodes
        .keys()
        .cloned()
        .partition(|name| nodes[name] == victim);
    let mut running_at = wait_running(
        &pods,
        &[on_survivor, vec!["prefers-failing".into()]].concat(),
        "every pod on the healthy node runs",
    )
    .await;
    for name in on_victim
        .iter()
        .chain(&["tolerates-prefers-failing".to_owned()])
    {
        assert!(
            !running(&pods.get(name).await.unwrap()),
            "{name} runs on a node whose IMEX is down"
        );
    }
    drop(held_port);
    let freed = Instant::now();
    wait_for(
        "the taint is removed once IMEX has been healthy 10 s",
        || async {
            let seen = devices_of(&client, &victim).await;
            (seen.0 > 0 && seen.1 == 0, seen)
        },
    )
    .await;
    eprintln!(
        "FIGURE taints: IMEX down {} ms (killed -> port freed); port freed -> taint removed {} ms",
        (freed - failed).as_millis(),
        freed.elapsed().as_millis()
    );
    wait_for("a ChannelsUntainted event on the node", || async {
        let reasons = node_events(&client, &victim).await;
        (reasons.iter().any(|r| r == "ChannelsUntainted"), reasons)
    })
    .await;
    assert_eq!(
        metric(&rack, VICTIM, "domaind_imex_tainted").await,
        Some(0.0)
    );
    running_at.extend(
        wait_running(
            &pods,
            &[on_victim, vec!["tolerates-prefers-failing".into()]].concat(),
            "every pod on the recovered node runs",
        )
        .await,
    );
    for batch in [&window, &tainted_batch, &tolerated] {
        figure(batch, &nodes, &victim, &running_at, Some(freed));
    }

    // Teardown: every pod and claim, then the daemons.
    pods.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    wait_for("every claim unprepared", || async {
        let specs: usize = rack
            .nodes()
            .iter()
            .map(|n| crate::kubelet::cdi_specs(&n.cdi_dir()).len())
            .sum();
        (specs == 0, specs)
    })
    .await;
    rack.stop_all(Duration::from_secs(20));
    assert!(rack.unexpected_exits().is_empty());
    drop(controller);
    if std::env::var("DOMAIND_E2E_KEEP").as_deref() == Ok("1") {
        eprintln!(
            "kept: the daemons' and controller's files in {}",
            tmp.keep().display()
        );
    } else {
        Api::<Namespace>::all(client.clone())
            .delete(&namespace, &DeleteParams::default())
            .await
            .unwrap();
    }
}
