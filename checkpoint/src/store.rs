use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use domaind_actors::model::DomainRef;
use domaind_actors::ports::{
    Checkpoint, CheckpointChange, CheckpointStore, DomainEvent, EventSink, PortError, Recorded,
};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, error, info, warn};

use super::journal::{DirJournal, Journal};
use super::outcome::{LoadOutcome, Loaded};
use super::writer::{Persistence, Request, Writer, WriterStats};
use super::{CORRUPT_TOTAL, CheckpointError};

/// Where Linux keeps the id of the current boot.
pub const DEFAULT_BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

const DIR_MODE: u32 = 0o755;

/// Where the checkpoint lives and how to learn the boot id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// Created if missing (if it cannot be, the store starts not persisted).
    pub state_dir: PathBuf,
    pub boot_id_path: PathBuf,
}

impl CheckpointConfig {
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        Self {
            state_dir: state_dir.into(),
            boot_id_path: PathBuf::from(DEFAULT_BOOT_ID_PATH),
        }
    }

    #[must_use]
    pub fn with_boot_id_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.boot_id_path = path.into();
        self
    }
}

/// The actors' checkpoint as a journal of per-record-checksummed changes, committed in
/// groups by one writer task, compacted as it grows, reset when the node reboots, and
/// kept in memory when the disk refuses it. See the module documentation.
#[derive(Debug, Clone)]
pub struct FileCheckpointStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    boot_id: String,
    requests: mpsc::UnboundedSender<Request>,
    /// The writer until its first use: it is spawned then, on the caller's runtime.
    idle: Mutex<Option<(Writer, mpsc::UnboundedReceiver<Request>)>>,
    persistence: watch::Receiver<Persistence>,
    last: Mutex<Option<LoadOutcome>>,
    events: Mutex<Option<EventTarget>>,
}

/// Where the store tells users what happened to a node's state.
#[derive(Clone)]
struct EventTarget {
    node: String,
    sink: Arc<dyn EventSink>,
}

impl std::fmt::Debug for EventTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventTarget")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

impl FileCheckpointStore {
    /// Reads the boot id and creates the state directory. A directory that cannot be
    /// created is not an error here: the store starts, holds what it is given in
    /// memory, and says it is not persisted until the directory takes a write.
    pub fn open(config: CheckpointConfig) -> Result<Self, CheckpointError> {
        if let Err(source) = fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(&config.state_dir)
        {
            warn!(
                dir = %config.state_dir.display(),
                error = %source,
                "cannot create the state directory; prepared claims are kept in memory until it can be written"
            );
        }
        let journal = DirJournal::new(&config.state_dir);
        Self::open_with(config, Box::new(journal))
    }

    /// A store over `journal`: tests give one that fails on cue.
    pub fn open_with(
        config: CheckpointConfig,
        journal: Box<dyn Journal>,
    ) -> Result<Self, CheckpointError> {
        let boot_id = read_boot_id(&config.boot_id_path)?;
        let path = journal.path().to_owned();
        let (health, persistence) = watch::channel(Persistence::Persisted);
        let (requests, received) = mpsc::unbounded_channel();
        let writer = Writer::new(journal, boot_id.clone(), health);
        Ok(Self {
            inner: Arc::new(Inner {
                path,
                boot_id,
                requests,
                idle: Mutex::new(Some((writer, received))),
                persistence,
                last: Mutex::default(),
                events: Mutex::default(),
            }),
        })
    }

    /// The journal's path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    pub fn boot_id(&self) -> &str {
        &self.inner.boot_id
    }

    /// Whether what the node holds is on disk, as it changes.
    pub fn persistence(&self) -> watch::Receiver<Persistence> {
        self.inner.persistence.clone()
    }

    /// Tells `sink` (as node `node`) of damage found at load and of the state directory
    /// refusing writes and taking them again, as events on the domains concerned.
    /// Spawns the task that follows the latter; call it inside the runtime.
    pub fn report_events_to(&self, node: impl Into<String>, sink: Arc<dyn EventSink>) {
        let target = EventTarget {
            node: node.into(),
            sink,
        };
        *lock(&self.inner.events) = Some(target.clone());
        tokio::spawn(follow_persistence(self.persistence(), target));
    }

    /// Loads the checkpoint and says what was found. Never fails for damaged records
    /// or a previous boot's journal (the first are set aside, the second starts empty),
    /// nor for a directory that cannot be written; fails for an unreadable journal and
    /// for one written by a newer domaind.
    pub async fn load_with_outcome(&self) -> Result<Loaded, CheckpointError> {
        let (reply, answer) = oneshot::channel();
        self.send(Request::Load(reply));
        let result = answer.await.unwrap_or_else(|_| {
            Err(CheckpointError::WriterGone {
                path: self.inner.path.clone(),
            })
        });
        // Here, not in the writer: a metrics recorder may be thread-local.
        self.report(&result);
        let outcome = match &result {
            Ok(loaded) => Some(loaded.outcome.clone()),
            Err(CheckpointError::NewerFormat {
                found, supported, ..
            }) => Some(LoadOutcome::NewerFormat {
                found: *found,
                supported: *supported,
            }),
            Err(_) => None,
        };
        if let Some(outcome) = outcome {
            *lock(&self.inner.last) = Some(outcome);
        }
        result
    }

    /// Records `changes` (see [`CheckpointStore::record`]).
    pub fn record_changes(&self, changes: Vec<CheckpointChange>) -> Recorded {
        let (done, answer) = oneshot::channel();
        self.send(Request::Record { changes, done });
        let path = self.inner.path.clone();
        Box::pin(async move {
            answer
                .await
                .unwrap_or_else(|_| Err(CheckpointError::WriterGone { path }.into()))
        })
    }

    /// What the writer has done so far (after everything recorded before this call).
    pub async fn stats(&self) -> WriterStats {
        let (reply, answer) = oneshot::channel();
        self.send(Request::Stats(reply));
        answer.await.unwrap_or_default()
    }

    /// What the most recent load found; none before the first.
    pub fn last_load_outcome(&self) -> Option<LoadOutcome> {
        lock(&self.inner.last).clone()
    }

    fn send(&self, request: Request) {
        if let Some((writer, received)) = lock(&self.inner.idle).take() {
            tokio::spawn(writer.run(received));
        }
        // A send fails only once the writer has stopped, which the caller's answer
        // channel then reports.
        let _ = self.inner.requests.send(request);
    }

    fn report(&self, result: &Result<Loaded, CheckpointError>) {
        let path = self.inner.path.display();
        match result {
            Ok(Loaded { outcome, .. }) => match outcome {
                LoadOutcome::Missing => {
                    info!(%path, "no checkpoint; starting with no prepared claims")
                }
                LoadOutcome::Restored { claims } => debug!(%path, claims, "checkpoint loaded"),
                LoadOutcome::PreviousBoot { written_on_boot } => info!(
                    %path,
                    written_on_boot = %written_on_boot,
                    boot_id = %self.inner.boot_id,
                    "checkpoint is from before the node rebooted; prepared claims do not survive a reboot, starting empty"
                ),
                LoadOutcome::Damaged {
                    claims,
                    damaged_records,
                    lost_claims,
                    unattributed,
                    details,
                    domains,
                    moved_to,
                } => {
                    metrics::counter!(CORRUPT_TOTAL).increment(*damaged_records as u64);
                    let moved_to = moved_to.as_ref().map_or_else(
                        || "nowhere (keeping a copy failed)".to_owned(),
                        |to| to.display().to_string(),
                    );
                    error!(
                        %path,
                        restored = claims,
                        damaged_records,
                        ?lost_claims,
                        unattributed,
                        ?details,
                        %moved_to,
                        "damaged checkpoint records set aside; the rest was restored"
                    );
                    self.tell(domains, |node| DomainEvent::CheckpointDamaged {
                        node,
                        records: *damaged_records,
                        lost_claims: lost_claims.clone(),
                    });
                }
                // A load that finds a newer format fails: logged below.
                LoadOutcome::NewerFormat { .. } => {}
            },
            Err(error) => error!(%error, "checkpoint not loaded"),
        }
    }

    /// Emits `event` on each of `domains`, in the background, as the node set by
    /// [`Self::report_events_to`] (`event` is given that node's name).
    fn tell(&self, domains: &[DomainRef], event: impl FnOnce(String) -> DomainEvent) {
        let Some(target) = lock(&self.inner.events).clone() else {
            return;
        };
        emit_all(&target, domains, event(target.node.clone()));
    }
}

/// Tells the domains when the state directory stops and starts taking writes again.
async fn follow_persistence(mut persistence: watch::Receiver<Persistence>, target: EventTarget) {
    let mut told: Option<Vec<DomainRef>> = None;
    loop {
        let now = persistence.borrow_and_update().clone();
        match (now, &told) {
            (Persistence::NotPersisted { error, domains }, None) => {
                emit_all(
                    &target,
                    &domains,
                    DomainEvent::StateNotPersisted {
                        node: target.node.clone(),
                        error,
                    },
                );
                told = Some(domains);
            }
            (Persistence::Persisted, Some(domains)) => {
                emit_all(
                    &target,
                    domains,
                    DomainEvent::StatePersisted {
                        node: target.node.clone(),
                    },
                );
                told = None;
            }
            _ => {}
        }
        if persistence.changed().await.is_err() {
            return;
        }
    }
}

fn emit_all(target: &EventTarget, domains: &[DomainRef], event: DomainEvent) {
    for domain in domains {
        let (sink, event, domain) = (target.sink.clone(), event.clone(), domain.clone());
        tokio::spawn(async move {
            if let Err(error) = sink.emit(&domain, event).await {
                warn!(%error, %domain, "cannot record a checkpoint event");
            }
        });
    }
}

#[async_trait]
impl CheckpointStore for FileCheckpointStore {
    async fn load(&self) -> Result<Checkpoint, PortError> {
        Ok(self.load_with_outcome().await?.checkpoint)
    }

    fn record(&self, changes: Vec<CheckpointChange>) -> Recorded {
        self.record_changes(changes)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain values, each written whole: a panic elsewhere cannot have left one
    // half-updated.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read_boot_id(path: &Path) -> Result<String, CheckpointError> {
    let text = fs::read_to_string(path).map_err(|source| CheckpointError::BootIdUnreadable {
        path: path.to_owned(),
        source,
    })?;
    let boot_id = text.trim();
    if boot_id.is_empty() || !boot_id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(CheckpointError::BootIdInvalid {
            path: path.to_owned(),
            found: boot_id.to_owned(),
        });
    }
    Ok(boot_id.to_owned())
}
