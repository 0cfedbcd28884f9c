use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

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
            isolation: Default::default(),
        },
        allocation_mode: AllocationMode::Single,
        readiness: Some(ReadinessPolicy::Domain),
        driver: None,
        device: None,
        admin_access: false,
    }
}

fn asked(uid: &str) -> ClaimRef {
    ClaimRef {
        uid: uid.into(),
        namespace: "team-a".into(),
        name: format!("claim-{uid}"),
    }
}

/// Runs `body` with a recorder of its own (on this thread only), and returns the
/// `domaind_local_bad_files_total` counters it left, by `(kind, reason)`.
fn with_bad_files<T>(body: impl FnOnce() -> T) -> (T, BTreeMap<(String, String), u64>) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let out = metrics::with_local_recorder(&recorder, body);
    let mut counts = BTreeMap::new();
    for (key, .., value) in snapshotter.snapshot().into_vec() {
        if key.key().name() != BAD_FILES {
            continue;
        }
        let label = |name: &str| {
            key.key()
                .labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
                .unwrap_or_default()
        };
        if let DebugValue::Counter(n) = value {
            *counts.entry((label("kind"), label("reason"))).or_default() += n;
        }
    }
    (out, counts)
}

/// [`with_bad_files`], summed over every kind and reason.
fn with_metrics<T>(body: impl FnOnce() -> T) -> (T, u64) {
    let (out, counts) = with_bad_files(body);
    (out, counts.values().sum())
}

/// `{(kind, reason): 1}`.
fn counted_once(kind: &str, reason: &str) -> BTreeMap<(String, String), u64> {
    BTreeMap::from([((kind.to_owned(), reason.to_owned()), 1)])
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

#[test]
fn an_admin_claim_file_may_name_another_namespaces_domain_and_gets_its_device() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = LocalDir::new(tmp.path());
    std::fs::create_dir_all(dir.claims_dir()).unwrap();
    std::fs::write(
        dir.claim_path("adm").unwrap(),
        r#"{"namespace": "monitoring", "name": "claim-adm", "uid": "adm",
            "computeDomain": {"namespace": "team-a", "name": "training", "uid": "cd-1"},
            "device": "channel-3", "adminAccess": true}"#,
    )
    .unwrap();
    let mut claim = asked("adm");
    claim.namespace = "monitoring".into();
    let info = resolve(&dir, &claim).unwrap();
    assert!(info.admin_access && !info.joins_domain());
    assert_eq!(info.domain.namespace, "team-a");
    assert_eq!(info.devices[0].device, "channel-3");

    let mut no_channel = claim_file("adm-gpu");
    no_channel.admin_access = true;
    no_channel.device = Some("gpu-0".into());
    dir.write_claim(&no_channel).unwrap();
    let (message, bad) = refused(&dir, &asked("adm-gpu"));
    assert!(message.contains("not a channel device"), "{message}");
    assert_eq!(bad, 1);
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
        channel: None,
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

/// A claim file whose content would be accepted, in a directory outside the backend.
fn outside_claim(uid: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("secret.json");
    std::fs::write(&target, serde_json::to_vec(&claim_file(uid)).unwrap()).unwrap();
    (outside, target)
}

#[test]
fn a_claim_file_linked_to_a_file_outside_the_directory_is_refused_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = LocalDir::new(tmp.path());
    std::fs::create_dir_all(dir.claims_dir()).unwrap();
    let (_outside, target) = outside_claim("linked");
    std::os::unix::fs::symlink(&target, dir.claim_path("linked").unwrap()).unwrap();

    let (result, counts) = with_bad_files(|| resolve(&dir, &asked("linked")));
    let Err(ClaimError::Permanent(message)) = result else {
        panic!("expected a permanent refusal, got {result:?}");
    };
    assert!(
        message.contains(&dir.claim_path("linked").unwrap().display().to_string())
            && message.contains("symbolic link"),
        "{message}"
    );
    assert_eq!(counts, counted_once("claim", "symlink"));

    // The stale-claim check does not take the link for the claim either: it proves
    // nothing, so the claim is kept, and the file counts.
    use crate::stale::ClaimExistence as _;
    let existence = LocalClaimExistence::new(dir.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (lookup, counts) = with_bad_files(|| rt.block_on(existence.claim(&asked("linked"))));
    assert!(
        matches!(&lookup, crate::stale::Lookup::Failed(m) if m.contains("symbolic link")),
        "{lookup:?}"
    );
    assert_eq!(counts, counted_once("claim", "symlink"));
}

#[test]
fn a_fifo_claim_file_is_refused_without_blocking() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = LocalDir::new(tmp.path());
    std::fs::create_dir_all(dir.claims_dir()).unwrap();
    let fifo = dir.claim_path("fifo").unwrap();
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();

    // On a thread of its own: a read that blocks on the FIFO (nobody ever writes it)
    // fails the test at the timeout instead of hanging it.
    let (answer, answered) = std::sync::mpsc::channel();
    let reading = dir.clone();
    std::thread::spawn(move || {
        let _ = answer.send(with_bad_files(|| resolve(&reading, &asked("fifo"))));
    });
    let (result, counts) = answered
        .recv_timeout(Duration::from_secs(10))
        .expect("resolving a FIFO claim file blocked");
    let Err(ClaimError::Permanent(message)) = result else {
        panic!("expected a permanent refusal, got {result:?}");
    };
    assert!(
        message.contains(&fifo.display().to_string())
            && message.contains("FIFO")
            && message.contains("not a regular file"),
        "{message}"
    );
    assert_eq!(counts, counted_once("claim", "not_regular_file"));

    std::fs::create_dir(dir.claim_path("dir").unwrap()).unwrap();
    let (message, _) = refused(&dir, &asked("dir"));
    assert!(message.contains("is a directory"), "{message}");
}

#[test]
fn a_claim_file_above_the_cap_is_refused_and_one_at_the_cap_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = LocalDir::new(tmp.path());
    std::fs::create_dir_all(dir.claims_dir()).unwrap();
    // Valid JSON either way: only the size decides.
    let padded = |uid: &str, size: u64| {
        let mut bytes = serde_json::to_vec(&claim_file(uid)).unwrap();
        bytes.resize(size as usize, b' ');
        std::fs::write(dir.claim_path(uid).unwrap(), bytes).unwrap();
    };
    padded("big", CLAIM_FILE_LIMIT + 1);
    padded("limit", CLAIM_FILE_LIMIT);

    let (result, counts) = with_bad_files(|| resolve(&dir, &asked("big")));
    let Err(ClaimError::Permanent(message)) = result else {
        panic!("expected a permanent refusal, got {result:?}");
    };
    assert!(
        message.contains("big.json") && message.contains("larger than 65536 bytes"),
        "{message}"
    );
    assert_eq!(counts, counted_once("claim", "too_large"));
    resolve(&dir, &asked("limit")).unwrap();
}

#[test]
fn status_and_event_files_are_never_followed_out_of_the_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = LocalDir::new(tmp.path());
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("passwd");
    std::fs::write(&target, b"root:x:0:0::/root:/bin/sh\n").unwrap();
    std::fs::create_dir_all(dir.status_dir()).unwrap();
    std::fs::create_dir_all(dir.events_dir()).unwrap();
    std::os::unix::fs::symlink(&target, dir.status_path("cd-1").unwrap()).unwrap();
    std::os::unix::fs::symlink(&target, dir.events_path("cd-1").unwrap()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sink = LocalStatusSink::new(dir.clone());

    let (read, counts) = with_bad_files(|| rt.block_on(sink.read(&domain())));
    assert!(
        read.as_ref().is_err_and(
            |e| e.is_permanent() && e.to_string().contains("cd-1.json is a symbolic link")
        ),
        "{read:?}"
    );
    assert_eq!(counts, counted_once("status", "symlink"));

    let events = LocalEventSink::new(dir.clone(), "node-1");
    let text = crate::events::EventText::of(&DomainEvent::NodeLost {
        node: "node-3".into(),
    });
    let (appended, counts) = with_bad_files(|| events.append_text(&domain(), text.clone()));
    assert!(
        appended
            .as_ref()
            .is_err_and(|e| e.to_string().contains("cd-1.jsonl is a symbolic link")),
        "{appended:?}"
    );
    assert_eq!(counts, counted_once("events", "symlink"));

    // The reporter's next write replaces the link itself with a regular file.
    rt.block_on(sink.write(&domain(), &document(Phase::Ready, 2)))
        .unwrap();
    assert!(
        std::fs::symlink_metadata(dir.status_path("cd-1").unwrap())
            .unwrap()
            .is_file()
    );
    assert_eq!(
        std::fs::read(&target).unwrap(),
        b"root:x:0:0::/root:/bin/sh\n",
        "the link's target is untouched"
    );

    // An event file that is a FIFO with no reader: refused at once, not waited on.
    std::fs::remove_file(dir.events_path("cd-1").unwrap()).unwrap();
    nix::unistd::mkfifo(
        &dir.events_path("cd-1").unwrap(),
        nix::sys::stat::Mode::S_IRWXU,
    )
    .unwrap();
    let (answer, answered) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = answer.send(with_bad_files(|| events.append_text(&domain(), text)));
    });
    let (appended, counts) = answered
        .recv_timeout(Duration::from_secs(10))
        .expect("appending to a FIFO event file blocked");
    assert!(
        appended
            .as_ref()
            .is_err_and(|e| e.to_string().contains("not a regular file")),
        "{appended:?}"
    );
    assert_eq!(counts, counted_once("events", "not_regular_file"));
}
