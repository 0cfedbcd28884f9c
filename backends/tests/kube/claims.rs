//! The claim source against a scripted API server: the real API server's claim, and
//! every way a claim can be refused.

use std::time::Duration;

use domaind_actors::model::{
    AllocatedDevice, AllocationMode, ClaimInfo, ClaimRef, DomainRef, DomainUid,
};
use domaind_actors::ports::{ClaimError, ClaimSource};
use domaind_backends::kube::{BAD_CLAIMS, DomainCache, KubeClaimSource};
use kube::runtime::watcher;
use metrics_util::debugging::DebuggingRecorder;
use serde_json::{Value, json};

use crate::apiserver::{
    Expect, compute_domain, counter, pair, reference_claim, status, synced_cache, unsynced_cache,
};

const NODE: &str = "gb200-rack1-n01";
const DRIVER: &str = "compute-domain.nvidia.com";
const CD_UID: &str = "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11";
const CLAIM_UID: &str = "417f1e95-0271-4510-9e94-d58e9dfa8522";
const CLAIM_PATH: &str =
    "/apis/resource.k8s.io/v1/namespaces/cd-ref/resourceclaims/worker-0-cd-0-2csgh";
const CDS_PATH: &str = "/apis/resource.nvidia.com/v1beta1/namespaces/cd-ref/computedomains";

fn asked() -> ClaimRef {
    ClaimRef {
        uid: CLAIM_UID.into(),
        namespace: "cd-ref".into(),
        name: "worker-0-cd-0-2csgh".into(),
    }
}

fn training() -> domaind_kube_api::crd::ComputeDomain {
    compute_domain("cd-ref", "training", CD_UID, 1)
}

/// Resolves the reference claim (changed by `edit`) with `cache`, the API server
/// playing `after_get` after answering the GET of the claim with it. Returns the
/// result and the bad-claim counters by reason.
async fn resolve(
    cache: DomainCache,
    claim_answer: Expect,
    after_get: Vec<Expect>,
) -> (Result<ClaimInfo, ClaimError>, Vec<(String, u64)>) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (client, server) = pair();
    let mut scenario = vec![claim_answer];
    scenario.extend(after_get);
    let script = server.play(scenario);
    let source = KubeClaimSource::new(client, cache, NODE, DRIVER, Duration::from_secs(10));
    let result = source.resolve(&asked()).await;
    let mut server = script.await.unwrap();
    server.assert_idle();
    let snapshot = snapshotter.snapshot().into_vec();
    let reasons = [
        "uid_mismatch",
        "not_allocated",
        "other_driver",
        "other_node",
        "no_config",
        "bad_config",
        "unknown_domain",
        "namespace_mismatch",
        "mixed_admin_access",
        "not_a_channel",
    ]
    .into_iter()
    .map(|r| {
        (
            r.to_owned(),
            counter(&snapshot, BAD_CLAIMS, &[("reason", r)]),
        )
    })
    .filter(|(_, n)| *n > 0)
    .collect();
    (result, reasons)
}

fn devices(claim: &mut Value) -> &mut Value {
    &mut claim["status"]["allocation"]["devices"]
}

fn get_claim(claim: Value) -> Expect {
    Expect::get(CLAIM_PATH).respond(200, claim)
}

fn permanent(result: Result<ClaimInfo, ClaimError>) -> String {
    match result {
        Err(ClaimError::Permanent(message)) => message,
        other => panic!("expected a permanent error, got {other:?}"),
    }
}

fn transient(result: Result<ClaimInfo, ClaimError>) -> String {
    match result {
        Err(ClaimError::Transient(message)) => message,
        other => panic!("expected a transient error, got {other:?}"),
    }
}

#[tokio::test]
async fn the_real_api_servers_claim_resolves_to_its_domain_from_the_cache() {
    let (cache, _writer) = synced_cache(vec![training()]);
    let (result, bad) = resolve(cache, get_claim(reference_claim()), vec![]).await;
    assert_eq!(
        result.unwrap(),
        ClaimInfo {
            domain: DomainRef {
                uid: DomainUid(CD_UID.into()),
                namespace: "cd-ref".into(),
                name: "training".into(),
                num_nodes: 2,
            },
            allocation_mode: AllocationMode::Single,
            readiness: None,
            devices: vec![AllocatedDevice {
                request: "channel".into(),
                pool: NODE.into(),
                device: "channel-0".into(),
            }],
            isolation: Default::default(),
            admin_access: false,
        }
    );
    assert!(bad.is_empty());
}

#[tokio::test]
async fn claims_that_cannot_be_ours_are_refused_for_good_and_counted() {
    let edit = |f: fn(&mut Value)| {
        let mut claim = reference_claim();
        f(&mut claim);
        claim
    };
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            edit(|c| c["metadata"]["uid"] = json!("recreated-uid")),
            "deleted and recreated",
            "uid_mismatch",
        ),
        (
            edit(|c| c["status"] = json!({})),
            "is not allocated",
            "not_allocated",
        ),
        (
            edit(|c| devices(c)["results"][0]["driver"] = json!("gpu.nvidia.com")),
            "allocated by driver(s) gpu.nvidia.com, not compute-domain.nvidia.com",
            "other_driver",
        ),
        (
            edit(|c| devices(c)["results"][0]["pool"] = json!("gb200-rack1-n07")),
            "placed it on another node",
            "other_node",
        ),
        (
            edit(|c| devices(c)["config"] = json!([])),
            "needs a ComputeDomainChannelConfig",
            "no_config",
        ),
        (
            edit(|c| {
                devices(c)["config"][0]["opaque"]["parameters"]["kind"] =
                    json!("ComputeDomainDaemonConfig")
            }),
            "kind \"ComputeDomainDaemonConfig\"; expected resource.nvidia.com/v1beta1, ComputeDomainChannelConfig",
            "bad_config",
        ),
        (
            edit(|c| {
                devices(c)["config"][0]["opaque"]["parameters"]["allocationMode"] = json!("Many")
            }),
            "unknown variant `Many`",
            "bad_config",
        ),
    ];
    for (claim, expected, reason) in cases {
        let (cache, _writer) = synced_cache(vec![training()]);
        let (result, bad) = resolve(cache, get_claim(claim), vec![]).await;
        let message = permanent(result);
        assert!(message.contains(expected), "{reason}: {message}");
        assert!(
            message.starts_with(&format!("claim cd-ref/worker-0-cd-0-2csgh ({CLAIM_UID})")),
            "{message}"
        );
        assert_eq!(bad, vec![(reason.to_owned(), 1)]);
    }
}

#[tokio::test]
async fn a_deleted_claim_is_refused_for_good_but_not_counted_as_bad() {
    let (cache, _writer) = synced_cache(vec![training()]);
    let gone = Expect::get(CLAIM_PATH).respond(404, status(404, "NotFound", "not found"));
    let (result, bad) = resolve(cache, gone, vec![]).await;
    assert!(permanent(result).contains("does not exist in the API server"));
    assert!(bad.is_empty());
}

#[tokio::test]
async fn an_unknown_domain_is_looked_up_once_live_before_it_is_refused() {
    // The cache has synced without it: one live list of the claim's namespace.
    let (cache, _writer) = synced_cache(vec![]);
    let list_empty = Expect::get(CDS_PATH).respond(
        200,
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainList",
               "metadata": {"resourceVersion": "7"}, "items": []}),
    );
    let (result, bad) = resolve(cache, get_claim(reference_claim()), vec![list_empty]).await;
    let message = permanent(result);
    assert!(
        message.contains(&format!("names ComputeDomain uid {CD_UID}"))
            && message.contains("no ComputeDomain in namespace cd-ref has that uid"),
        "{message}"
    );
    assert_eq!(bad, vec![("unknown_domain".to_owned(), 1)]);

    // The watch trails the API server: the live list has it.
    let (cache, _writer) = synced_cache(vec![]);
    let list_found = Expect::get(CDS_PATH).respond(
        200,
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainList",
               "metadata": {"resourceVersion": "8"}, "items": [training()]}),
    );
    let (result, bad) = resolve(cache, get_claim(reference_claim()), vec![list_found]).await;
    assert_eq!(result.unwrap().domain.name, "training");
    assert!(bad.is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_unknown_domain_before_the_cache_synced_is_worth_asking_again() {
    // The first list arrives while the claim waits for it.
    let (cache, mut writer) = unsynced_cache();
    let fill = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(training()));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        writer
    });
    let (result, _) = resolve(cache, get_claim(reference_claim()), vec![]).await;
    assert_eq!(result.unwrap().domain.name, "training");
    let _writer = fill.await.unwrap();

    // It does not arrive within the API timeout: call again.
    let (cache, _writer) = unsynced_cache();
    let started = tokio::time::Instant::now();
    let (result, bad) = resolve(cache, get_claim(reference_claim()), vec![]).await;
    assert!(transient(result).contains("has not synced"));
    assert_eq!(started.elapsed(), Duration::from_secs(10));
    assert!(bad.is_empty());
}

#[tokio::test]
async fn a_domain_in_another_namespace_cannot_be_joined() {
    let (cache, _writer) = synced_cache(vec![compute_domain("team-b", "training", CD_UID, 1)]);
    let (result, bad) = resolve(cache, get_claim(reference_claim()), vec![]).await;
    let message = permanent(result);
    assert!(
        message
            .contains("is in namespace cd-ref but its ComputeDomain team-b/training is in team-b"),
        "{message}"
    );
    assert_eq!(bad, vec![("namespace_mismatch".to_owned(), 1)]);
}

/// The reference claim as allocated with `adminAccess` (a monitoring pod's).
fn admin_claim() -> Value {
    let mut claim = reference_claim();
    devices(&mut claim)["results"][0]["adminAccess"] = json!(true);
    claim
}

#[tokio::test]
async fn an_admin_claim_may_name_a_domain_of_any_namespace() {
    let (cache, _writer) = synced_cache(vec![compute_domain("team-b", "training", CD_UID, 1)]);
    let (result, bad) = resolve(cache, get_claim(admin_claim()), vec![]).await;
    let info = result.unwrap();
    assert!(info.admin_access && !info.joins_domain());
    assert_eq!(info.domain.namespace, "team-b");
    assert!(bad.is_empty());

    // Not in the cache: one live list of every namespace, not only the claim's.
    let (cache, _writer) = synced_cache(vec![]);
    let list_all = Expect::get("/apis/resource.nvidia.com/v1beta1/computedomains").respond(
        200,
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainList",
               "metadata": {"resourceVersion": "9"}, "items": []}),
    );
    let (result, bad) = resolve(cache, get_claim(admin_claim()), vec![list_all]).await;
    let message = permanent(result);
    assert!(
        message.contains("(adminAccess) names ComputeDomain uid")
            && message.contains("no ComputeDomain has that uid"),
        "{message}"
    );
    assert_eq!(bad, vec![("unknown_domain".to_owned(), 1)]);
}

#[tokio::test]
async fn a_claim_both_admin_and_not_is_refused_for_good_and_counted() {
    let (cache, _writer) = synced_cache(vec![training()]);
    let mut claim = admin_claim();
    let mut member = devices(&mut claim)["results"][0].clone();
    member["request"] = json!("channel/member");
    member["adminAccess"] = json!(false);
    devices(&mut claim)["results"]
        .as_array_mut()
        .unwrap()
        .push(member);
    let (result, bad) = resolve(cache, get_claim(claim), vec![]).await;
    let message = permanent(result);
    assert!(message.contains("make them two claims"), "{message}");
    assert_eq!(bad, vec![("mixed_admin_access".to_owned(), 1)]);
}

#[tokio::test]
async fn an_api_server_that_fails_or_forbids_is_worth_asking_again() {
    let (cache, _writer) = synced_cache(vec![training()]);
    let unavailable =
        Expect::get(CLAIM_PATH).respond(503, status(503, "ServiceUnavailable", "etcd is sad"));
    let (result, _) = resolve(cache.clone(), unavailable, vec![]).await;
    assert!(transient(result).contains("503 ServiceUnavailable"));

    let forbidden = Expect::get(CLAIM_PATH)
        .respond(403, status(403, "Forbidden", "resourceclaims is forbidden"));
    let (result, bad) = resolve(cache, forbidden, vec![]).await;
    let message = transient(result);
    assert!(message.contains("lacks a permission"), "{message}");
    assert!(bad.is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_api_server_that_does_not_answer_times_out_as_retryable() {
    let (cache, _writer) = synced_cache(vec![training()]);
    let (result, _) = resolve(cache, Expect::get(CLAIM_PATH).hang(), vec![]).await;
    assert!(
        transient(result).contains("did not answer within 10s"),
        "a hung call ends at the API timeout"
    );
}
