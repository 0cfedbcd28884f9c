//! End to end against a real API server (`KUBECONFIG`; ignored unless asked for).
//!
//! It applies the CRD and DeviceClasses, creates a ComputeDomain in a namespace of its
//! own, runs `domaind controller` and three `domaind run --backend kube` daemons on
//! loopback pretending to be three nodes, plays the scheduler (creates claims from the
//! ComputeDomain's template and writes their allocation through the status
//! subresource), prepares through the kubelet-style client, and checks what
//! `kubectl get computedomains` shows: Ready 3/3; NotReady and a NodeLost event after a
//! daemon is killed; the cleanup after the ComputeDomain is deleted.
//!
//! Environment (all optional but `KUBECONFIG`):
//! - `DOMAIND_E2E_NODES`: the three node names, comma-separated (default
//!   `domaind-e2e-1,domaind-e2e-2,domaind-e2e-3`). Names of real nodes work: the
//!   daemons publish ResourceSlices and status for them.
//! - `DOMAIND_E2E_IPS`: their loopback addresses (default 127.0.46.1-3,
//!   `domaind_loopback::E2E_KUBE`).
//! - `DOMAIND_E2E_KUBELET=1`: real kubelets hold those names and call the daemons'
//!   sockets in the kubelet's directories; the test then creates pods instead of
//!   calling prepare itself. Run it on such a node, as root.
//! - `DOMAIND_E2E_NODE_KUBECONFIG`: the chart's node ServiceAccount; each daemon then
//!   runs with a token of it bound to a pod on its node (`domaind_e2e::tokens`), as the
//!   chart's admission policy asks, the Node objects made if missing.
//! - `DOMAIND_E2E_KEEP=1`: leave the namespace for inspection.

use std::net::IpAddr;
use std::time::Duration;

use domaind_actors::model::ClaimRef;
use domaind_kube_api::crd::ComputeDomain;
use domaind_kube_api::crd::Phase;
use domaind_kubelet_plugin::DraVersion;
use domaind_loopback::{E2E_KUBE, addr};
use domaind_testbed::rack::{
    LocalRack, RackBackend, RackSpec, prepare_until_ready, short_temp_dir,
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use domaind_e2e::cluster::{
    LIMIT, allocate_claim, create_namespace, env_list, install_crd_and_device_classes, require,
    spawn_controller, wait_for, wait_node_lost_event,
};
use domaind_e2e::tokens::node_tokens_for_rack;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: KUBECONFIG of a real API server (../shared/kube; docs/TESTING.md)"]
async fn a_compute_domain_forms_heals_and_is_cleaned_up_on_a_real_cluster() {
    require(&[]);
    let client = Client::try_default().await.unwrap();
    let real_kubelets = std::env::var("DOMAIND_E2E_KUBELET").as_deref() == Ok("1");
    let names = env_list("DOMAIND_E2E_NODES")
        .unwrap_or_else(|| (1..=3).map(|i| format!("domaind-e2e-{i}")).collect());
    let ips: Vec<IpAddr> = env_list("DOMAIND_E2E_IPS")
        .map(|ips| ips.iter().map(|ip| ip.parse().unwrap()).collect())
        .unwrap_or_else(|| (1..=3).map(|i| IpAddr::from(addr(E2E_KUBE, i))).collect());
    assert_eq!(names.len(), 3, "DOMAIND_E2E_NODES names three nodes");

    // 1. The CRD and DeviceClasses, then a namespace and a ComputeDomain.
    install_crd_and_device_classes(&client).await;
    let namespace = format!("domaind-e2e-{}", std::process::id());
    let _cleared_on_panic = create_namespace(&client, &namespace).await;
    let cds = Api::<ComputeDomain>::namespaced(client.clone(), &namespace);
    let cd: ComputeDomain = serde_json::from_value(json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": "training", "namespace": namespace},
        "spec": {"numNodes": 3, "channel": {"resourceClaimTemplate": {"name": "training-channel"}}},
    }))
    .unwrap();
    let cd = cds.create(&PostParams::default(), &cd).await.unwrap();
    let cd_uid = cd.uid().unwrap();

    // 2. The controller creates the template.
    let tmp = short_temp_dir("dme2e").unwrap();
    let controller = spawn_controller(&domaind_e2e::binaries().domaind, &namespace, tmp.path());
    let templates = Api::<ResourceClaimTemplate>::namespaced(client.clone(), &namespace);
    let template = wait_for("the controller creates the template", || async {
        let t = templates.get_opt("training-channel").await.unwrap();
        (t.is_some(), t)
    })
    .await
    .unwrap();
    let parameters = &serde_json::to_value(&template.spec.spec).unwrap()["devices"]["config"][0]["opaque"]
        ["parameters"];
    assert_eq!(parameters["domainID"], json!(cd_uid));
    assert_eq!(parameters["kind"], "ComputeDomainChannelConfig");

    // 3. Three daemons on loopback, as those nodes.
    let mut spec = RackSpec::self_contained(
        3,
        domaind_e2e::binaries().domaind.clone(),
        tmp.path().join("rack"),
    );
    spec.names = Some(names.clone());
    spec.ips = Some(ips);
    spec.backend = RackBackend::Kube;
    let tokens = node_tokens_for_rack(
        &mut spec.node_env,
        &client,
        &names,
        tmp.path(),
        &format!("kube-e2e-{}", std::process::id()),
    )
    .await;
    spec.extra_args = vec!["--prepare-deadline".into(), "2s".into()];
    let mut rack = LocalRack::create(spec).unwrap();
    rack.start_all().unwrap();
    tokio::task::block_in_place(|| rack.wait_all_ready(LIMIT)).unwrap();

    // 4. Claims allocated on the three nodes, after the daemons started: prepare
    //    goes through the claim source, not start-up reconciliation.
    let mut claims = Vec::new();
    for name in &names {
        claims.push(
            allocate_claim(
                &client,
                &namespace,
                &template,
                &format!("claim-{name}"),
                name,
            )
            .await,
        );
    }

    // 5. Prepare, as the kubelets would (or let them).
    if real_kubelets {
        let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
        for (name, claim) in names.iter().zip(&claims) {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": format!("worker-{name}")},
                "spec": {
                    "nodeName": name,
                    "restartPolicy": "Never",
                    "resourceClaims": [{"name": "channel", "resourceClaimName": claim.name_any()}],
                    "containers": [{"name": "sleep", "image": "busybox", "command": ["sleep", "3600"],
                                    "resources": {"claims": [{"name": "channel"}]}}],
                }
            }))
            .unwrap();
            pods.create(&PostParams::default(), &pod).await.unwrap();
        }
    } else {
        let prepares = names
            .iter()
            .zip(&claims)
            .enumerate()
            .map(|(i, (_, claim))| {
                let socket = rack.node(i).dra_socket();
                let claim = ClaimRef {
                    uid: claim.uid().unwrap(),
                    namespace: namespace.clone(),
                    name: claim.name_any(),
                };
                async move { prepare_until_ready(&socket, &claim, DraVersion::V1, LIMIT).await }
            });
        for answer in futures::future::join_all(prepares).await {
            let devices = answer.unwrap().unwrap();
            assert_eq!(devices[0].device_name, "channel-0");
        }
    }

    // 6. `kubectl get computedomains`: Ready 3/3.
    wait_for("the ComputeDomain is Ready 3/3", || async {
        let status = cds.get("training").await.unwrap().status;
        let done = status
            .as_ref()
            .is_some_and(|s| s.status == Phase::Ready && s.ready_nodes == 3 && s.nodes.len() == 3);
        (done, status)
    })
    .await;

    // 7. Kill one daemon: NotReady, and an event says which node was lost.
    let lost = names[2].clone();
    rack.kill(2).unwrap();
    wait_for("the ComputeDomain goes NotReady", || async {
        let status = cds.get("training").await.unwrap().status;
        let done = status.as_ref().is_some_and(|s| {
            s.status == Phase::NotReady
                && s.nodes
                    .iter()
                    .any(|n| n.name == lost && n.status == Phase::NotReady)
        });
        (done, status)
    })
    .await;
    wait_node_lost_event(&client, &namespace, &cd_uid, &lost).await;

    // 8. The workload ends: claims go, then the ComputeDomain; the controller cleans up.
    let claims_api = Api::<ResourceClaim>::namespaced(client.clone(), &namespace);
    if real_kubelets {
        let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
        pods.delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .unwrap();
    } else {
        for (i, claim) in claims.iter().enumerate().take(2) {
            let client =
                domaind_kubelet_plugin::client::KubeletClient::connect(rack.node(i).dra_socket())
                    .await
                    .unwrap();
            let claim = ClaimRef {
                uid: claim.uid().unwrap(),
                namespace: namespace.clone(),
                name: claim.name_any(),
            };
            let answers = client.unprepare(&[claim], DraVersion::V1).await.unwrap();
            assert_eq!(answers[0].result, Ok(()));
        }
    }
    claims_api
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    cds.delete("training", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the ComputeDomain and its template are gone", || async {
        let cd = cds.get_opt("training").await.unwrap();
        let template = templates.get_opt("training-channel").await.unwrap();
        (
            cd.is_none() && template.is_none(),
            (cd.map(|c| c.metadata.finalizers), template.is_some()),
        )
    })
    .await;

    rack.stop_all(Duration::from_secs(20));
    drop(controller);
    drop(tokens);
    if std::env::var("DOMAIND_E2E_KEEP").as_deref() != Ok("1") {
        Api::<Namespace>::all(client.clone())
            .delete(&namespace, &DeleteParams::default())
            .await
            .unwrap();
    }
}
