//! Rack mode against a scripted API server: the ComputeDomain a new clique gets.

use std::collections::BTreeSet;

use http::{Method, StatusCode};
use kube::Api;
use serde_json::json;

use super::api::pair;
use crate::controller::rack::{RackSettings, create_domains, domain_name, missing};
use crate::crd::ComputeDomain;

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

    assert_eq!(creating.await.unwrap().unwrap(), 1);
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
