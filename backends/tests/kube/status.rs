//! The status sink: one server-side apply of the status subresource per write.

use std::time::Duration;

use domaind_actors::model::{DomainRef, DomainUid, Phase};
use domaind_actors::ports::{ErrorKind, StatusSink};
use domaind_actors::rules::status::{DomainStatus, NodeStatus};
use domaind_backends::kube::KubeStatusSink;
use domaind_backends::kube::{corrector, domain_wide};
use domaind_kube_api::names::{
    DOMAIN_STATUS_FIELD_MANAGER, NODE_FIELD_MANAGER, status_field_manager,
};
use metrics_util::debugging::DebuggingRecorder;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::apiserver::{
    Expect, assert_refused_by_kube, compute_domain, counter, pair, status, synced_cache,
    unsynced_cache,
};

const STATUS_PATH: &str =
    "/apis/resource.nvidia.com/v1beta1/namespaces/team-a/computedomains/training/status";

fn domain() -> DomainRef {
    DomainRef {
        uid: DomainUid("cd-uid-1".into()),
        namespace: "team-a".into(),
        name: "training".into(),
        num_nodes: 2,
    }
}

fn document(phase: Phase) -> DomainStatus {
    DomainStatus {
        status: phase,
        ready_nodes: 2,
        total_nodes: 2,
        message: "2/2 nodes ready".into(),
        nodes: ["node-1", "node-2"]
            .iter()
            .enumerate()
            .map(|(i, name)| NodeStatus {
                name: (*name).into(),
                ip_address: format!("10.0.0.{}", i + 1),
                clique_id: "c.1".into(),
                index: Some(i as u16),
                status: phase,
            })
            .collect(),
        channel: None,
    }
}

fn clique(id: &str) -> watch::Receiver<String> {
    watch::channel(id.to_owned()).1
}

fn row(name: &str, clique: &str, status: &str) -> Value {
    json!({"name": name, "ipAddress": "10.0.0.9", "cliqueID": clique, "index": 0, "status": status})
}

/// The cached domain with `rows` written, its domain-wide fields as `status` says.
fn cached_with(
    rows: Vec<Value>,
    status: &str,
    ready: u32,
    message: &str,
) -> domaind_kube_api::crd::ComputeDomain {
    let mut cd = compute_domain("team-a", "training", "cd-uid-1", 3);
    cd.status = Some(
        serde_json::from_value(json!({
            "status": status, "nodes": rows, "readyNodes": ready, "totalNodes": 3,
            "conditions": [{"type": "Ready", "status": if status == "Ready" { "True" } else { "False" },
                            "reason": "NodesNotReady", "message": message,
                            "lastTransitionTime": "2026-11-22T10:00:00Z"}],
        }))
        .unwrap(),
    );
    cd
}

/// The cached domain: generation 3, Ready since a known time.
fn cached() -> domaind_kube_api::crd::ComputeDomain {
    let mut cd = compute_domain("team-a", "training", "cd-uid-1", 3);
    cd.status = Some(
        serde_json::from_value(json!({
            "status": "Ready", "nodes": [], "readyNodes": 2, "totalNodes": 2,
            "conditions": [{"type": "Ready", "status": "True", "reason": "AllNodesReady",
                            "message": "2/2 nodes ready",
                            "lastTransitionTime": "2026-11-22T10:00:00Z"}],
        }))
        .unwrap(),
    );
    cd
}

#[tokio::test]
async fn a_write_is_one_forced_apply_of_the_status_subresource() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (cache, _writer) = synced_cache(vec![cached()]);
    let (client, server) = pair();
    let script = server.play(vec![
        Expect::patch(STATUS_PATH)
            .apply_by(&status_field_manager("c.1"))
            .body(|body: &Value| {
                assert_eq!(body["apiVersion"], "resource.nvidia.com/v1beta1");
                assert_eq!(body["kind"], "ComputeDomain");
                assert_eq!(
                    body["metadata"],
                    json!({"name": "training", "namespace": "team-a", "uid": "cd-uid-1"}),
                    "no resourceVersion: an apply cannot conflict"
                );
                let status = &body["status"];
                assert_eq!(status["status"], "Ready");
                assert_eq!((status["readyNodes"].clone(), status["totalNodes"].clone()), (json!(2), json!(2)));
                assert_eq!(
                    status["nodes"][1],
                    json!({"name": "node-2", "ipAddress": "10.0.0.2", "cliqueID": "c.1", "index": 1, "status": "Ready"})
                );
                assert_eq!(status["observedGeneration"], 3);
                let condition = &status["conditions"][0];
                assert_eq!(condition["type"], "Ready");
                assert_eq!(condition["status"], "True");
                assert_eq!(
                    condition["lastTransitionTime"], "2026-11-22T10:00:00Z",
                    "still Ready: the transition time is the previous one"
                );
                assert_eq!(body.as_object().unwrap().len(), 4, "{body}");
            })
            .echo(),
        Expect::patch(STATUS_PATH)
            .apply_by(&status_field_manager("c.1"))
            .body(|body: &Value| {
                let condition = &body["status"]["conditions"][0];
                assert_eq!(condition["status"], "False");
                assert_ne!(condition["lastTransitionTime"], "2026-11-22T10:00:00Z");
            })
            .echo(),
    ]);
    let sink = KubeStatusSink::new(client, cache, Duration::from_secs(10))
        .for_node("node-1", clique("c.1"));
    sink.write(&domain(), &document(Phase::Ready))
        .await
        .unwrap();
    sink.write(&domain(), &document(Phase::NotReady))
        .await
        .unwrap();
    let mut server = script.await.unwrap();
    server.assert_idle();
    let snapshot = snapshotter.snapshot().into_vec();
    assert_eq!(
        counter(
            &snapshot,
            "domaind_status_writes_total",
            &[("backend", "kube"), ("outcome", "ok")]
        ),
        2
    );
}

#[tokio::test]
async fn a_domain_that_is_gone_is_not_written_and_is_no_error() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    // Deleted before the write: the cache no longer has it, no call is made.
    let (empty, _writer) = synced_cache(vec![]);
    let (client, mut server) = pair();
    KubeStatusSink::new(client, empty, Duration::from_secs(10))
        .write(&domain(), &document(Phase::Ready))
        .await
        .unwrap();
    server.assert_idle();

    // Deleted, or recreated under the same name, while the write was on its way.
    let (cache, _writer) = synced_cache(vec![cached()]);
    let (client, server) = pair();
    let script = server.play(vec![
        Expect::patch(STATUS_PATH).respond(404, status(404, "NotFound", "computedomains \"training\" not found")),
        Expect::patch(STATUS_PATH).respond(
            422,
            status(422, "Invalid", "ComputeDomain \"training\" is invalid: metadata.uid: Invalid value: \"cd-uid-1\": field is immutable"),
        ),
    ]);
    let sink = KubeStatusSink::new(client, cache, Duration::from_secs(10));
    sink.write(&domain(), &document(Phase::Ready))
        .await
        .unwrap();
    sink.write(&domain(), &document(Phase::Ready))
        .await
        .unwrap();
    script.await.unwrap();
    let snapshot = snapshotter.snapshot().into_vec();
    assert_eq!(
        counter(
            &snapshot,
            "domaind_status_writes_total",
            &[("outcome", "gone")]
        ),
        3
    );
}

#[tokio::test]
async fn failures_are_errors_for_the_writer_to_retry() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (cache, _writer) = synced_cache(vec![cached()]);
    let (client, server) = pair();
    let script = server.play(vec![
        Expect::patch(STATUS_PATH)
            .respond(500, status(500, "InternalError", "etcdserver: timeout")),
        Expect::patch(STATUS_PATH).respond(
            422,
            status(
                422,
                "Invalid",
                "status.nodes[0].status: Unsupported value: \"Maybe\"",
            ),
        ),
    ]);
    let sink = KubeStatusSink::new(client, cache, Duration::from_secs(10));
    let error = sink
        .write(&domain(), &document(Phase::Ready))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("500 InternalError"), "{error}");
    assert_eq!(
        error.kind(),
        ErrorKind::Transient,
        "a server failure may pass"
    );
    let error = sink
        .write(&domain(), &document(Phase::Ready))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("Unsupported value"), "{error}");
    assert_eq!(
        error.kind(),
        ErrorKind::Permanent,
        "an invalid body stays invalid"
    );
    assert_refused_by_kube(&error, 422);
    script.await.unwrap();

    // Before the cache synced there is no previous status to keep the condition's
    // time from: not written yet.
    let (unsynced, _writer) = crate::apiserver::unsynced_cache();
    let (client, mut idle) = pair();
    let error = KubeStatusSink::new(client, unsynced, Duration::from_secs(10))
        .write(&domain(), &document(Phase::Ready))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("has not synced"), "{error}");
    assert_eq!(error.kind(), ErrorKind::Transient);
    idle.assert_idle();
    let snapshot = snapshotter.snapshot().into_vec();
    assert_eq!(
        counter(
            &snapshot,
            "domaind_status_writes_total",
            &[("outcome", "failed")]
        ),
        3
    );
}

/// A reporter taking over reads the status as written from the cache: no API call.
#[tokio::test]
async fn the_written_status_is_read_from_the_cache() {
    let (client, mut server) = pair();
    let (cache, _writer) = synced_cache(vec![cached()]);
    let read = KubeStatusSink::new(client.clone(), cache, Duration::from_secs(10))
        .read(&domain())
        .await
        .unwrap()
        .expect("the cached domain has a status");
    assert_eq!(read.status, Phase::Ready);
    assert_eq!((read.ready_nodes, read.total_nodes), (2, 2));
    assert_eq!(read.message, "2/2 nodes ready");

    // A domain without status, and one that is gone: nothing written.
    let (cache, _writer) = synced_cache(vec![compute_domain("team-a", "training", "cd-uid-1", 1)]);
    let sink = KubeStatusSink::new(client.clone(), cache, Duration::from_secs(10));
    assert_eq!(sink.read(&domain()).await.unwrap(), None);
    let (cache, _writer) = synced_cache(vec![]);
    let sink = KubeStatusSink::new(client.clone(), cache, Duration::from_secs(10));
    assert_eq!(sink.read(&domain()).await.unwrap(), None);

    // Before the first list, "nothing" would be a guess: an error, to try again.
    let (cache, _writer) = unsynced_cache();
    let error = KubeStatusSink::new(client, cache, Duration::from_secs(10))
        .read(&domain())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("not synced"), "{error}");
    assert_eq!(error.kind(), ErrorKind::Transient);
    server.assert_idle();
}

/// A domain spanning cliques: this clique applies its own rows only, and the
/// domain-wide fields of every clique's rows (spec.numNodes counts them all). The
/// manager that wrote whole statuses before gives its fields up after the first write.
#[tokio::test]
async fn a_clique_applies_its_own_rows_and_the_fields_of_every_cliques_rows() {
    let (cache, _writer) = synced_cache(vec![cached_with(
        vec![row("node-3", "c.2", "Ready")],
        "NotReady",
        1,
        "1/1 nodes ready",
    )]);
    let (client, server) = pair();
    let answer = json!({
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
        "metadata": {"name": "training", "namespace": "team-a", "uid": "cd-uid-1",
                     "managedFields": [
                         {"manager": "domaind-node", "operation": "Apply", "subresource": "status",
                          "apiVersion": "resource.nvidia.com/v1beta1", "fieldsType": "FieldsV1", "fieldsV1": {}},
                         {"manager": "domaind-node/clique/c.1", "operation": "Apply", "subresource": "status",
                          "apiVersion": "resource.nvidia.com/v1beta1", "fieldsType": "FieldsV1", "fieldsV1": {}}]},
        "spec": {"channel": {"resourceClaimTemplate": {"name": "t"}}, "numNodes": 3},
    });
    let script = server.play(vec![
        Expect::patch(STATUS_PATH)
            .apply_by(&status_field_manager("c.1"))
            .body(|body: &Value| {
                let status = &body["status"];
                let names: Vec<&str> = status["nodes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n["name"].as_str().unwrap())
                    .collect();
                assert_eq!(names, ["node-1", "node-2"], "c.2's row is c.2's to write");
                assert_eq!(status["status"], "Ready");
                assert_eq!(
                    (status["readyNodes"].clone(), status["totalNodes"].clone()),
                    (json!(3), json!(3))
                );
                assert_eq!(
                    status["conditions"][0]["message"],
                    "3/3 nodes ready in 2 NVLink cliques"
                );
            })
            .respond(200, answer),
        Expect::patch(STATUS_PATH)
            .apply_by(NODE_FIELD_MANAGER)
            .body(|body: &Value| {
                assert!(body.get("status").is_none(), "{body}");
                assert_eq!(body["metadata"]["uid"], "cd-uid-1");
            })
            .echo(),
    ]);
    let domain = DomainRef {
        num_nodes: 3,
        ..domain()
    };
    KubeStatusSink::new(client, cache, Duration::from_secs(10))
        .for_node("node-1", clique("c.1"))
        .write(&domain, &document(Phase::Ready))
        .await
        .unwrap();
    let mut server = script.await.unwrap();
    server.assert_idle();
}

/// A reporter of one clique reads back its clique's rows: the other cliques' nodes are
/// never in its view, and taking them for members it has not heard of would list them
/// lost.
#[tokio::test]
async fn a_clique_reads_its_own_rows_back() {
    let (client, mut server) = pair();
    let (cache, _writer) = synced_cache(vec![cached_with(
        vec![
            row("node-1", "c.1", "Ready"),
            row("node-3", "c.2", "NotReady"),
        ],
        "NotReady",
        1,
        "1/2 nodes ready in 2 NVLink cliques, not ready: node-3",
    )]);
    let read = KubeStatusSink::new(client, cache, Duration::from_secs(10))
        .for_node("node-1", clique("c.1"))
        .read(&domain())
        .await
        .unwrap()
        .unwrap();
    let names: Vec<&str> = read.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["node-1"]);
    assert_eq!(
        (read.status, read.ready_nodes, read.total_nodes),
        (Phase::Ready, 1, 1)
    );
    server.assert_idle();
}

/// Two cliques wrote at once, each without the other's latest rows: the rows are
/// right, the domain-wide fields stale. The domain's corrector (its ready row with the
/// smallest name) applies those fields alone, from every row.
#[tokio::test]
async fn the_domain_wide_fields_are_corrected_from_every_cliques_rows() {
    let stale = cached_with(
        vec![
            row("node-1", "c.1", "Ready"),
            row("node-3", "c.2", "Ready"),
            row("node-4", "c.2", "Ready"),
        ],
        "NotReady",
        1,
        "1/3 nodes ready in 2 NVLink cliques, not ready: node-3, node-4",
    );
    let rows = domaind_backends::contract::domain_from_status(stale.status.as_ref().unwrap());
    assert_eq!(corrector(&rows), Some("node-1"));
    let right = domain_wide(&rows, 3);
    assert_eq!((right.status, right.ready_nodes), (Phase::Ready, 3));
    let (cache, _writer) = synced_cache(vec![stale]);
    let (client, server) = pair();
    let script = server.play(vec![
        Expect::patch(STATUS_PATH)
            .apply_by(DOMAIN_STATUS_FIELD_MANAGER)
            .body(|body: &Value| {
                let status = &body["status"];
                assert!(
                    status.get("nodes").is_none(),
                    "rows stay their cliques': {body}"
                );
                assert_eq!(status["status"], "Ready");
                assert_eq!(status["readyNodes"], 3);
                assert_eq!(status["conditions"][0]["status"], "True");
                assert_eq!(
                    status["conditions"][0]["message"],
                    "3/3 nodes ready in 2 NVLink cliques"
                );
            })
            .echo(),
    ]);
    let stop = CancellationToken::new();
    let correcting = tokio::spawn(
        KubeStatusSink::new(client, cache.clone(), Duration::from_secs(10))
            .for_node("node-1", clique("c.1"))
            .keep_domain_fields(stop.clone()),
    );
    let mut server = script.await.unwrap();
    // The same rows again (here the cache never sees the correction land): corrected
    // once, not on every change, whatever the server kept.
    cache.changed();
    stop.cancel();
    correcting.await.unwrap();
    server.assert_idle();
}

#[test]
fn one_node_of_a_domain_spanning_cliques_corrects_it() {
    let status = |rows: Vec<Value>| {
        domaind_backends::contract::domain_from_status(
            cached_with(rows, "NotReady", 0, "")
                .status
                .as_ref()
                .unwrap(),
        )
    };
    // One clique: its reporter's document is the whole truth.
    assert_eq!(
        corrector(&status(vec![
            row("a", "c.1", "Ready"),
            row("b", "c.1", "Ready")
        ])),
        None
    );
    assert_eq!(corrector(&status(vec![])), None);
    // The ready row with the smallest name; the smallest of all when none is ready.
    let spanning = |a: &str| {
        status(vec![
            row("a", "c.1", a),
            row("c", "c.1", "Ready"),
            row("b", "c.2", "Ready"),
        ])
    };
    assert_eq!(corrector(&spanning("Ready")), Some("a"));
    assert_eq!(corrector(&spanning("NotReady")), Some("b"));
    assert_eq!(
        corrector(&status(vec![
            row("z", "c.1", "NotReady"),
            row("y", "c.2", "NotReady")
        ])),
        Some("y")
    );
}
