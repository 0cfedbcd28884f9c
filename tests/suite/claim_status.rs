//! Device status in the claim, on real kubelets: each pod's ResourceClaim holds our
//! entry in `status.devices` (`kubectl get resourceclaim -o yaml`), with a `Ready`
//! condition and the domain, clique, index, channel and IMEX peers linked as `data`.
//!
//! 1. Two fake nodes, a ComputeDomain of two, a pod on each: each claim's entry is
//!    Ready (`ImexReady`), its data the node's row of the domain's status.
//! 2. Node 1's IMEX killed and kept down (its port taken): its claim's entry goes
//!    `Ready=False`, reason `ImexFailing`, saying why.
//! 3. The port freed: both entries Ready again, each transition timed after the last.
//!
//! Needs what `kubelet` needs (`../shared/kube`, root); with `DOMAIND_E2E_NODE_KUBECONFIG`
//! the daemons write as the chart's ServiceAccount, under its RBAC and admission
//! policy. Its nodes are its own: `domaind-claimstatus-1..2` on 127.0.0.51-52.

use std::time::Duration;

use domaind_kube_api::crd::ComputeDomain;
use domaind_testbed::rack::short_temp_dir;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{Value, json};

use crate::kubelet::{
    FakeCluster, compute_domain_of, create_from_yaml, spread_workload, start_daemons,
    wait_registered, wait_running,
};
use domaind_e2e::cluster::{
    DRIVER, create_namespace, install_crd_and_device_classes, spawn_controller, wait_every,
    wait_for,
};

const DOMAIN: &str = "claimstatus";
const CLIQUE: &str = "e2e-claimstatus.1";
/// How often a claim is asked about: a real API server.
const POLL: Duration = Duration::from_millis(100);

/// Our entry in the status of the claim allocated on `node`, as JSON, or Null.
async fn entry_on(claims: &Api<ResourceClaim>, node: &str) -> Value {
    let list = claims.list(&ListParams::default()).await.unwrap();
    for claim in list.items {
        let claim = serde_json::to_value(claim).unwrap();
        let results = &claim["status"]["allocation"]["devices"]["results"];
        let ours_here = results
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["driver"] == DRIVER && r["pool"] == node);
        if !ours_here {
            continue;
        }
        let entries = claim["status"]["devices"].as_array().cloned();
        return entries
            .into_iter()
            .flatten()
            .find(|e| e["driver"] == DRIVER && e["pool"] == node)
            .unwrap_or(Value::Null);
    }
    Value::Null
}

fn ready(entry: &Value) -> &Value {
    &entry["conditions"][0]
}

/// Waits until the entry on `node` satisfies `want`, and returns it.
async fn wait_entry(
    claims: &Api<ResourceClaim>,
    node: &str,
    what: &str,
    want: impl Fn(&Value) -> bool,
) -> Value {
    wait_every(&format!("{node}: {what}"), POLL, || async {
        let entry = entry_on(claims, node).await;
        (want(&entry), entry)
    })
    .await
}

fn is_ready(entry: &Value) -> bool {
    ready(entry)["type"] == "Ready"
        && ready(entry)["status"] == "True"
        && ready(entry)["reason"] == "ImexReady"
        && entry["data"]["imexPeers"] == json!({"linked": 1, "total": 1})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with real kubelets, as root: KUBECONFIG and DOMAIND_E2E_KUBE_DIR (../shared/kube; docs/TESTING.md)"]
async fn each_pods_claim_says_how_its_channel_is() {
    let cluster = FakeCluster::start(
        "domaind-claimstatus",
        domaind_loopback::kubelets::CLAIM_STATUS,
        CLIQUE,
    )
    .await;
    let (client, names, ips) = (
        cluster.client.clone(),
        cluster.names.clone(),
        cluster.ips.clone(),
    );
    install_crd_and_device_classes(&client).await;
    let namespace = format!("domaind-claimstatus-e2e-{}", std::process::id());
    let _cleared_on_panic = create_namespace(&client, &namespace).await;
    let tmp = short_temp_dir("dmcs").unwrap();
    let controller = spawn_controller(&domaind_e2e::binaries().domaind, &namespace, tmp.path());
    let (mut rack, _tokens) =
        start_daemons(&client, &names, &ips, tmp.path(), "claimstatus-e2e").await;
    wait_registered(&client, &names, &rack).await;

    // 1. A pod on each node: each claim's entry is Ready, its data the node's row.
    let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), &namespace);
    let cds = Api::<ComputeDomain>::namespaced(client.clone(), &namespace);
    let templates = Api::<ResourceClaimTemplate>::namespaced(client.clone(), &namespace);
    create_from_yaml(&client, &namespace, &compute_domain_of(DOMAIN, 2)).await;
    wait_for("the controller creates the template", || async {
        let t = templates.get_opt(&format!("{DOMAIN}-rct")).await.unwrap();
        (t.is_some(), ())
    })
    .await;
    create_from_yaml(
        &client,
        &namespace,
        &spread_workload(DOMAIN, &format!("{DOMAIN}-rct"), CLIQUE, 2),
    )
    .await;
    wait_running(&pods, &format!("job={DOMAIN}"), 2, 1).await;
    let cd = cds.get(DOMAIN).await.unwrap();
    let mut first_ready = Vec::new();
    for node in &names {
        let entry = wait_entry(&claims, node, "its claim's entry is Ready", is_ready).await;
        let rows = wait_for("the domain's status lists both nodes", || async {
            let status = cds.get(DOMAIN).await.unwrap().status;
            let rows = status.map(|s| s.nodes).unwrap_or_default();
            (rows.len() == 2, rows)
        })
        .await;
        let row = rows.iter().find(|r| &r.name == node).unwrap();
        assert_eq!(
            entry["data"],
            json!({
                "computeDomain": {"namespace": namespace, "name": DOMAIN, "uid": cd.uid().unwrap()},
                "cliqueID": row.clique_id,
                "index": row.index.unwrap(),
                "channel": 0,
                "imexPeers": {"linked": 1, "total": 1},
            }),
            "{node}: {entry}"
        );
        assert_eq!(entry["device"], "channel-0", "{entry}");
        first_ready.push(ready(&entry)["lastTransitionTime"].clone());
        eprintln!("claim status on {node}: {entry}");
    }

    // 2. Node 1's IMEX dies and cannot come back while its port is taken.
    let taken = tokio::task::block_in_place(|| rack.take_imex_port(0, &mut 0)).unwrap();
    let failing = wait_entry(
        &claims,
        &names[0],
        "its claim's entry is not Ready: IMEX is failing",
        |entry| {
            ready(entry)["status"] == "False"
                && ready(entry)["reason"] == "ImexFailing"
                && ready(entry)["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("IMEX"))
        },
    )
    .await;
    eprintln!("claim status on {} with IMEX down: {failing}", names[0]);

    // 3. The port freed: IMEX back, both Ready again. Node 1's entry changed status
    // twice: each transition's time is no earlier than the one before (whole seconds,
    // RFC 3339 in UTC: they compare as text).
    drop(taken);
    for node in &names {
        wait_entry(&claims, node, "its claim's entry is Ready again", is_ready).await;
    }
    let back = entry_on(&claims, &names[0]).await;
    let times = [
        first_ready[0].as_str().unwrap(),
        ready(&failing)["lastTransitionTime"].as_str().unwrap(),
        ready(&back)["lastTransitionTime"].as_str().unwrap(),
    ];
    assert!(times.is_sorted(), "{times:?}");

    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), &namespace)
        .delete(DOMAIN, &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the pods and their claims are gone", || async {
        let pods_left = pods.list(&ListParams::default()).await.unwrap().items.len();
        let claims_left = claims
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len();
        (pods_left == 0 && claims_left == 0, (pods_left, claims_left))
    })
    .await;
    cds.delete(DOMAIN, &DeleteParams::default()).await.unwrap();
    rack.stop_all(Duration::from_secs(20));
    assert!(rack.unexpected_exits().is_empty());
    drop(controller);
    if std::env::var("DOMAIND_E2E_KEEP").as_deref() != Ok("1") {
        Api::<Namespace>::all(client.clone())
            .delete(&namespace, &DeleteParams::default())
            .await
            .unwrap();
    }
}
