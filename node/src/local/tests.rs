use std::sync::Arc;

use domaind_actors::model::{
    AllocationMode, ClaimRef, DomainRef, DomainUid, Phase, ReadinessPolicy,
};
use domaind_actors::ports::{ClaimError, ClaimSource, DomainEvent, EventSink, StatusSink};
use domaind_actors::rules::status::{DomainStatus, NodeStatus};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

use super::*;
use crate::events::EventType;
use domaind_kube_api::crd::{self, ConditionStatus};

const DRIVER: &str = "compute-domain.nvidia.com";

fn claim_file(uid: &str) -> ClaimFile {
    ClaimFile {
        namespace: "team-a".into(),
        name: format!("claim-{uid}"),
        uid: uid.into(),
        compute_domain: ComputeDomainRef {
            namespace: "team-a".into(),
            name: "training".into(),
            uid: "cd-1".into(),
            num_nodes: 0,
        },
        allocation_mode: AllocationMode::Single,
        readiness: Some(ReadinessPolicy::Domain),
        driver: None,
        device: None,
    }
}

fn asked(uid: &str) -> ClaimRef {
    ClaimRef {
        uid: uid.into(),
        namespace: "team-a".into(),
        name: format!("claim-{uid}"),
    }
}

/// Runs `body` on a fresh runtime with a recorder of its own, and returns the sum of
/// the `domaind_local_bad_files_total` counters it left.
fn with_metrics<T>(body: impl FnOnce() -> T) -> (T, u64) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let out = metrics::with_local_recorder(&recorder, body);
    let bad = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == BAD_FILES)
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum();
    (out, bad)
}

fn resolve(dir: &LocalDir, claim: &ClaimRef) -> Result<ClaimInfo, ClaimError> {
    let source = LocalClaimSource::new(dir.clone(), "node-1", DRIVER);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(source.resolve(claim))
}

use domaind_actors::model::ClaimInfo;

#[test]
fn a_claim_file_resolves_to_its_domain_and_device() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = LocalDir::new(tmp.path());
    dir.write_claim(&claim_file("u1")).unwrap();
    let info = resolve(&dir, &asked("u1")).unwrap();
    assert_eq!(
        info.domain,
        DomainRef {
            uid: DomainUid("cd-1".into()),
            namespace: "team-a".into(),
            name: "training".into(),
            num_nodes: 0
        }
    );
    assert_eq!(info.readiness, Some(ReadinessPolicy::Domain));
    assert_eq!(info.devices.len(), 1);
    assert_eq!(
        (
            info.devices[0].pool.as_str(),
            info.devices[0].device.as_str()
        ),
        ("node-1", "channel-0")
    );
}

#[test]
fn the_documented_file_format_parses() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = LocalDir::new(tmp.path());
    std::fs::create_dir_all(dir.claims_dir()).unwrap();
    std::fs::write(
        dir.claim_path("u2").unwrap(),
        r#"{"namespace": "team-a", "name": "claim-u2", "uid": "u2",
            "computeDomain": {"namespace": "team-a", "name": "training", "uid": "cd-1"},
            "allocationMode": "All", "readiness": "Local"}"#,
    )
    .unwrap();
    let info = resolve(&dir, &asked("u2")).unwrap();
    assert_eq!(info.allocation_mode, AllocationMode::All);
    assert_eq!(info.readiness, Some(ReadinessPolicy::Local));
}

fn refused(dir: &LocalDir, claim: &ClaimRef) -> (String, u64) {
    let (result, bad) = with_metrics(|| resolve(dir, claim));
    match result {
        Err(ClaimError::Permanent(message)) => (message, bad),
        other => panic!("expected a permanent error, got {other:?}"),
    }
}

#[test]
fn bad_claims_are_refused_for_good_saying_why() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = LocalDir::new(tmp.path());

    let (message, bad) = refused(&dir, &asked("missing"));
    assert!(
        message.contains("unknown") && message.contains("missing.json"),
        "{message}"
    );
    assert_eq!(bad, 0, "an unknown claim is not a bad file");

    std::fs::create_dir_all(dir.claims_dir()).unwrap();
    std::fs::write(dir.claim_path("garbled").unwrap(), b"{\"namespace\": 3").unwrap();
    let (message, bad) = refused(&dir, &asked("garbled"));
    assert!(message.contains("garbled.json is not valid"), "{message}");
    assert_eq!(bad, 1);

    std::fs::write(
        dir.claim_path("mode").unwrap(),
        serde_json::to_string(&claim_file("mode"))
            .unwrap()
            .replace("Single", "Several"),
    )
    .unwrap();
    let (message, _) = refused(&dir, &asked("mode"));
    assert!(message.contains("unknown variant `Several`"), "{message}");

    let mut other_driver = claim_file("gpu");
    other_driver.driver = Some("gpu.nvidia.com".into());
    dir.write_claim(&other_driver).unwrap();
    let (message, bad) = refused(&dir, &asked("gpu"));
    assert!(
        message.contains("allocated by driver gpu.nvidia.com"),
        "{message}"
    );
    assert_eq!(bad, 1);

    let mut elsewhere = claim_file("ns");
    elsewhere.compute_domain.namespace = "team-b".into();
    dir.write_claim(&elsewhere).unwrap();
    let (message, _) = refused(&dir, &asked("ns"));
    assert!(
        message.contains("only join a ComputeDomain of its own namespace"),
        "{message}"
    );

    dir.write_claim(&claim_file("named")).unwrap();
    let mut renamed = asked("named");
    renamed.name = "other".into();
    let (message, _) = refused(&dir, &renamed);
    assert!(message.contains("must agree"), "{message}");

    let (message, bad) = refused(&dir, &asked("../escape"));
    assert!(message.contains("cannot name a file"), "{message}");
    assert_eq!(bad, 1);
}

fn document(phase: Phase, ready: u32) -> DomainStatus {
    DomainStatus {
        status: phase,
        ready_nodes: ready,
        total_nodes: 2,
        message: format!("{ready}/2 nodes ready"),
        nodes: vec![NodeStatus {
            name: "node-1".into(),
            ip_address: "127.0.0.1".into(),
            clique_id: "c.0".into(),
            index: Some(0),
            status: phase,
        }],
    }
}

fn domain() -> DomainRef {
    DomainRef {
        uid: DomainUid("cd-1".into()),
        namespace: "team-a".into(),
        name: "training".into(),
        num_nodes: 0,
    }
}

#[test]
fn the_status_file_holds_the_crd_status_and_survives_a_garbled_predecessor() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = LocalDir::new(tmp.path());
    let sink: Arc<dyn StatusSink> = Arc::new(LocalStatusSink::new(dir.clone()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert_eq!(dir.read_status("cd-1").unwrap(), None);
    assert_eq!(rt.block_on(sink.read(&domain())).unwrap(), None);
    rt.block_on(sink.write(&domain(), &document(Phase::NotReady, 1)))
        .unwrap();
    // What a reporter taking over reads back is the document as written.
    assert_eq!(
        rt.block_on(sink.read(&domain())).unwrap(),
        Some(document(Phase::NotReady, 1))
    );
    let first = dir.read_status("cd-1").unwrap().unwrap();
    assert_eq!(
        (first.status, first.ready_nodes, first.total_nodes),
        (crd::Phase::NotReady, 1, 2)
    );
    assert_eq!(first.nodes[0].index, Some(0));
    assert_eq!(first.conditions[0].status, ConditionStatus::False);

    std::fs::write(dir.status_path("cd-1").unwrap(), b"not json").unwrap();
    // A garbled file is not "nothing written": the read fails, and counts it.
    let (read, bad) = with_metrics(|| rt.block_on(sink.read(&domain())));
    assert!(read.is_err());
    assert_eq!(bad, 1);
    let (written, bad) =
        with_metrics(|| rt.block_on(sink.write(&domain(), &document(Phase::Ready, 2))));
    written.unwrap();
    assert_eq!(bad, 1);
    let second = dir.read_status("cd-1").unwrap().unwrap();
    assert_eq!(second.status, crd::Phase::Ready);
    assert_eq!(second.conditions[0].status, ConditionStatus::True);
}

#[test]
fn events_are_appended_one_per_line_by_every_node() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = LocalDir::new(tmp.path());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for node in ["node-1", "node-2"] {
        let sink = LocalEventSink::new(dir.clone(), node);
        rt.block_on(sink.emit(
            &domain(),
            DomainEvent::NodeLost {
                node: "node-3".into(),
            },
        ))
        .unwrap();
    }
    let events = dir.read_events("cd-1").unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].node, "node-1");
    assert_eq!(events[1].node, "node-2");
    assert!(
        events
            .iter()
            .all(|e| e.type_ == EventType::Warning && e.reason == "NodeLost")
    );
    assert_eq!(dir.read_events("cd-unknown").unwrap(), vec![]);
}
