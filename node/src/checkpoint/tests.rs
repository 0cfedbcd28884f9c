use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use domaind_actors::model::{
    AllocationMode, ClaimInfo, ClaimRef, DomainRef, DomainUid, ReadinessPolicy,
};
use domaind_actors::ports::{Checkpoint, CheckpointStore, ClaimRecord, PrepareState};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tempfile::TempDir;

use super::envelope;
use super::*;

const BOOT_A: &str = "6a1c7f0e-0a57-4b0e-9a0e-000000000001";
const BOOT_B: &str = "6a1c7f0e-0a57-4b0e-9a0e-000000000002";

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

    fn checkpoint_path(&self) -> PathBuf {
        self.state_dir().join(CHECKPOINT_FILE)
    }

    /// A store as the daemon opens it after booting with `boot_id`.
    fn store(&self, boot_id: &str) -> FileCheckpointStore {
        let boot_id_path = self.root.path().join("boot_id");
        fs::write(&boot_id_path, format!("{boot_id}\n")).unwrap();
        FileCheckpointStore::open(
            CheckpointConfig::new(self.state_dir()).with_boot_id_path(boot_id_path),
        )
        .unwrap()
    }

    fn files(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.state_dir())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }
}

fn record(uid: &str, state: PrepareState, mode: AllocationMode) -> ClaimRecord {
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
        },
        policy: ReadinessPolicy::Domain,
        state,
        devices: vec![format!(
            "k8s.compute-domain.nvidia.com/claim={uid}-channel-0"
        )],
    }
}

fn sample() -> Checkpoint {
    let mut checkpoint = Checkpoint::default();
    for record in [
        record(
            "uid-1",
            PrepareState::PrepareStarted,
            AllocationMode::Single,
        ),
        record("uid-2", PrepareState::PrepareCompleted, AllocationMode::All),
    ] {
        checkpoint.claims.insert(record.claim.uid.clone(), record);
    }
    checkpoint.slots.insert(DomainUid("cd-uid-1".into()), 5);
    checkpoint
}

fn corrupt_total(snapshotter: &Snapshotter) -> u64 {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == CORRUPT_TOTAL)
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            other => panic!("{CORRUPT_TOTAL} is not a counter: {other:?}"),
        })
        .sum()
}

fn corrupt_copies(node: &Node) -> Vec<String> {
    node.files()
        .into_iter()
        .filter(|name| name.starts_with("checkpoint.json.corrupt-"))
        .collect()
}

#[tokio::test]
async fn a_saved_checkpoint_loads_back() {
    let node = Node::new();
    let store = node.store(BOOT_A);
    store.save_checkpoint(&sample()).await.unwrap();

    let loaded = node.store(BOOT_A).load_with_outcome().await.unwrap();

    assert_eq!(loaded.checkpoint, sample());
    assert_eq!(loaded.outcome, LoadOutcome::Restored { claims: 2 });
    assert_eq!(node.files(), [CHECKPOINT_FILE]);
}

#[tokio::test]
async fn it_serves_the_actors_port() {
    let node = Node::new();
    let store: Arc<dyn CheckpointStore> = Arc::new(node.store(BOOT_A));
    store.save(&sample()).await.unwrap();
    let mut changed = store.load().await.unwrap();
    changed.claims.remove("uid-1");
    store.save(&changed).await.unwrap();

    assert_eq!(store.load().await.unwrap(), changed);
}

#[tokio::test]
async fn the_file_is_private_to_the_daemon() {
    use std::os::unix::fs::MetadataExt;
    let node = Node::new();
    node.store(BOOT_A).save_checkpoint(&sample()).await.unwrap();
    let mode = fs::metadata(node.checkpoint_path()).unwrap().mode();
    assert_eq!(mode & 0o077, 0, "mode {mode:o}");
}

#[tokio::test]
async fn a_missing_file_starts_empty() {
    let node = Node::new();
    let store = node.store(BOOT_A);
    assert_eq!(store.last_load_outcome(), None);

    let loaded = store.load_with_outcome().await.unwrap();

    assert_eq!(loaded.checkpoint, Checkpoint::default());
    assert_eq!(loaded.outcome, LoadOutcome::Missing);
    assert_eq!(store.last_load_outcome(), Some(LoadOutcome::Missing));
}

#[tokio::test]
async fn the_state_directory_is_created_if_missing() {
    let node = Node::new();
    assert!(!node.state_dir().exists());

    let store = node.store(BOOT_A);
    assert!(node.state_dir().is_dir());

    // And again if it disappears while the daemon runs.
    fs::remove_dir_all(node.state_dir()).unwrap();
    store.save_checkpoint(&sample()).await.unwrap();
    assert_eq!(
        store.load_with_outcome().await.unwrap().checkpoint,
        sample()
    );
}

#[tokio::test]
async fn a_crash_mid_write_leaves_the_previous_checkpoint() {
    let node = Node::new();
    let store = node.store(BOOT_A);
    store.save_checkpoint(&sample()).await.unwrap();
    // What a crash between creating the temporary file and renaming it leaves: half
    // of the next checkpoint, and an empty one from a crash right after creation.
    let next = envelope::encode(&Checkpoint::default(), BOOT_A).unwrap();
    let half = node.state_dir().join(".checkpoint.json.Xy12ab.tmp");
    let empty = node.state_dir().join(".checkpoint.json.Zz98cd.tmp");
    fs::write(&half, &next[..next.len() / 2]).unwrap();
    fs::write(&empty, b"").unwrap();

    let loaded = node.store(BOOT_A).load_with_outcome().await.unwrap();

    assert_eq!(loaded.checkpoint, sample());
    assert_eq!(loaded.outcome, LoadOutcome::Restored { claims: 2 });
    assert_eq!(node.files(), [CHECKPOINT_FILE]);
}

#[tokio::test]
async fn a_crash_during_the_first_write_starts_empty() {
    let node = Node::new();
    let store = node.store(BOOT_A);
    let first = envelope::encode(&sample(), BOOT_A).unwrap();
    fs::write(
        node.state_dir().join(".checkpoint.json.Ab34cd.tmp"),
        &first[..10],
    )
    .unwrap();

    let loaded = store.load_with_outcome().await.unwrap();

    assert_eq!(loaded.outcome, LoadOutcome::Missing);
    assert!(node.files().is_empty(), "left {:?}", node.files());
}

/// Turns a good checkpoint file into a damaged one.
type Damage = Box<dyn Fn(Vec<u8>) -> Vec<u8>>;

/// Each kind of damage, on a file that held `sample()`.
fn damages() -> Vec<(&'static str, Damage)> {
    vec![
        ("not JSON", Box::new(|_| b"\x00\x01garbage{".to_vec())),
        (
            "truncated",
            Box::new(|bytes: Vec<u8>| bytes[..bytes.len() * 2 / 3].to_vec()),
        ),
        (
            "payload changed",
            Box::new(|bytes: Vec<u8>| {
                String::from_utf8(bytes)
                    .unwrap()
                    .replace("\"cd-uid-1\":5", "\"cd-uid-1\":6")
                    .into_bytes()
            }),
        ),
        (
            "checksum changed",
            Box::new(|bytes: Vec<u8>| {
                let text = String::from_utf8(bytes).unwrap();
                let at = text.find("crc32:").unwrap() + "crc32:".len();
                let flipped = if &text[at..=at] == "0" { "1" } else { "0" };
                format!("{}{flipped}{}", &text[..at], &text[at + 1..]).into_bytes()
            }),
        ),
        ("empty", Box::new(|_| Vec::new())),
    ]
}

#[test]
fn a_corrupt_file_is_moved_aside_counted_and_loads_empty() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (damage, apply) in damages() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let node = Node::new();
        let store = node.store(BOOT_A);
        runtime.block_on(store.save_checkpoint(&sample())).unwrap();
        let good = fs::read(node.checkpoint_path()).unwrap();
        let bad = apply(good.clone());
        assert_ne!(bad, good, "{damage}: the damage changed nothing");
        fs::write(node.checkpoint_path(), &bad).unwrap();

        let loaded = runtime.block_on(store.load_with_outcome()).unwrap();

        assert_eq!(loaded.checkpoint, Checkpoint::default(), "{damage}");
        let LoadOutcome::Corrupt { reason, moved_to } = &loaded.outcome else {
            panic!("{damage}: {:?}", loaded.outcome);
        };
        assert!(!reason.is_empty());
        let moved_to = moved_to.as_ref().expect("moved aside");
        assert_eq!(fs::read(moved_to).unwrap(), bad, "{damage}: the copy kept");
        assert_eq!(corrupt_copies(&node).len(), 1, "{damage}");
        assert!(!node.checkpoint_path().exists(), "{damage}");
        assert_eq!(corrupt_total(&snapshotter), 1, "{damage}");
        assert!(loaded.outcome.needs_attention());

        // The daemon goes on: it saves and loads again.
        runtime.block_on(store.save_checkpoint(&sample())).unwrap();
        let again = runtime.block_on(store.load_with_outcome()).unwrap();
        assert_eq!(again.checkpoint, sample(), "{damage}");
        assert_eq!(corrupt_total(&snapshotter), 0, "{damage}: counted twice");
        assert_eq!(
            store.last_load_outcome(),
            Some(LoadOutcome::Restored { claims: 2 })
        );
    }
}

#[tokio::test]
async fn only_the_newest_corrupt_copies_are_kept() {
    let node = Node::new();
    let store = node.store(BOOT_A);
    let old = [
        "checkpoint.json.corrupt-1000",
        "checkpoint.json.corrupt-2000",
        "checkpoint.json.corrupt-2000-1",
    ];
    for name in old {
        fs::write(node.state_dir().join(name), b"x").unwrap();
    }
    fs::write(node.state_dir().join("checkpoint.json.corrupt-notes"), b"").unwrap();
    fs::write(node.checkpoint_path(), b"{").unwrap();

    let loaded = store.load_with_outcome().await.unwrap();

    let LoadOutcome::Corrupt {
        moved_to: Some(newest),
        ..
    } = loaded.outcome
    else {
        panic!("{:?}", loaded.outcome);
    };
    let newest = newest.file_name().unwrap().to_str().unwrap().to_owned();
    let mut expected = vec![
        "checkpoint.json.corrupt-2000".to_owned(),
        "checkpoint.json.corrupt-2000-1".to_owned(),
        newest,
        // Not a copy of ours: left alone.
        "checkpoint.json.corrupt-notes".to_owned(),
    ];
    expected.sort();
    assert_eq!(corrupt_copies(&node), expected);
}

fn write_newer(path: &Path) -> Vec<u8> {
    let bytes = br#"{"format":2,"boot_id":"x","payload":{"claims":{"new":{}}}}"#.to_vec();
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, &bytes).unwrap();
    bytes
}

fn assert_newer(error: CheckpointError, path: &Path) {
    let CheckpointError::NewerFormat {
        path: named,
        found: 2,
        supported: FORMAT_VERSION,
    } = &error
    else {
        panic!("{error:?}");
    };
    assert_eq!(named, path);
    let message = error.to_string();
    for expected in [
        path.display().to_string(),
        "format version 2".into(),
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
    let newer = write_newer(&node.checkpoint_path());

    assert_newer(
        store.load_with_outcome().await.unwrap_err(),
        &node.checkpoint_path(),
    );
    assert_eq!(
        store.last_load_outcome(),
        Some(LoadOutcome::NewerFormat {
            found: 2,
            supported: FORMAT_VERSION
        })
    );
    assert_newer(
        store.save_checkpoint(&sample()).await.unwrap_err(),
        &node.checkpoint_path(),
    );
    let port_error = CheckpointStore::save(&store, &sample()).await.unwrap_err();
    assert!(port_error.0.contains("newer domaind"), "{port_error}");

    assert_eq!(fs::read(node.checkpoint_path()).unwrap(), newer);
    assert!(corrupt_copies(&node).is_empty());
}

#[tokio::test]
async fn a_newer_format_is_not_overwritten_even_before_a_load() {
    let node = Node::new();
    let store = node.store(BOOT_A);
    let newer = write_newer(&node.checkpoint_path());

    assert_newer(
        store.save_checkpoint(&sample()).await.unwrap_err(),
        &node.checkpoint_path(),
    );
    assert_eq!(fs::read(node.checkpoint_path()).unwrap(), newer);
}

#[tokio::test]
async fn saving_resumes_once_the_newer_file_is_removed() {
    let node = Node::new();
    let store = node.store(BOOT_A);
    write_newer(&node.checkpoint_path());
    store.load_with_outcome().await.unwrap_err();

    fs::remove_file(node.checkpoint_path()).unwrap();

    store.save_checkpoint(&sample()).await.unwrap();
    assert_eq!(
        store.load_with_outcome().await.unwrap().checkpoint,
        sample()
    );
}

#[tokio::test]
async fn a_reboot_starts_empty_and_forgets_the_old_file() {
    let node = Node::new();
    node.store(BOOT_A).save_checkpoint(&sample()).await.unwrap();

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
    assert!(node.files().is_empty(), "left {:?}", node.files());
    assert_eq!(
        after_reboot.load_with_outcome().await.unwrap().outcome,
        LoadOutcome::Missing
    );

    // What it saves from now on is of the new boot.
    after_reboot.save_checkpoint(&sample()).await.unwrap();
    let restarted = node.store(BOOT_B).load_with_outcome().await.unwrap();
    assert_eq!(restarted.checkpoint, sample());
}

#[tokio::test]
async fn an_unreadable_file_is_an_error_not_corruption() {
    let node = Node::new();
    let store = node.store(BOOT_A);
    fs::create_dir_all(node.checkpoint_path()).unwrap();

    let error = store.load_with_outcome().await.unwrap_err();

    assert!(matches!(error, CheckpointError::Read { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .contains(&node.checkpoint_path().display().to_string())
    );
    assert!(node.checkpoint_path().is_dir(), "it was moved");
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
    // Only where there is a kernel boot id to read (not on every developer machine).
    if Path::new(DEFAULT_BOOT_ID_PATH).exists() {
        let root = tempfile::tempdir().unwrap();
        let store = FileCheckpointStore::open(CheckpointConfig::new(root.path())).unwrap();
        assert_eq!(store.boot_id().len(), 36, "{}", store.boot_id());
    }
}
