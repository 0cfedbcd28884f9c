//! Rack mode against a scripted API server: the ComputeDomain a new clique gets.

use std::collections::BTreeSet;

use http::{Method, StatusCode};
use kube::Api;
use serde_json::json;

use crate::rack::{RackSettings, create_domains, domain_name, missing};
use domaind_kube_api::crd::ComputeDomain;
use domaind_kube_api::testing::pair;

const CDS_PATH: &str = "/apis/resource.nvidia.com/v1beta1/namespaces/gpu-operator/computedomains";

#[tokio::test]
async fn a_new_clique_gets_its_domain_and_one_created_meanwhile_is_fine() {
    let settings = RackSettings {
        namespace: "gpu-operator".into(),
        label: "nvidia.com/gpu.clique".into(),
    };
    let cliques: BTreeSet<String> = [
        "1ea0c1b6-1f0a-4d0b-9a1e-6e2f1c3b4a5d.32766",
        "7d1ea9e0-8a6b-4bd1-8ff5-3a9d1c2e4f60.1",
        "S0_RACK",
    ]
    .map(String::from)
    .into();
    let existing: BTreeSet<String> = ["7d1ea9e0-8a6b-4bd1-8ff5-3a9d1c2e4f60.1".to_string()].into();
    let wanted = missing(&cliques, &existing);
    assert_eq!(
        wanted,
        vec!["1ea0c1b6-1f0a-4d0b-9a1e-6e2f1c3b4a5d.32766", "S0_RACK"]
    );

    let (client, mut server) = pair();
    let api: Api<ComputeDomain> = Api::namespaced(client, &settings.namespace);
    let creating = tokio::spawn({
        let settings = settings.clone();
        let wanted: Vec<String> = wanted.iter().map(|s| s.to_string()).collect();
        async move {
            let wanted: Vec<&str> = wanted.iter().map(String::as_str).collect();
            create_domains(&api, &wanted, &settings).await
        }
    });

    let call = server.expect(Method::POST, CDS_PATH).await;
    assert_eq!(
        call.body,
        json!({
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomain",
            "metadata": {
                "name": "1ea0c1b6-1f0a-4d0b-9a1e-6e2f1c3b4a5d.32766",
                "namespace": "gpu-operator",
                "labels": {
                    "nvidia.com/gpu.clique": "1ea0c1b6-1f0a-4d0b-9a1e-6e2f1c3b4a5d.32766",
                    "app.kubernetes.io/managed-by": "domaind-controller"
                }
            },
            "spec": {
                "numNodes": 0,
                "channel": {
                    "resourceClaimTemplate": {
                        "name": "imex-channel-1ea0c1b6-1f0a-4d0b-9a1e-6e2f1c3b4a5d.32766"
                    },
                    "allocationMode": "Single"
                }
            }
        })
    );
    let answer = call.body.clone();
    call.respond(StatusCode::CREATED, &answer);

    // Another replica (or a person) created this one between the look and the write.
    let call = server.expect(Method::POST, CDS_PATH).await;
    assert_eq!(call.body["metadata"]["name"], domain_name("S0_RACK"));
    assert_eq!(
        call.body["metadata"]["labels"]["nvidia.com/gpu.clique"],
        "S0_RACK"
    );
    call.fail(409, "AlreadyExists");

    assert_eq!(
        creating.await.unwrap().unwrap(),
        vec![
            "1ea0c1b6-1f0a-4d0b-9a1e-6e2f1c3b4a5d.32766".to_string(),
            domain_name("S0_RACK")
        ]
    );
    server.done().await;
}

#[tokio::test]
async fn other_failures_stop_the_round_for_a_retry() {
    let settings = RackSettings {
        namespace: "gpu-operator".into(),
        label: "nvidia.com/gpu.clique".into(),
    };
    let (client, mut server) = pair();
    let api: Api<ComputeDomain> = Api::namespaced(client, &settings.namespace);
    let creating =
        tokio::spawn(async move { create_domains(&api, &["a.1", "b.2"], &settings).await });
    server
        .expect(Method::POST, CDS_PATH)
        .await
        .fail(403, "Forbidden");
    assert!(creating.await.unwrap().is_err());
    server.done().await;
}

fn node(name: &str, clique: &str, version: &str) -> serde_json::Value {
    json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": {
            "name": name,
            "resourceVersion": version,
            "labels": {"nvidia.com/gpu.clique": clique}
        }
    })
}

/// Takes the next two requests, whichever order they come in: the node watch (returned
/// unanswered) and the creation of the CD named `cd`.
async fn watch_and_create(
    server: &mut domaind_kube_api::testing::ApiServer,
    cd: &str,
) -> domaind_kube_api::testing::Call {
    let (first, second) = (server.next().await, server.next().await);
    let (watch, create) = if first.method == Method::GET {
        (first, second)
    } else {
        (second, first)
    };
    assert_eq!(watch.path, "/api/v1/nodes");
    watch.assert_query(&[
        ("watch", "true"),
        ("labelSelector", "nvidia.com/gpu.clique"),
    ]);
    assert_eq!(
        (&create.method, create.path.as_str()),
        (&Method::POST, CDS_PATH)
    );
    assert_eq!(create.body["metadata"]["name"], cd);
    let answer = create.body.clone();
    create.respond(StatusCode::CREATED, &answer);
    watch
}

#[tokio::test]
async fn nodes_of_a_new_clique_get_a_domain_as_they_appear() {
    use kube::runtime::{reflector, watcher};
    use tokio_util::sync::CancellationToken;

    let settings = RackSettings {
        namespace: "gpu-operator".into(),
        label: "nvidia.com/gpu.clique".into(),
    };
    // The controller's store of ComputeDomains: clique a.1 has its domain already.
    let (domains, mut writer) = reflector::store::<ComputeDomain>();
    let mut existing = crate::rack::desired_domain("a.1", &settings);
    existing.metadata.uid = Some("cd-a".into());
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitApply(existing));
    writer.apply_watcher_event(&watcher::Event::InitDone);

    let (client, mut server) = pair();
    let stop = CancellationToken::new();
    let running = tokio::spawn(crate::rack::run(client, settings, domains, stop.clone()));

    // The nodes carrying the label, metadata only.
    let list = server.expect(Method::GET, "/api/v1/nodes").await;
    list.assert_query(&[("labelSelector", "nvidia.com/gpu.clique")]);
    list.ok(&json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadataList",
        "metadata": {"resourceVersion": "10"},
        "items": [node("node-1", "a.1", "5"), node("node-2", "b.2", "6"), node("node-3", "b.2", "7")]
    }));
    // b.2 has no domain: one is created (once, for its two nodes).
    let watch = watch_and_create(&mut server, "b.2").await;

    // A node of a new clique joins.
    let added = json!({"type": "ADDED", "object": node("node-4", "c.3", "11")});
    watch.respond(StatusCode::OK, &added);
    let _rewatch = watch_and_create(&mut server, "c.3").await;

    stop.cancel();
    running.await.unwrap();
    drop(writer);
    server.done().await;
}
