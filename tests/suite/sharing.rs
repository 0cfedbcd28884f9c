//! Channel isolation on real Kubernetes with real kubelets: two ComputeDomains with
//! `isolation: Channel` run pods on the same three nodes, each pod receiving only its
//! own domain's channel; deleting one leaves the other Ready. The API server refuses a
//! switch of mode (the spec is immutable) and `Channel` with `allocationMode: All`.
//!
//! Needs what `kubelet` needs (`../shared/kube`, root). Its nodes are its own: `domaind-share-1..3` on
//! 127.0.0.5-7, so it runs beside `kubelet`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use domaind_kube_api::crd::ComputeDomain;
use domaind_testbed::rack::short_temp_dir;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::kubelet::{
    FakeCluster, cdi_specs, create_from_yaml, pods_of, spread_workload, start_daemons,
    wait_registered, wait_running,
};
use domaind_e2e::cluster::{
    create_namespace, install_crd_and_device_classes, spawn_controller, wait_every, wait_for,
};

const DOMAINS: [&str; 2] = ["shared-a", "shared-b"];
const CLIQUE: &str = "e2e-share.1";

fn compute_domain(name: &str, allocation_mode: &str) -> Value {
    json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": name},
        "spec": {
            "numNodes": 0,
            "isolation": "Channel",
            "channel": {
                "resourceClaimTemplate": {"name": format!("{name}-rct")},
                "allocationMode": allocation_mode,
            },
        },
    })
}

async fn status_of(cds: &Api<ComputeDomain>, name: &str) -> Value {
    cds.get_opt(name)
        .await
        .unwrap()
        .and_then(|cd| cd.status)
        .map(|s| serde_json::to_value(s).unwrap())
        .unwrap_or(Value::Null)
}

fn ready_with_channel(s: &Value) -> bool {
    s["status"] == "Ready" && s["readyNodes"] == json!(3) && s["channel"].is_u64()
}

/// The channel devices a CDI spec gives its containers.
fn channels_in_spec(spec: &str) -> BTreeSet<u64> {
    spec.split("nvidia-caps-imex-channels/channel")
        .skip(1)
        .filter_map(|after| {
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with real kubelets, as root: KUBECONFIG and DOMAIND_E2E_KUBE_DIR (../shared/kube; docs/TESTING.md)"]
async fn two_sharing_domains_run_pods_on_the_same_nodes_each_with_its_own_channel() {
    let cluster =
        FakeCluster::start("domaind-share", domaind_loopback::kubelets::SHARING, CLIQUE).await;
    let (client, names, ips) = (
        cluster.client.clone(),
        cluster.names.clone(),
        cluster.ips.clone(),
    );
    install_crd_and_device_classes(&client).await;
    let namespace = format!("domaind-share-e2e-{}", std::process::id());
    let _cleared_on_panic = create_namespace(&client, &namespace).await;
    let tmp = short_temp_dir("dmsh").unwrap();
    let controller = spawn_controller(&domaind_e2e::binaries().domaind, &namespace, tmp.path());
    let (mut rack, _tokens) = start_daemons(&client, &names, &ips, tmp.path(), "share-e2e").await;
    wait_registered(&client, &names, &rack).await;

    let cds = Api::<ComputeDomain>::namespaced(client.clone(), &namespace);
    let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
    let templates = Api::<ResourceClaimTemplate>::namespaced(client.clone(), &namespace);

    // The API server refuses Channel with allocationMode All.
    let all: ComputeDomain = serde_json::from_value(compute_domain("shared-all", "All")).unwrap();
    let refused = cds.create(&PostParams::default(), &all).await.unwrap_err();
    assert!(
        refused.to_string().contains("allocationMode All"),
        "{refused}"
    );

    // Two sharing domains, and a workload each, created together.
    for domain in DOMAINS {
        create_from_yaml(&client, &namespace, &compute_domain(domain, "Single")).await;
    }
    for domain in DOMAINS {
        wait_for("the controller creates the templates", || async {
            let t = templates.get_opt(&format!("{domain}-rct")).await.unwrap();
            (t.is_some(), ())
        })
        .await;
    }
    for domain in DOMAINS {
        create_from_yaml(
            &client,
            &namespace,
            &spread_workload(domain, &format!("{domain}-rct"), CLIQUE, 3),
        )
        .await;
    }
    for domain in DOMAINS {
        wait_running(&pods, &format!("job={domain}"), 3, 1).await;
    }
    let mut channels = BTreeMap::new();
    for domain in DOMAINS {
        let status = wait_every(
            &format!("{domain} is Ready 3/3 with its channel"),
            Duration::from_millis(100),
            || async {
                let s = status_of(&cds, domain).await;
                (ready_with_channel(&s), s)
            },
        )
        .await;
        channels.insert(domain, status["channel"].as_u64().unwrap());
    }
    assert_ne!(channels[DOMAINS[0]], channels[DOMAINS[1]], "{channels:?}");

    // Every pod's claim was given its own domain's channel, and nothing else.
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), &namespace);
    let mut domain_of_claim = BTreeMap::new();
    for claim in claims.list(&ListParams::default()).await.unwrap() {
        let pod = claim
            .owner_references()
            .iter()
            .find(|o| o.kind == "Pod")
            .map(|o| o.name.clone())
            .expect("a claim from a template belongs to its pod");
        let pod = pods.get(&pod).await.unwrap();
        domain_of_claim.insert(claim.uid().unwrap(), pod.labels()["job"].clone());
    }
    assert_eq!(domain_of_claim.len(), 6, "{domain_of_claim:?}");
    let mut seen = BTreeSet::new();
    for node in rack.nodes() {
        let specs = cdi_specs(&node.cdi_dir());
        assert_eq!(
            specs.len(),
            2,
            "{}: a claim of each domain: {specs:?}",
            node.name()
        );
        for file in specs {
            let text = std::fs::read_to_string(node.cdi_dir().join(&file)).unwrap();
            let (claim, domain) = domain_of_claim
                .iter()
                .find(|(uid, _)| file.contains(uid.as_str()))
                .unwrap_or_else(|| panic!("{file}: no claim of the test"));
            assert_eq!(
                channels_in_spec(&text),
                BTreeSet::from([channels[domain.as_str()]]),
                "{}: claim {claim} of {domain} must get its domain's channel only: {text}",
                node.name()
            );
            seen.insert(claim.clone());
        }
    }
    assert_eq!(seen.len(), 6);

    // The spec is immutable: a domain cannot switch mode while it has pods.
    let switch = json!({"spec": {"isolation": "IMEXDomain"}});
    let refused = cds
        .patch(DOMAINS[0], &PatchParams::default(), &Patch::Merge(&switch))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("immutable"), "{refused}");

    // The first domain goes: its pods, claims and the domain itself. The second stays
    // Ready on its channel all along.
    let deployments = Api::<Deployment>::namespaced(client.clone(), &namespace);
    deployments
        .delete(DOMAINS[0], &DeleteParams::default())
        .await
        .unwrap();
    let kept = DOMAINS[1];
    let was_ready = std::cell::Cell::new(true);
    wait_every(
        "the first domain's claims are unprepared",
        Duration::from_millis(100),
        || async {
            let s = status_of(&cds, kept).await;
            was_ready.set(was_ready.get() && ready_with_channel(&s));
            let left = pods_of(&pods, &format!("job={}", DOMAINS[0])).await;
            let specs: usize = rack
                .nodes()
                .iter()
                .map(|n| cdi_specs(&n.cdi_dir()).len())
                .sum();
            (left.is_empty() && specs == 3, (left, specs))
        },
    )
    .await;
    cds.delete(DOMAINS[0], &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the first domain is gone", || async {
        (cds.get_opt(DOMAINS[0]).await.unwrap().is_none(), ())
    })
    .await;
    let after = status_of(&cds, kept).await;
    assert!(
        was_ready.get() && ready_with_channel(&after),
        "{kept} stopped being Ready while the other domain left: {after}"
    );
    assert_eq!(after["channel"].as_u64(), Some(channels[kept]));

    deployments
        .delete(kept, &DeleteParams::default())
        .await
        .unwrap();
    wait_for("every claim unprepared", || async {
        let specs: usize = rack
            .nodes()
            .iter()
            .map(|n| cdi_specs(&n.cdi_dir()).len())
            .sum();
        (specs == 0, specs)
    })
    .await;
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
