//! A ComputeDomain whose pods span two NVLink cliques, on the real API server: each
//! clique's reporter (the node daemon's status sink, `KubeStatusSink`) applies its own
//! rows under its clique's field manager, and the server's merge of the `status.nodes`
//! list (keyed by name) keeps both cliques' rows. Two cliques writing at once leave
//! stale domain-wide fields, which the domain's corrector puts right from the rows; the
//! rows a daemon of an earlier release wrote under its one manager go once a clique
//! writes; a clique whose last node leaves takes only its own rows away.
//!
//! No daemons: the sinks are the daemons' own adapter, and the server-side apply merge
//! is what is under test.

use std::time::Duration;

use domaind_actors::model::{DomainRef, DomainUid, Phase};
use domaind_actors::ports::StatusSink;
use domaind_actors::rules::status::{DomainStatus, NodeStatus, vacated_document};
use domaind_backends::kube::{DomainCache, KubeStatusSink};
use domaind_kube_api::crd::{ComputeDomain, ComputeDomainStatus};
use domaind_kube_api::names::NODE_FIELD_MANAGER;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use domaind_e2e::cluster::{create_namespace, install_crd_and_device_classes, require, wait_for};

const TIMEOUT: Duration = Duration::from_secs(10);

fn rows(clique: &str, names: &[&str], phase: Phase) -> DomainStatus {
    let nodes: Vec<NodeStatus> = names
        .iter()
        .enumerate()
        .map(|(i, name)| NodeStatus {
            name: (*name).into(),
            ip_address: format!("10.0.0.{}", i + 1),
            clique_id: clique.into(),
            index: Some(i as u16),
            status: phase,
        })
        .collect();
    let ready = if phase == Phase::Ready {
        nodes.len() as u32
    } else {
        0
    };
    DomainStatus {
        status: phase,
        ready_nodes: ready,
        total_nodes: nodes.len() as u32,
        message: format!("{ready}/{} nodes ready", nodes.len()),
        nodes,
        channel: None,
    }
}

fn sink(client: &Client, cache: DomainCache, node: &str, clique: &str) -> KubeStatusSink {
    KubeStatusSink::new(client.clone(), cache, TIMEOUT)
        .for_node(node, watch::channel(clique.to_owned()).1)
}

/// A cache of exactly `cd`, as a node whose watch has not brought anything newer
/// (kept so while its writer lives).
fn frozen_cache(cd: ComputeDomain) -> (DomainCache, reflector::store::Writer<ComputeDomain>) {
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitApply(cd));
    writer.apply_watcher_event(&watcher::Event::InitDone);
    (DomainCache::from_store(store), writer)
}

fn summary(status: &Option<ComputeDomainStatus>) -> (String, u32, u32, Vec<String>) {
    match status {
        None => (String::new(), 0, 0, Vec::new()),
        Some(s) => (
            format!("{:?}", s.status),
            s.ready_nodes,
            s.total_nodes,
            s.nodes.iter().map(|n| n.name.clone()).collect(),
        ),
    }
}

async fn wait_status(
    cds: &Api<ComputeDomain>,
    what: &str,
    want: (&str, u32, u32, &[&str]),
) -> ComputeDomain {
    let (phase, ready, total, names) = want;
    wait_for(what, || async {
        let cd = cds.get("training").await.unwrap();
        let seen = summary(&cd.status);
        let done = seen.0 == phase && seen.1 == ready && seen.2 == total && seen.3 == names;
        (done, (seen, cd))
    })
    .await
    .1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: KUBECONFIG of a real API server (../shared/kube; docs/TESTING.md)"]
async fn a_domain_spanning_two_cliques_lists_both_on_a_real_api_server() {
    require(&[]);
    let admin = Client::try_default().await.unwrap();
    install_crd_and_device_classes(&admin).await;
    let namespace = format!("domaind-status-cliques-{}", std::process::id());
    let _cleared_on_panic = create_namespace(&admin, &namespace).await;
    let cds = Api::<ComputeDomain>::namespaced(admin.clone(), &namespace);
    let created: ComputeDomain = serde_json::from_value(json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": "training", "namespace": namespace},
        "spec": {"numNodes": 4, "channel": {"resourceClaimTemplate": {"name": "training-channel"}}},
    }))
    .unwrap();
    let created = cds.create(&PostParams::default(), &created).await.unwrap();
    let domain = DomainRef {
        uid: DomainUid(created.uid().unwrap()),
        namespace: namespace.clone(),
        name: "training".into(),
        num_nodes: 4,
    };

    // An earlier release wrote the whole status under one manager, a node since gone
    // among its rows.
    let earlier = json!({
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
        "metadata": {"name": "training", "namespace": namespace, "uid": domain.uid.0},
        "status": {"status": "NotReady", "readyNodes": 0, "totalNodes": 1,
                   "nodes": [{"name": "node-gone", "ipAddress": "10.0.0.9", "cliqueID": "c.a",
                              "index": 5, "status": "NotReady"}]},
    });
    cds.patch_status(
        "training",
        &PatchParams::apply(NODE_FIELD_MANAGER).force(),
        &Patch::Apply(&earlier),
    )
    .await
    .unwrap();
    let before_a = cds.get("training").await.unwrap();

    let (live, watching) = DomainCache::watch(admin.clone());
    let watching = tokio::spawn(watching);
    let a = sink(&admin, live.clone(), "node-a1", "c.a");
    let stop = CancellationToken::new();
    let correcting = tokio::spawn(a.clone().keep_domain_fields(stop.clone()));
    assert!(live.wait_synced(TIMEOUT).await);
    wait_for("the live cache has the earlier release's row", || async {
        let seen = live
            .by_uid(&domain.uid.0)
            .map(|cd| summary(&cd.status).3)
            .unwrap_or_default();
        (seen == ["node-gone"], seen)
    })
    .await;

    // Clique A writes its two nodes (ready, and the domain not: two of four): the
    // earlier manager's row goes.
    let mut waiting = rows("c.a", &["node-a1", "node-a2"], Phase::Ready);
    waiting.status = Phase::NotReady;
    waiting.message = "2/2 nodes ready, waiting for 4 nodes (spec.numNodes)".into();
    a.write(&domain, &waiting).await.unwrap();
    wait_status(
        &cds,
        "clique A's rows alone, the earlier release's row gone",
        ("NotReady", 2, 2, &["node-a1", "node-a2"]),
    )
    .await;

    // Clique B writes from a cache that has not seen A's write: its rows join A's (the
    // server merges them), its domain-wide fields are stale (B counted the earlier
    // release's row, not A's), and A's node corrects them from the four rows.
    let (frozen, _frozen_writer) = frozen_cache(before_a);
    let b = sink(&admin, frozen, "node-b1", "c.b");
    b.write(&domain, &rows("c.b", &["node-b1", "node-b2"], Phase::Ready))
        .await
        .unwrap();
    let whole = wait_status(
        &cds,
        "both cliques' rows, Ready 4/4 once corrected",
        ("Ready", 4, 4, &["node-a1", "node-a2", "node-b1", "node-b2"]),
    )
    .await;
    let ready = whole
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .unwrap();
    assert_eq!(ready.message, "4/4 nodes ready in 2 NVLink cliques");

    // A node of clique A is lost: A's rows say so, B's stand, the domain is not ready.
    let mut degraded = rows("c.a", &["node-a1", "node-a2"], Phase::Ready);
    degraded.nodes[1].status = Phase::NotReady;
    a.write(&domain, &degraded).await.unwrap();
    wait_status(
        &cds,
        "node-a2 not ready, the rest as they were",
        (
            "NotReady",
            3,
            4,
            &["node-a1", "node-a2", "node-b1", "node-b2"],
        ),
    )
    .await;

    // Clique A's last node leaves: only A's rows go.
    a.write(&domain, &vacated_document()).await.unwrap();
    wait_status(
        &cds,
        "clique B's rows alone",
        ("NotReady", 2, 2, &["node-b1", "node-b2"]),
    )
    .await;

    stop.cancel();
    correcting.await.unwrap();
    watching.abort();
    cds.delete("training", &DeleteParams::default())
        .await
        .unwrap();
    Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .delete(&namespace, &DeleteParams::default())
        .await
        .unwrap();
}
