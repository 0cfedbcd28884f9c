//! The stale-claim check against the API server: what counts as gone (a definite 404,
//! another uid, an allocation elsewhere), what never does (any failure), and the check
//! at start-up and every interval, with an event on the Node.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use domaind_actors::model::{
    AllocationMode, ClaimInfo, ClaimRef, DomainRef, DomainUid, ReadinessPolicy,
};
use domaind_actors::ports::{ClaimRecord, PortError, PrepareState};
use domaind_backends::kube::{KubeClaimSource, KubeStaleClaimNotices};
use domaind_backends::stale::{
    ClaimExistence, FoundClaim, Lookup, PreparedClaims, StaleClaimChecker, StaleReason,
};
use http::Method;
use metrics_util::debugging::DebuggingRecorder;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::apiserver::{
    Expect, compute_domain, counter, pair, reference_claim, status, synced_cache,
};

const NODE: &str = "gb200-rack1-n01";
const DRIVER: &str = "compute-domain.nvidia.com";
const CD_UID: &str = "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11";
const CLAIM_UID: &str = "417f1e95-0271-4510-9e94-d58e9dfa8522";
const CLAIM_PATH: &str =
    "/apis/resource.k8s.io/v1/namespaces/cd-ref/resourceclaims/worker-0-cd-0-2csgh";
const CD_PATH: &str = "/apis/resource.nvidia.com/v1beta1/namespaces/cd-ref/computedomains/training";
const NODE_EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";
const TIMEOUT: Duration = Duration::from_secs(10);

fn claim_ref() -> ClaimRef {
    ClaimRef {
        uid: CLAIM_UID.into(),
        namespace: "cd-ref".into(),
        name: "worker-0-cd-0-2csgh".into(),
    }
}

fn domain_ref() -> DomainRef {
    DomainRef {
        uid: DomainUid(CD_UID.into()),
        namespace: "cd-ref".into(),
        name: "training".into(),
        num_nodes: 0,
    }
}

fn not_found() -> Value {
    status(
        404,
        "NotFound",
        "resourceclaims \"worker-0-cd-0-2csgh\" not found",
    )
}

fn existence(
    client: kube::Client,
    cached: Vec<domaind_kube_api::crd::ComputeDomain>,
) -> KubeClaimSource {
    let (cache, writer) = synced_cache(cached);
    // The cache keeps what the writer put there once the writer is gone.
    drop(writer);
    KubeClaimSource::new(client, cache, NODE, DRIVER, TIMEOUT)
}

/// Asks about the reference claim once per scripted answer.
async fn claim_lookups(answers: Vec<Expect>) -> Vec<Lookup<FoundClaim>> {
    let (client, server) = pair();
    let count = answers.len();
    let script = server.play(answers);
    let existence = existence(client, vec![]);
    let mut lookups = Vec::new();
    for _ in 0..count {
        lookups.push(existence.claim(&claim_ref()).await);
    }
    let mut server = script.await.unwrap();
    server.assert_idle();
    lookups
}

#[tokio::test(start_paused = true)]
async fn only_a_definite_not_found_or_another_claim_counts_as_gone() {
    let mut recreated = reference_claim();
    recreated["metadata"]["uid"] = json!("another-uid");
    let mut elsewhere = reference_claim();
    elsewhere["status"]["allocation"]["devices"]["results"][0]["pool"] = json!("gb200-rack1-n09");
    let lookups = claim_lookups(vec![
        Expect::get(CLAIM_PATH).respond(200, reference_claim()),
        Expect::get(CLAIM_PATH).respond(404, not_found()),
        Expect::get(CLAIM_PATH).respond(200, recreated),
        Expect::get(CLAIM_PATH).respond(200, elsewhere),
        // A 404 that is not the API server's "no such object" (a proxy, a path it does
        // not serve) proves nothing.
        Expect::get(CLAIM_PATH).respond_raw(404, b"404 page not found".to_vec()),
        Expect::get(CLAIM_PATH).respond(503, status(503, "ServiceUnavailable", "etcd")),
        Expect::get(CLAIM_PATH).respond(403, status(403, "Forbidden", "no get on claims")),
        Expect::get(CLAIM_PATH).respond(429, status(429, "TooManyRequests", "slow down")),
        Expect::get(CLAIM_PATH).hang(),
    ])
    .await;
    let found = |uid: &str, allocated_here| {
        Lookup::Found(FoundClaim {
            uid: uid.into(),
            allocated_here,
        })
    };
    assert_eq!(lookups[0], found(CLAIM_UID, true));
    assert_eq!(lookups[1], Lookup::NotFound);
    assert_eq!(lookups[2], found("another-uid", true));
    assert_eq!(lookups[3], found(CLAIM_UID, false));
    for (i, lookup) in lookups[4..].iter().enumerate() {
        assert!(
            matches!(lookup, Lookup::Failed(_)),
            "answer {}: {lookup:?}",
            i + 4
        );
    }
    let Lookup::Failed(why) = &lookups[8] else {
        unreachable!()
    };
    assert!(why.contains("did not answer within 10s"), "{why}");
}

#[tokio::test]
async fn a_domain_in_the_cache_exists_without_asking_and_others_are_asked() {
    let (client, server) = pair();
    let script = server.play(vec![
        Expect::get(CD_PATH).respond(
            404,
            status(404, "NotFound", "computedomains \"training\" not found"),
        ),
        Expect::get(CD_PATH).respond(
            200,
            json!(compute_domain("cd-ref", "training", "new-uid", 1)),
        ),
        Expect::get(CD_PATH).respond(500, status(500, "InternalError", "boom")),
    ]);
    let cached = existence(
        pair().0,
        vec![compute_domain("cd-ref", "training", CD_UID, 1)],
    );
    assert_eq!(
        cached.domain(&domain_ref()).await,
        Lookup::Found(CD_UID.into())
    );
    let uncached = existence(client, vec![]);
    assert_eq!(uncached.domain(&domain_ref()).await, Lookup::NotFound);
    assert_eq!(
        uncached.domain(&domain_ref()).await,
        Lookup::Found("new-uid".into())
    );
    assert!(matches!(
        uncached.domain(&domain_ref()).await,
        Lookup::Failed(_)
    ));
    let mut server = script.await.unwrap();
    server.assert_idle();
}

/// A node's checkpointed claims; a release forgets one, as unprepare does.
#[derive(Default)]
struct FakeNode(Mutex<BTreeMap<String, ClaimRecord>>);

#[async_trait]
impl PreparedClaims for FakeNode {
    async fn claims(&self) -> Result<Vec<ClaimRecord>, PortError> {
        Ok(self.0.lock().unwrap().values().cloned().collect())
    }

    async fn release(&self, claim: &ClaimRef) -> Result<(), PortError> {
        self.0.lock().unwrap().remove(&claim.uid);
        Ok(())
    }
}

fn record(claim: ClaimRef) -> ClaimRecord {
    ClaimRecord {
        claim,
        info: ClaimInfo {
            domain: domain_ref(),
            allocation_mode: AllocationMode::Single,
            readiness: None,
            devices: Vec::new(),
            isolation: Default::default(),
            admin_access: false,
        },
        policy: ReadinessPolicy::Local,
        state: PrepareState::PrepareCompleted,
        devices: Vec::new(),
        channel: None,
    }
}

#[tokio::test(start_paused = true)]
async fn stale_claims_are_released_at_start_and_at_each_interval_with_an_event_on_the_node() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let second = ClaimRef {
        uid: "second-uid".into(),
        namespace: "cd-ref".into(),
        name: "worker-1-cd-0-x7k2p".into(),
    };
    let second_path =
        "/apis/resource.k8s.io/v1/namespaces/cd-ref/resourceclaims/worker-1-cd-0-x7k2p";
    let mut second_claim = reference_claim();
    second_claim["metadata"]["uid"] = json!("second-uid");
    second_claim["metadata"]["name"] = json!("worker-1-cd-0-x7k2p");
    let node = Arc::new(FakeNode::default());
    node.0.lock().unwrap().extend([
        (CLAIM_UID.to_owned(), record(claim_ref())),
        ("second-uid".to_owned(), record(second.clone())),
    ]);
    let interval = Duration::from_secs(300);
    let event = |claim: &'static str| {
        Expect::new(Method::POST, NODE_EVENTS)
            .body(move |event: &Value| {
                assert_eq!(event["type"], "Warning");
                assert_eq!(event["reason"], "StaleClaimReleased");
                assert_eq!(event["reportingController"], "domaind");
                assert_eq!(event["reportingInstance"], NODE);
                assert_eq!(
                    event["regarding"],
                    json!({"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE})
                );
                assert_eq!(event["related"]["kind"], "ResourceClaim");
                assert_eq!(event["related"]["name"], claim);
                let note = event["note"].as_str().unwrap();
                assert!(
                    note.contains(claim) && note.contains("no longer exists"),
                    "{note}"
                );
            })
            .echo()
    };
    let (client, server) = pair();
    let script = server.play(vec![
        // At start: the first claim is gone, the second exists; the domain is cached.
        Expect::get(CLAIM_PATH).respond(404, not_found()),
        Expect::get(second_path).respond(200, second_claim),
        event("worker-0-cd-0-2csgh"),
        // One interval later the API server fails: nothing is released.
        Expect::get(second_path).respond(503, status(503, "ServiceUnavailable", "etcd")),
        // The next, the second claim is gone too.
        Expect::get(second_path).respond(404, not_found()),
        event("worker-1-cd-0-x7k2p"),
    ]);
    let (cache, _writer) = synced_cache(vec![compute_domain("cd-ref", "training", CD_UID, 1)]);
    let checker = StaleClaimChecker::new(
        Arc::new(KubeClaimSource::new(
            client.clone(),
            cache,
            NODE,
            DRIVER,
            TIMEOUT,
        )),
        node.clone(),
        Arc::new(KubeStaleClaimNotices::new(client, NODE, TIMEOUT)),
    );
    let stop = CancellationToken::new();
    let started = tokio::time::Instant::now();
    let task = tokio::spawn(checker.run(interval, stop.clone()));
    let mut server = script.await.unwrap();
    // The last answer came at the start of the third check: two intervals in.
    assert_eq!(started.elapsed(), interval * 2);
    stop.cancel();
    task.await.unwrap();
    server.assert_idle();
    assert!(node.0.lock().unwrap().is_empty());

    let snapshot = snapshotter.snapshot().into_vec();
    let released = |reason: &StaleReason| {
        counter(
            &snapshot,
            "domaind_stale_claims_released_total",
            &[("reason", reason.label())],
        )
    };
    assert_eq!(released(&StaleReason::ClaimDeleted), 2);
    let checks = |outcome| {
        counter(
            &snapshot,
            "domaind_stale_claim_checks_total",
            &[("outcome", outcome)],
        )
    };
    assert_eq!((checks("clean"), checks("undecided")), (2, 1));
}
