//! Device health in the pod, on real kubelets: the kubelet's `DRAResourceHealth` stream
//! from our daemon shows in each pod's `status.containerStatuses[].allocatedResourcesStatus`.
//!
//! 1. Two fake nodes, a ComputeDomain of two, a pod on each: both channels Healthy.
//! 2. Node 1's IMEX killed and kept down (its port taken): its pod's channel goes
//!    Unhealthy, the message saying IMEX is failing and why. Prints how long the pod took to show it
//!    (docs/BENCHMARKS.md).
//! 3. The port freed: IMEX comes back, every channel Healthy again.
//!
//! Needs what `kubelet` needs (`../shared/kube`, root). Its nodes are its own:
//! `domaind-health-1..2` on 127.0.0.13-14.

use std::time::{Duration, Instant};

use domaind_kube_api::crd::ComputeDomain;
use domaind_testbed::rack::short_temp_dir;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams};

use crate::kubelet::{
    FakeCluster, compute_domain_of, create_from_yaml, spread_workload, start_daemons,
    wait_registered, wait_running,
};
use domaind_e2e::cluster::{
    create_namespace, install_crd_and_device_classes, spawn_controller, wait_every, wait_for,
};

const DOMAIN: &str = "health";
const CLIQUE: &str = "e2e-health.1";

/// Each device's health as the pod on `node` shows it: (resource id, health, message).
/// Read untyped: the typed Pod of our k8s-openapi predates fields the 1.36 kubelet may
/// write (a device's `message`), and would drop them.
async fn pod_health(pods: &Api<DynamicObject>, node: &str) -> Vec<(String, String, String)> {
    let list = pods
        .list(&ListParams::default().labels(&format!("job={DOMAIN}")))
        .await
        .unwrap();
    let Some(pod) = list
        .items
        .into_iter()
        .find(|p| p.data["spec"]["nodeName"].as_str() == Some(node))
    else {
        return Vec::new();
    };
    let status = &pod.data["status"];
    let mut seen = Vec::new();
    for container in status["containerStatuses"].as_array().into_iter().flatten() {
        for allocated in container["allocatedResourcesStatus"]
            .as_array()
            .into_iter()
            .flatten()
        {
            for resource in allocated["resources"].as_array().into_iter().flatten() {
                seen.push((
                    resource["resourceID"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    resource["health"].as_str().unwrap_or_default().to_owned(),
                    resource["message"].as_str().unwrap_or_default().to_owned(),
                ));
            }
        }
    }
    seen
}

fn all_healthy(seen: &[(String, String, String)]) -> bool {
    !seen.is_empty() && seen.iter().all(|(_, health, _)| health == "Healthy")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with real kubelets, as root: KUBECONFIG and DOMAIND_E2E_KUBE_DIR (../shared/kube; docs/TESTING.md)"]
async fn a_pods_channel_shows_its_imex_health() {
    let cluster =
        FakeCluster::start("domaind-health", domaind_loopback::kubelets::HEALTH, CLIQUE).await;
    let (client, names, ips) = (
        cluster.client.clone(),
        cluster.names.clone(),
        cluster.ips.clone(),
    );
    install_crd_and_device_classes(&client).await;
    let namespace = format!("domaind-health-e2e-{}", std::process::id());
    let _cleared_on_panic = create_namespace(&client, &namespace).await;
    let tmp = short_temp_dir("dmhe").unwrap();
    let controller = spawn_controller(&domaind_e2e::binaries().domaind, &namespace, tmp.path());
    let (mut rack, _tokens) = start_daemons(&client, &names, &ips, tmp.path(), "health-e2e").await;
    wait_registered(&client, &names, &rack).await;

    let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
    let raw_pods = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        &namespace,
        &ApiResource::erase::<Pod>(&()),
    );
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
    for node in &names {
        wait_every(
            &format!("the pod on {node} shows its channel Healthy"),
            Duration::from_millis(100),
            || async {
                let seen = pod_health(&raw_pods, node).await;
                (all_healthy(&seen), seen)
            },
        )
        .await;
    }

    // Node 1's IMEX dies and cannot come back while its port is taken. When its daemon
    // saw it (its /state) and when the pod showed it are timed apart: the first is
    // ours, the rest the kubelet's.
    let state = rack.node(0).info().unwrap().clone();
    let taken = tokio::task::block_in_place(|| rack.take_imex_port(0, &mut 0)).unwrap();
    let killed = Instant::now();
    let daemon_saw = async {
        let _imex = wait_every(
            "node 1's daemon sees its IMEX failing",
            Duration::from_millis(10),
            || async {
                let view = domaind_testbed::rack::node_view(&state).await;
                let failing = view.as_ref().is_ok_and(|v| !v.imex.running);
                (failing, view.map(|v| v.imex).map_err(|e| e.to_string()))
            },
        )
        .await;
        killed.elapsed()
    };
    let pod_showed = async {
        let seen = wait_every(
            "the pod on node 1 shows its channel Unhealthy, saying why",
            Duration::from_millis(10),
            || async {
                let seen = pod_health(&raw_pods, &names[0]).await;
                let unhealthy = seen
                    .iter()
                    .any(|(_, health, message)| health == "Unhealthy" && message.contains("IMEX"));
                (unhealthy, seen)
            },
        )
        .await;
        (killed.elapsed(), seen)
    };
    let (daemon_saw, (shown, seen)) = tokio::join!(daemon_saw, pod_showed);
    println!(
        "health: IMEX killed and kept down -> its daemon saw it in {:.2} s, the pod showed Unhealthy in {:.2} s: {seen:?}",
        daemon_saw.as_secs_f64(),
        shown.as_secs_f64()
    );

    drop(taken);
    for node in &names {
        wait_every(
            &format!("the pod on {node} shows its channel Healthy again"),
            Duration::from_millis(100),
            || async {
                let seen = pod_health(&raw_pods, node).await;
                (all_healthy(&seen), seen)
            },
        )
        .await;
    }

    let cds = Api::<ComputeDomain>::namespaced(client.clone(), &namespace);
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), &namespace)
        .delete(DOMAIN, &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the pods are gone", || async {
        let left = pods.list(&ListParams::default()).await.unwrap().items.len();
        (left == 0, left)
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
