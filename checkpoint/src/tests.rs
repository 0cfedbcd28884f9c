use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use domaind_actors::model::{
    AllocationMode, ClaimInfo, ClaimRef, DomainRef, DomainUid, ReadinessPolicy,
};
use domaind_actors::ports::{
    Checkpoint, CheckpointChange, CheckpointStore, ClaimRecord, DomainEvent, EventSink, PortError,
    PrepareState,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tempfile::TempDir;

use super::journal::aside_prefix;
use super::line;
use super::*;
use domaind_gossip::metrics::NEWER_VERSION;

const BOOT_A: &str = "6a1c7f0e-0a57-4b0e-9a0e-000000000001";
const BOOT_B: &str = "6a1c7f0e-0a57-4b0e-9a0e-000000000002";

pub(crate) fn record(uid: &str, state: PrepareState, mode: AllocationMode) -> ClaimRecord {
    ClaimRecord {
        claim: ClaimRef {
            uid: uid.into(),
            namespace: "team-a".into(),
            name: format!("claim-{uid}"),
        },
        info: ClaimInfo {
            domain: DomainRef {
                uid: DomainUid("cd-uid-1".into()),
                namespace: "team-a".into(),
                name: "training".into(),
                num_nodes: 4,
            },
            allocation_mode: mode,
            readiness: Some(ReadinessPolicy::Domain),
            devices: Vec::new(),
            isolation: Default::default(),
            admin_access: false,
        },
        policy: ReadinessPolicy::Domain,
        state,
        devices: vec![format!(
            "k8s.compute-domain.nvidia.com/claim={uid}-channel-0"
        )],
        channel: None,
    }
}

/// A state directory and a boot id file the test controls.
struct Node {
    root: TempDir,
}

impl Node {
    fn new() -> Self {
        Self {
            root: tempfile::tempdir().unwrap(),
        }
    }

    fn state_dir(&self) -> PathBuf {
        self.root.path().join("state")
    }

    fn journal_path(&self) -> PathBuf {
        self.state_dir().join(JOURNAL_FILE)
    }

    fn config(&self, boot_id: &str) -> CheckpointConfig {
        let boot_id_path = self.root.path().join("boot_id");
        fs::write(&boot_id_path, format!("{boot_id}\n")).unwrap();
        CheckpointConfig::new(self.state_dir()).with_boot_id_path(boot_id_path)
    }

    /// A store as the daemon opens it after booting with `boot_id`.
    fn store(&self, boot_id: &str) -> FileCheckpointStore {
        FileCheckpointStore::open(self.config(boot_id)).unwrap()
    }

    /// A store whose disk fails while `disk` says so.
    fn flaky_store(&self, boot_id: &str, disk: &FlakyDisk) -> FileCheckpointStore {
        let config = self.config(boot_id);
        fs::create_dir_all(self.state_dir()).unwrap();
        let journal = FlakyJournal {
            inner: DirJournal::new(self.state_dir()),
            disk: disk.clone(),
        };
        FileCheckpointStore::open_with(config, Box::new(journal)).unwrap()
    }

    fn files(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.state_dir())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    fn aside_copies(&self, of: &str) -> Vec<String> {
        let prefix = aside_prefix(of);
        self.files()
            .into_iter()
            .filter(|name| name.starts_with(&prefix))
            .collect()
    }
}

/// Ten claims and a slot, as changes.
fn sample_changes() -> Vec<CheckpointChange> {
    let mut changes: Vec<CheckpointChange> = (0..10)
        .map(|n| {
            CheckpointChange::Claim(record(
                &format!("uid-{n}"),
                PrepareState::PrepareCompleted,
                AllocationMode::Single,
            ))
        })
        .collect();
    changes.push(CheckpointChange::Slot {
        domain: DomainUid("cd-uid-1".into()),
        slot: 5,
    });
    changes
}

fn sample() -> Checkpoint {
    let mut checkpoint = Checkpoint::default();
    for change in sample_changes() {
        checkpoint.apply(change);
    }
    checkpoint
}

/// A store holding `sample()`, written and loaded back by a restarted one.
async fn written(node: &Node) -> FileCheckpointStore {
    let store = node.store(BOOT_A);
    store.load_with_outcome().await.unwrap();
    store.record_changes(sample_changes()).await.unwrap();
    store
}

/// What the thread's metrics recorder saw. A snapshot consumes what it reads (counters
/// and gauges go back to 0), so every read goes through here and adds up.
struct Seen {
    snapshotter: Snapshotter,
    counters: std::collections::BTreeMap<String, u64>,
    gauges: std::collections::BTreeMap<String, f64>,
}

impl Seen {
    fn new(snapshotter: Snapshotter) -> Self {
        Self {
            snapshotter,
            counters: Default::default(),
            gauges: Default::default(),
        }
    }

    fn take(&mut self) {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let name = key.key().name().to_owned();
            match value {
                DebugValue::Counter(n) => *self.counters.entry(name).or_default() += n,
                // Consumed to 0 when unchanged since the last read.
                DebugValue::Gauge(g)
                    if g.into_inner() != 0.0 || !self.gauges.contains_key(&name) =>
                {
                    self.gauges.insert(name, g.into_inner());
                }
                _ => {}
            }
        }
    }

    fn counter(&mut self, name: &str) -> u64 {
        self.take();
        self.counters.get(name).copied().unwrap_or(0)
    }

    /// The gauge's last value set since the last read, if any.
    fn gauge_set(&mut self, name: &str) -> Option<f64> {
        let before = self.gauges.remove(name);
        self.take();
        let now = self.gauges.get(name).copied();
        if now.is_none()
            && let Some(before) = before
        {
            self.gauges.insert(name.to_owned(), before);
        }
        now
    }
}

/// A disk that fails on cue: a full disk (ENOSPC) for every write while `full`.
#[derive(Debug, Clone, Default)]
struct FlakyDisk {
    full: Arc<AtomicBool>,
}

impl FlakyDisk {
    fn fill(&self) {
        self.full.store(true, Ordering::SeqCst);
    }
    fn free(&self) {
        self.full.store(false, Ordering::SeqCst);
    }
    fn check(&self) -> io::Result<()> {
        if self.full.load(Ordering::SeqCst) {
            Err(io::Error::from_raw_os_error(28))
        } else {
            Ok(())
        }
    }
}

#[derive(Debug)]
struct FlakyJournal {
    inner: DirJournal,
    disk: FlakyDisk,
}

impl Journal for FlakyJournal {
    fn path(&self) -> &Path {
        self.inner.path()
    }
    fn read(&mut self) -> io::Result<Option<Vec<u8>>> {
        self.inner.read()
    }
    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.disk.check().is_err() {
            // What a full disk does: part of the write lands.
            let _ = self.inner.append(&bytes[..bytes.len() / 2]);
        }
        self.disk.check()?;
        self.inner.append(bytes)
    }
    fn replace(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.disk.check()?;
        self.inner.replace(bytes)
    }
    fn set_aside(&mut self, of: &str, bytes: &[u8]) -> io::Result<PathBuf> {
        self.disk.check()?;
        self.inner.set_aside(of, bytes)
    }
    fn remove_stale_temps(&mut self) {
        self.inner.remove_stale_temps();
    }
}

#[derive(Debug, Default)]
struct Events(Mutex<Vec<(DomainRef, DomainEvent)>>);

#[async_trait::async_trait]
impl EventSink for Events {
    async fn emit(&self, domain: &DomainRef, event: DomainEvent) -> Result<(), PortError> {
        self.0.lock().unwrap().push((domain.clone(), event));
        Ok(())
    }
}

impl Events {
    fn reasons(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(domain, event)| {
                // The variant's name is the event's reason users read.
                let debug = format!("{event:?}");
                let variant = debug.split([' ', '{', '(']).next().unwrap_or_default();
                format!("{}:{variant}", domain.name)
            })
            .collect()
    }
}

#[tokio::test]
async fn recorded_changes_load_back_in_a_restarted_daemon() {
    let node = Node::new();
    written(&node).await;

    let loaded = node.store(BOOT_A).load_with_outcome().await.unwrap();

    assert_eq!(loaded.checkpoint, sample());
    assert_eq!(loaded.outcome, LoadOutcome::Restored { claims: 10 });
    assert_eq!(node.files(), [JOURNAL_FILE]);
}

#[tokio::test]
async fn it_serves_the_actors_port_in_call_order() {
    let node = Node::new();
    let store: Arc<dyn CheckpointStore> = Arc::new(node.store(BOOT_A));
    store.load().await.unwrap();
    // Taken in when called, whatever order the answers are awaited in.
    let put = store.record(vec![CheckpointChange::Claim(record(
        "uid-1",
        PrepareState::PrepareStarted,
        AllocationMode::Single,
    ))]);
    let gone = store.record(vec![CheckpointChange::ClaimGone("uid-1".into())]);
    let again = store.record(vec![CheckpointChange::Claim(record(
        "uid-2",
        PrepareState::PrepareStarted,
        AllocationMode::Single,
    ))]);
    again.await.unwrap();
    gone.await.unwrap();
    put.await.unwrap();
    let barrier = store.record(Vec::new());
    barrier.await.unwrap();

    let restarted = node.store(BOOT_A).load_with_outcome().await.unwrap();
    let uids: Vec<&String> = restarted.checkpoint.claims.keys().collect();
    assert_eq!(uids, ["uid-2"]);
}

#[tokio::test]
async fn records_made_while_a_write_is_under_way_share_the_next_write() {
    let node = Node::new();
    let store = node.store(BOOT_A);
    store.load_with_outcome().await.unwrap();

    let answers: Vec<_> = (0..100)
        .map(|n| {
            store.record_changes(vec![CheckpointChange::Claim(record(
                &format!("uid-{n}"),
                PrepareState::PrepareStarted,
                AllocationMode::Single,
            ))])
        })
        .collect();
    for answer in futures::future::join_all(answers).await {
        answer.unwrap();
    }

    let stats = store.stats().await;
    assert_eq!(stats.changes, 100);
    // Taken in before the writer first ran: one group, one append.
    assert_eq!(stats.appends, 1, "{stats:?}");
    let loaded = node.store(BOOT_A).load_with_outcome().await.unwrap();
    assert_eq!(loaded.checkpoint.claims.len(), 100);
}

#[tokio::test]
async fn a_write_covers_what_changed_and_the_journal_is_compacted_as_it_grows() {
    let node = Node::new();
    let store = written(&node).await;
    let one_record = fs::metadata(node.journal_path()).unwrap().len() / 11;

    // 3,000 updates of the same claim: the journal never holds them all.
    let mut largest = 0;
    for n in 0..3000u32 {
        let mut updated = record("uid-3", PrepareState::PrepareCompleted, AllocationMode::All);
        updated.devices = vec![format!("update-{n}")];
        store
            .record_changes(vec![CheckpointChange::Claim(updated)])
            .await
            .unwrap();
        largest = largest.max(fs::metadata(node.journal_path()).unwrap().len());
    }

    let stats = store.stats().await;
    assert!(stats.rewrites >= 2, "{stats:?}");
    assert!(
        largest < one_record * 1100,
        "the journal grew to {largest} bytes ({one_record} a record)"
    );
    let loaded = node.store(BOOT_A).load_with_outcome().await.unwrap();
    assert_eq!(loaded.checkpoint.claims["uid-3"].devices, ["update-2999"]);
    assert_eq!(loaded.checkpoint.claims.len(), 10);
}

#[tokio::test]
async fn the_journal_is_private_to_the_daemon() {
    use std::os::unix::fs::MetadataExt;
    let node = Node::new();
    written(&node).await;
    let mode = fs::metadata(node.journal_path()).unwrap().mode();
    assert_eq!(mode & 0o077, 0, "mode {mode:o}");
}

#[tokio::test]
async fn a_missing_journal_starts_empty() {
    let node = Node::new();
    let store = node.store(BOOT_A);
    assert_eq!(store.last_load_outcome(), None);

    let loaded = store.load_with_outcome().await.unwrap();

    assert_eq!(loaded.checkpoint, Checkpoint::default());
    assert_eq!(loaded.outcome, LoadOutcome::Missing);
    assert!(loaded.outcome.may_have_lost_claims());
    assert_eq!(store.last_load_outcome(), Some(LoadOutcome::Missing));
}

#[tokio::test]
async fn the_state_directory_is_created_if_missing_even_while_running() {
    let node = Node::new();
    assert!(!node.state_dir().exists());
    let store = node.store(BOOT_A);
    assert!(node.state_dir().is_dir());
    store.load_with_outcome().await.unwrap();

    fs::remove_dir_all(node.state_dir()).unwrap();
    store.record_changes(sample_changes()).await.unwrap();
    // The journal it held was removed with the directory: the writer notices and
    // writes what it holds again.
    store.record_changes(Vec::new()).await.unwrap();
    domaind_testkit::poll_until_true(
        "the journal to be written again",
        Duration::from_secs(10),
        async || node.journal_path().exists(),
    )
    .await;
    store.record_changes(Vec::new()).await.unwrap();
    assert_eq!(
        node.store(BOOT_A)
            .load_with_outcome()
            .await
            .unwrap()
            .checkpoint,
        sample()
    );
}

#[tokio::test]
async fn a_crash_mid_compaction_leaves_the_previous_journal() {
    let node = Node::new();
    written(&node).await;
    // What a crash between creating the temporary file and renaming it leaves.
    let half = node.state_dir().join(".checkpoint.journal.Xy12ab.tmp");
    fs::write(&half, b"0000").unwrap();

    let loaded = node.store(BOOT_A).load_with_outcome().await.unwrap();

    assert_eq!(loaded.checkpoint, sample());
    assert_eq!(node.files(), [JOURNAL_FILE]);
}

#[tokio::test]
async fn a_record_cut_short_by_a_crash_is_dropped_quietly() {
    let recorder = DebuggingRecorder::new();
    let mut seen = Seen::new(recorder.snapshotter());
    let _local = metrics::set_default_local_recorder(&recorder);
    let node = Node::new();
    written(&node).await;
    let whole = fs::read(node.journal_path()).unwrap();
    let mut cut = whole.clone();
    cut.extend_from_slice(b"1234abcd {\"v\":2,\"boot\":\"");
    fs::write(node.journal_path(), &cut).unwrap();

    let loaded = node.store(BOOT_A).load_with_outcome().await.unwrap();

    assert_eq!(loaded.checkpoint, sample());
    assert_eq!(loaded.outcome, LoadOutcome::Restored { claims: 10 });
    assert_eq!(seen.counter(CORRUPT_TOTAL), 0);
    // Cut off, so that the next append starts on a line of its own.
    assert_eq!(fs::read(node.journal_path()).unwrap(), whole);
}

/// Issue 15: one flipped byte loses one claim, not all. Every bit of every byte of one
/// record (its newline included) is flipped in turn.
#[test]
fn any_flipped_bit_costs_at_most_the_claim_it_hit() {
    let mut journal = Vec::new();
    for change in sample_changes() {
        journal.extend(line::encode(&line::Op::from(change), BOOT_A));
    }
    let starts: Vec<usize> = std::iter::once(0)
        .chain(
            journal
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b'\n')
                .map(|(i, _)| i + 1),
        )
        .collect();
    // uid-4's record: the fifth line.
    let (from, to) = (starts[4], starts[5]);
    let everything = sample();
    for index in from..to {
        for bit in 0..8 {
            let mut flipped = journal.clone();
            flipped[index] ^= 1 << bit;
            let replay = replay::replay(&flipped, BOOT_A);
            let mut others = replay.checkpoint.clone();
            let hit = others.claims.remove("uid-4");
            let mut expected = everything.clone();
            expected.claims.remove("uid-4");
            assert_eq!(
                others,
                expected,
                "flipping bit {bit} of byte {} of uid-4's record cost another claim",
                index - from
            );
            if let Some(hit) = hit {
                assert_eq!(
                    Some(&hit),
                    everything.claims.get("uid-4"),
                    "bit {bit} of byte {}: a changed record was believed",
                    index - from
                );
            }
        }
    }
}

#[tokio::test]
async fn a_damaged_record_is_set_aside_counted_told_and_the_rest_restored() {
    let recorder = DebuggingRecorder::new();
    let mut seen = Seen::new(recorder.snapshotter());
    let _local = metrics::set_default_local_recorder(&recorder);
    let node = Node::new();
    written(&node).await;
    let text = fs::read_to_string(node.journal_path()).unwrap();
    let at = text.find("claim-uid-7").unwrap();
    let mut bytes = text.clone().into_bytes();
    bytes[at] ^= 0x01;
    fs::write(node.journal_path(), &bytes).unwrap();

    let store = node.store(BOOT_A);
    let events = Arc::new(Events::default());
    store.report_events_to("node-1", events.clone());
    let loaded = store.load_with_outcome().await.unwrap();

    let mut expected = sample();
    expected.claims.remove("uid-7");
    assert_eq!(loaded.checkpoint, expected);
    let LoadOutcome::Damaged {
        claims: 9,
        damaged_records: 1,
        lost_claims,
        unattributed: 0,
        domains,
        moved_to: Some(moved_to),
        ..
    } = &loaded.outcome
    else {
        panic!("{:?}", loaded.outcome);
    };
    assert_eq!(lost_claims, &["uid-7"]);
    assert_eq!(domains[0].name, "training");
    assert!(loaded.outcome.needs_attention() && loaded.outcome.may_have_lost_claims());
    let kept = fs::read_to_string(moved_to).unwrap();
    assert!(kept.contains("claim/uid-7 "), "{kept}");
    assert_eq!(node.aside_copies(JOURNAL_FILE).len(), 1);
    assert_eq!(seen.counter(CORRUPT_TOTAL), 1);
    // The journal is clean again: a restart finds no damage.
    let again = node.store(BOOT_A).load_with_outcome().await.unwrap();
    assert_eq!(again.outcome, LoadOutcome::Restored { claims: 9 });
    // The domain heard of it, naming the node and the claim.
    tokio::task::yield_now().await;
    let told = events.0.lock().unwrap().clone();
    assert_eq!(told.len(), 1, "{told:?}");
    let DomainEvent::CheckpointDamaged {
        node,
        records: 1,
        lost_claims,
    } = &told[0].1
    else {
        panic!("{told:?}");
    };
    assert_eq!(
        (node.as_str(), lost_claims.as_slice()),
        ("node-1", &["uid-7".to_owned()][..])
    );
}

#[tokio::test]
async fn records_of_a_newer_revision_are_read_and_counted_not_refused() {
    let recorder = DebuggingRecorder::new();
    let mut seen = Seen::new(recorder.snapshotter());
    let _local = metrics::set_default_local_recorder(&recorder);
    let node = Node::new();
    written(&node).await;
    // A domaind of the next revision rewrote one claim's record.
    let text = fs::read(node.journal_path()).unwrap();
    let mut bytes = Vec::new();
    for line in text.split_inclusive(|b| *b == b'\n') {
        if String::from_utf8_lossy(line).contains(" claim/uid-3 ") {
            bytes.extend(line::next_revision(line));
        } else {
            bytes.extend_from_slice(line);
        }
    }
    assert_ne!(bytes, text);
    fs::write(node.journal_path(), &bytes).unwrap();

    let loaded = node.store(BOOT_A).load_with_outcome().await.unwrap();
    assert_eq!(loaded.checkpoint, sample());
    assert_eq!(loaded.outcome, LoadOutcome::Restored { claims: 10 });
    assert_eq!(seen.counter(NEWER_VERSION), 1);
    assert_eq!(seen.counter(CORRUPT_TOTAL), 0);
    // Read, not rewritten: the newer record stays as its writer left it.
    assert_eq!(fs::read(node.journal_path()).unwrap(), bytes);
}

#[tokio::test]
async fn only_the_newest_set_aside_copies_are_kept() {
    let node = Node::new();
    for round in 0..5 {
        written(&node).await;
        let mut bytes = fs::read(node.journal_path()).unwrap();
        bytes[3] ^= 0x01;
        fs::write(node.journal_path(), &bytes).unwrap();
        node.store(BOOT_A).load_with_outcome().await.unwrap();
        assert_eq!(node.aside_copies(JOURNAL_FILE).len(), (round + 1).min(3));
    }
}

fn write_newer(path: &Path) -> Vec<u8> {
    let key = "claim/new";
    let json = r#"{"v":3,"boot":"x","op":{"something":"new"}}"#;
    let rest = format!("{:08x} {key} {json}", crc32fast::hash(key.as_bytes()));
    let bytes = format!("{:08x} {rest}\n", crc32fast::hash(rest.as_bytes())).into_bytes();
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, &bytes).unwrap();
    bytes
}

fn assert_newer(message: &str, path: &Path) {
    for expected in [
        path.display().to_string(),
        "format version 3".into(),
        format!("up to {FORMAT_VERSION}"),
        "written by a newer domaind".into(),
        "upgrade domaind, or remove the file".into(),
    ] {
        assert!(
            message.contains(&expected),
            "{message:?} lacks {expected:?}"
        );
    }
}

#[tokio::test]
async fn a_newer_format_is_refused_and_never_overwritten() {
    let node = Node::new();
    let store = node.store(BOOT_A);
    let newer = write_newer(&node.journal_path());

    let error = store.load_with_outcome().await.unwrap_err();
    assert!(
        matches!(error, CheckpointError::NewerFormat { found: 3, .. }),
        "{error:?}"
    );
    assert_newer(&error.to_string(), &node.journal_path());
    assert_eq!(
        store.last_load_outcome(),
        Some(LoadOutcome::NewerFormat {
            found: 3,
            supported: FORMAT_VERSION
        })
    );
    assert!(matches!(
        *store.persistence().borrow(),
        Persistence::Refused { .. }
    ));
    let refused = store.record_changes(sample_changes()).await.unwrap_err();
    assert_newer(&refused.to_string(), &node.journal_path());
    // Only a newer domaind, or a person, can change that: no retry soon mends it.
    assert!(refused.is_permanent(), "{refused}");

    assert_eq!(fs::read(node.journal_path()).unwrap(), newer);
    assert!(node.aside_copies(JOURNAL_FILE).is_empty());
}

#[tokio::test]
async fn recording_resumes_once_the_newer_journal_is_removed() {
    let node = Node::new();
    let store = node.store(BOOT_A);
    write_newer(&node.journal_path());
    store.load_with_outcome().await.unwrap_err();
    store.record_changes(sample_changes()).await.unwrap_err();

    fs::remove_file(node.journal_path()).unwrap();

    // What was refused was still taken in: it is written with the next record.
    store.record_changes(Vec::new()).await.unwrap();
    assert_eq!(*store.persistence().borrow(), Persistence::Persisted);
    assert_eq!(
        node.store(BOOT_A)
            .load_with_outcome()
            .await
            .unwrap()
            .checkpoint,
        sample()
    );
}

#[tokio::test]
async fn a_reboot_starts_empty_and_forgets_the_old_journal() {
    let node = Node::new();
    written(&node).await;

    let after_reboot = node.store(BOOT_B);
    let loaded = after_reboot.load_with_outcome().await.unwrap();

    assert_eq!(loaded.checkpoint, Checkpoint::default());
    assert_eq!(
        loaded.outcome,
        LoadOutcome::PreviousBoot {
            written_on_boot: BOOT_A.into()
        }
    );
    assert!(!loaded.outcome.needs_attention());
    assert_eq!(fs::read(node.journal_path()).unwrap(), b"");

    // What it records from now on is of the new boot.
    after_reboot.record_changes(sample_changes()).await.unwrap();
    let restarted = node.store(BOOT_B).load_with_outcome().await.unwrap();
    assert_eq!(restarted.checkpoint, sample());
}

#[tokio::test]
async fn an_unreadable_journal_is_an_error_not_damage() {
    let node = Node::new();
    let store = node.store(BOOT_A);
    fs::create_dir_all(node.journal_path()).unwrap();

    let error = store.load_with_outcome().await.unwrap_err();

    assert!(matches!(error, CheckpointError::Read { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .contains(&node.journal_path().display().to_string())
    );
    assert!(node.journal_path().is_dir(), "it was moved");
}

/// Issue 15: a full state directory is not fatal. Changes are answered from memory,
/// the store says so (persistence, metrics, an event on each domain), retries with a
/// backoff, and writes everything once the disk takes it.
#[tokio::test(start_paused = true)]
async fn a_full_disk_is_served_from_memory_reported_and_caught_up() {
    let recorder = DebuggingRecorder::new();
    let mut seen = Seen::new(recorder.snapshotter());
    let _local = metrics::set_default_local_recorder(&recorder);
    let node = Node::new();
    let disk = FlakyDisk::default();
    let store = node.flaky_store(BOOT_A, &disk);
    let events = Arc::new(Events::default());
    store.report_events_to("node-1", events.clone());
    store.load_with_outcome().await.unwrap();
    store
        .record_changes(sample_changes()[..5].to_vec())
        .await
        .unwrap();
    let mut persistence = store.persistence();
    assert_eq!(*persistence.borrow_and_update(), Persistence::Persisted);

    disk.fill();
    // Answered although not written.
    store
        .record_changes(sample_changes()[5..].to_vec())
        .await
        .unwrap();
    let Persistence::NotPersisted { error, domains } = persistence.borrow_and_update().clone()
    else {
        panic!("{:?}", *persistence.borrow());
    };
    assert!(error.contains("No space left on device"), "{error}");
    assert_eq!(domains[0].name, "training");
    assert_eq!(seen.gauge_set(PERSISTED), Some(0.0));
    // More changes while full are answered at once, without touching the disk.
    let failures_before = store.stats().await.failures;
    store
        .record_changes(vec![CheckpointChange::ClaimGone("uid-0".into())])
        .await
        .unwrap();
    assert_eq!(store.stats().await.failures, failures_before);

    // Retries back off while the disk stays full.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let failures = store.stats().await.failures;
    assert!(
        (3..=8).contains(&failures),
        "{failures} writes in 10 s: the retries do not back off"
    );
    assert_eq!(seen.counter(WRITE_FAILURES), failures);

    disk.free();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(*persistence.borrow_and_update(), Persistence::Persisted);
    assert_eq!(seen.gauge_set(PERSISTED), Some(1.0));
    let mut expected = sample();
    expected.claims.remove("uid-0");
    let restarted = node.store(BOOT_A).load_with_outcome().await.unwrap();
    assert_eq!(restarted.checkpoint, expected);
    assert_eq!(restarted.outcome, LoadOutcome::Restored { claims: 9 });

    tokio::task::yield_now().await;
    assert_eq!(
        events.reasons(),
        ["training:StateNotPersisted", "training:StatePersisted"]
    );
}

#[tokio::test]
async fn a_store_on_a_full_disk_still_loads_what_it_holds() {
    let node = Node::new();
    written(&node).await;
    let disk = FlakyDisk::default();
    disk.fill();
    let store = node.flaky_store(BOOT_A, &disk);

    let loaded = store.load_with_outcome().await.unwrap();

    assert_eq!(loaded.checkpoint, sample());
    assert_eq!(*store.persistence().borrow(), Persistence::Persisted);
    store
        .record_changes(vec![CheckpointChange::ClaimGone("uid-1".into())])
        .await
        .unwrap();
    assert!(matches!(
        *store.persistence().borrow(),
        Persistence::NotPersisted { .. }
    ));
}

#[test]
fn the_boot_id_must_be_readable_and_plain() {
    let root = tempfile::tempdir().unwrap();
    let boot_id_path = root.path().join("boot_id");
    let open = || {
        FileCheckpointStore::open(
            CheckpointConfig::new(root.path().join("state")).with_boot_id_path(&boot_id_path),
        )
    };

    let error = open().unwrap_err();
    assert!(
        matches!(error, CheckpointError::BootIdUnreadable { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("boot_id"), "{error}");

    for bad in ["", "\n", "two words\n"] {
        fs::write(&boot_id_path, bad).unwrap();
        let error = open().unwrap_err();
        assert!(
            matches!(error, CheckpointError::BootIdInvalid { .. }),
            "{bad:?}: {error:?}"
        );
    }

    fs::write(&boot_id_path, format!("{BOOT_A}\n")).unwrap();
    assert_eq!(open().unwrap().boot_id(), BOOT_A);
}

#[test]
fn the_default_boot_id_is_the_kernels() {
    let config = CheckpointConfig::new("/state");
    assert_eq!(config.boot_id_path, Path::new(DEFAULT_BOOT_ID_PATH));
    if Path::new(DEFAULT_BOOT_ID_PATH).exists() {
        let root = tempfile::tempdir().unwrap();
        let store = FileCheckpointStore::open(CheckpointConfig::new(root.path())).unwrap();
        assert_eq!(store.boot_id().len(), 36, "{}", store.boot_id());
    }
}
