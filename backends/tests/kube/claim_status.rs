//! Claims' device status against a scripted API server: the claim read once, our entries
//! applied to the status subresource under the driver's field manager, and every answer
//! sorted (the claim as written, gone, a failure to retry).

use std::time::Duration;

use domaind_actors::model::{AllocatedDevice, ClaimRef, CliqueId, DomainRef, DomainUid};
use domaind_actors::ports::ErrorKind;
use domaind_actors::rules::channel_health::{ChannelHealth, DomainHealth, HealthReason};
use domaind_actors::{HealthView, PreparedDevice};
use domaind_backends::kube::claim_status::{Book, Step};
use domaind_backends::kube::claim_status_writer::{ClaimStatusApi, KubeClaimStatus};
use domaind_backoff::Backoff;
use domaind_kube_api::names::claim_status_field_manager;
use serde_json::{Value, json};
use time::macros::datetime;
use tokio::time::Instant;

use crate::apiserver::{Expect, pair, reference_claim, status};

const NODE: &str = "gb200-rack1-n01";
const DRIVER: &str = "compute-domain.nvidia.com";
const CLAIM_UID: &str = "417f1e95-0271-4510-9e94-d58e9dfa8522";
const CLAIM_PATH: &str =
    "/apis/resource.k8s.io/v1/namespaces/cd-ref/resourceclaims/worker-0-cd-0-2csgh";

fn claim() -> ClaimRef {
    ClaimRef {
        uid: CLAIM_UID.into(),
        namespace: "cd-ref".into(),
        name: "worker-0-cd-0-2csgh".into(),
    }
}

fn view() -> HealthView {
    HealthView {
        devices: vec![PreparedDevice {
            claim: claim(),
            device: AllocatedDevice {
                request: "channel".into(),
                pool: NODE.into(),
                device: "channel-0".into(),
            },
            domain: DomainRef {
                uid: DomainUid("5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11".into()),
                namespace: "cd-ref".into(),
                name: "training".into(),
                num_nodes: 0,
            },
            status: Some(DomainHealth {
                health: ChannelHealth::Healthy,
                reason: HealthReason::ImexReady,
                clique: CliqueId("8c6d1a2f.32766".into()),
                index: Some(0),
                channel: None,
                linked_peers: 1,
                peers: 1,
                imex_failing: None,
            }),
        }],
        imex_failing: None,
    }
}

/// The reference claim with `devices` as its `status.devices`, at generation 1.
fn claim_with(devices: Value) -> Value {
    let mut claim = reference_claim();
    claim["metadata"]["generation"] = json!(1);
    claim["status"]["devices"] = devices;
    claim
}

fn api(client: kube::Client) -> KubeClaimStatus {
    KubeClaimStatus::new(client, DRIVER, Duration::from_secs(10))
}

#[tokio::test]
async fn the_claim_is_read_then_our_entries_applied_to_its_status_by_the_drivers_manager() {
    let (client, server) = pair();
    let another_drivers = json!({"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-0"});
    let written = std::sync::Arc::new(std::sync::Mutex::new(Value::Null));
    let keep = written.clone();
    let script =
        server.play(vec![
        Expect::get(CLAIM_PATH).respond(200, claim_with(json!([another_drivers]))),
        Expect::patch(format!("{CLAIM_PATH}/status"))
            .apply_by(&claim_status_field_manager(DRIVER))
            .body(move |body: &Value| {
                assert_eq!(body["apiVersion"], "resource.k8s.io/v1");
                assert_eq!(body["kind"], "ResourceClaim");
                assert_eq!(
                    body["metadata"],
                    json!({"name": "worker-0-cd-0-2csgh", "namespace": "cd-ref", "uid": CLAIM_UID}),
                    "no resourceVersion: an apply cannot conflict"
                );
                let devices = body["status"]["devices"].as_array().unwrap();
                assert_eq!(devices.len(), 1, "ours only: {body}");
                assert_eq!(
                    (&devices[0]["driver"], &devices[0]["pool"], &devices[0]["device"]),
                    (&json!(DRIVER), &json!(NODE), &json!("channel-0"))
                );
                assert_eq!(body["status"].as_object().unwrap().len(), 1, "{body}");
                *keep.lock().unwrap() = body["status"]["devices"][0].clone();
            })
            .respond(
                200,
                claim_with(json!([another_drivers, {
                    "driver": DRIVER, "pool": NODE, "device": "channel-0",
                    "conditions": [{"type": "Ready", "status": "True", "reason": "ImexReady",
                        "message": "IMEX ready on this node, 1 of 1 IMEX peers linked",
                        "lastTransitionTime": "2026-11-22T10:00:00Z", "observedGeneration": 1}],
                    "data": {
                        "computeDomain": {"namespace": "cd-ref", "name": "training",
                                          "uid": "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11"},
                        "cliqueID": "8c6d1a2f.32766", "index": 0, "channel": 0,
                        "imexPeers": {"linked": 1, "total": 1},
                    },
                }])),
            ),
    ]);
    let api = api(client);
    let mut book = Book::new(
        DRIVER,
        Duration::ZERO,
        Duration::ZERO,
        Backoff::new(Duration::from_millis(200), Duration::from_secs(30)),
    );
    let now = Instant::now();
    book.observe(&view(), now);
    let uid = claim().uid;
    let at = datetime!(2026-11-22 10:00:00 UTC);
    assert_eq!(book.step(&uid, at), Step::Read(claim()));
    let seen = api.read(&claim()).await.unwrap();
    assert_eq!(seen.as_ref().unwrap().generation, Some(1));
    assert!(seen.as_ref().unwrap().devices.is_empty(), "not ours");
    book.read(&uid, Ok(seen), now);
    let Step::Apply(claim, body) = book.step(&uid, at) else {
        panic!("a write")
    };
    let answer = api.apply(&claim, &body).await.unwrap();
    book.written(&uid, Ok(answer), now);
    assert_eq!(
        book.step(&uid, at),
        Step::Done,
        "the answer holds what was written"
    );
    let mut server = script.await.unwrap();
    server.assert_idle();
    assert_eq!(
        written.lock().unwrap()["conditions"][0]["observedGeneration"],
        1
    );
}

#[tokio::test]
async fn a_claim_deleted_or_recreated_is_gone_and_failures_are_sorted() {
    let (client, server) = pair();
    let mut recreated = claim_with(json!([]));
    recreated["metadata"]["uid"] = json!("another-uid");
    let script = server.play(vec![
        Expect::get(CLAIM_PATH).respond(
            404,
            status(404, "NotFound", "resourceclaims.resource.k8s.io \"worker-0-cd-0-2csgh\" not found"),
        ),
        Expect::get(CLAIM_PATH).respond(200, recreated),
        Expect::patch(format!("{CLAIM_PATH}/status")).respond(
            404,
            status(404, "NotFound", "resourceclaims.resource.k8s.io \"worker-0-cd-0-2csgh\" not found"),
        ),
        Expect::patch(format!("{CLAIM_PATH}/status")).respond(
            422,
            status(
                422,
                "Invalid",
                "ResourceClaim.resource.k8s.io \"worker-0-cd-0-2csgh\" is invalid: metadata.uid: Invalid value: \"417f1e95\": field is immutable",
            ),
        ),
        Expect::patch(format!("{CLAIM_PATH}/status")).respond(
            403,
            status(
                403,
                "Forbidden",
                "resourceclaims.resource.k8s.io \"worker-0-cd-0-2csgh\" is forbidden: User \"system:serviceaccount:domaind:domaind-node\" cannot patch resource \"resourceclaims/status\"",
            ),
        ),
        Expect::patch(format!("{CLAIM_PATH}/status")).respond(
            422,
            status(
                422,
                "Invalid",
                "ResourceClaim.resource.k8s.io \"worker-0-cd-0-2csgh\" is invalid: status.devices: Forbidden: changing status.devices requires resource=\"resourceclaims/driver\", verb=\"[arbitrary-node:patch]\" permission",
            ),
        ),
        Expect::get(CLAIM_PATH).respond(500, status(500, "InternalError", "etcdserver: timeout")),
        Expect::get(CLAIM_PATH).respond(429, status(429, "TooManyRequests", "slow down")),
    ]);
    let api = api(client);
    let body = json!({});
    assert_eq!(api.read(&claim()).await.unwrap(), None, "deleted");
    assert_eq!(api.read(&claim()).await.unwrap(), None, "another claim now");
    assert_eq!(api.apply(&claim(), &body).await.unwrap(), None, "deleted");
    assert_eq!(api.apply(&claim(), &body).await.unwrap(), None, "recreated");
    let refused = api.apply(&claim(), &body).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Permanent);
    assert!(refused.to_string().contains("403"), "{refused}");
    let not_ours = api.apply(&claim(), &body).await.unwrap_err();
    assert_eq!(not_ours.kind(), ErrorKind::Permanent, "{not_ours}");
    assert_eq!(
        api.read(&claim()).await.unwrap_err().kind(),
        ErrorKind::Transient
    );
    assert_eq!(
        api.read(&claim()).await.unwrap_err().kind(),
        ErrorKind::Transient
    );
    let mut server = script.await.unwrap();
    server.assert_idle();
}
