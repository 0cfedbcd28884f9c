use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use domaind_actors::ports::{Checkpoint, CheckpointStore, PortError};
use tracing::{debug, error, info, warn};

use super::envelope::{self, Corruption, Decoded, FORMAT_VERSION};
use super::{CORRUPT_TOTAL, CheckpointError};
use crate::atomic_file as atomic;

/// The checkpoint's file name in the state directory.
pub const CHECKPOINT_FILE: &str = "checkpoint.json";

/// Where Linux keeps the id of the current boot.
pub const DEFAULT_BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// Corrupt checkpoints kept for a post-mortem; older ones are deleted.
const CORRUPT_COPIES_KEPT: usize = 3;

const FILE_MODE: u32 = 0o600;
const DIR_MODE: u32 = 0o755;

/// Where the checkpoint lives and how to learn the boot id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// Created if missing.
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

/// What a load found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadOutcome {
    /// No checkpoint: the first start on this node, or the file was removed.
    Missing,
    /// The checkpoint of this boot.
    Restored { claims: usize },
    /// Written before the node last rebooted. Prepared claims, device nodes and
    /// containers do not survive a reboot, so it was deleted and loading starts empty.
    PreviousBoot { written_on_boot: String },
    /// Not a checkpoint we can trust. Moved to `moved_to` (unless that failed too) and
    /// loading starts empty.
    Corrupt {
        reason: String,
        moved_to: Option<PathBuf>,
    },
    /// Written by a newer domaind: the load failed, and saves fail until the file is
    /// gone or domaind is upgraded.
    NewerFormat { found: u32, supported: u32 },
}

impl LoadOutcome {
    /// State was lost or refused in a way an operator should hear of, unlike a first
    /// start or a reboot: logged as an error and counted.
    pub fn needs_attention(&self) -> bool {
        matches!(self, Self::Corrupt { .. } | Self::NewerFormat { .. })
    }
}

/// A successful load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    pub checkpoint: Checkpoint,
    pub outcome: LoadOutcome,
}

/// The actors' checkpoint in one JSON file: versioned, checksummed, replaced
/// atomically, and reset when the node reboots. See the module documentation.
#[derive(Debug, Clone)]
pub struct FileCheckpointStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    path: PathBuf,
    boot_id: String,
    /// Held for every file operation, so that a load's cleaning of temporary files
    /// never races a save.
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    overwrite: Overwrite,
    last: Option<LoadOutcome>,
}

/// Whether a save may replace the file on disk.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Overwrite {
    /// Not known yet: look at the file's format first.
    #[default]
    Unchecked,
    Allowed,
    /// The file is of this newer format.
    Refused {
        found: u32,
    },
}

impl FileCheckpointStore {
    /// Reads the boot id and creates the state directory.
    pub fn open(config: CheckpointConfig) -> Result<Self, CheckpointError> {
        let boot_id = read_boot_id(&config.boot_id_path)?;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(&config.state_dir)
            .map_err(|source| CheckpointError::CreateDir {
                path: config.state_dir.clone(),
                source,
            })?;
        let path = config.state_dir.join(CHECKPOINT_FILE);
        Ok(Self {
            inner: Arc::new(Inner {
                dir: config.state_dir,
                path,
                boot_id,
                state: Mutex::default(),
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    pub fn boot_id(&self) -> &str {
        &self.inner.boot_id
    }

    /// Loads the checkpoint and says what was found. Never fails for a corrupt file
    /// or one from a previous boot (both start empty); fails for an unreadable file
    /// and for one written by a newer domaind.
    pub async fn load_with_outcome(&self) -> Result<Loaded, CheckpointError> {
        let inner = self.inner.clone();
        let result = tokio::task::spawn_blocking(move || inner.load())
            .await
            .map_err(|source| CheckpointError::Task {
                path: self.inner.path.clone(),
                source,
            })?;
        // Here, not in the blocking task: a metrics recorder may be thread-local.
        self.report(&result);
        result
    }

    /// Saves `checkpoint`, replacing the file atomically. Refused while the file on
    /// disk is of a newer format.
    pub async fn save_checkpoint(&self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        let path = self.inner.path.clone();
        let bytes = envelope::encode(checkpoint, &self.inner.boot_id)
            .map_err(|source| CheckpointError::Encode { path, source })?;
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || inner.save(&bytes))
            .await
            .map_err(|source| CheckpointError::Task {
                path: self.inner.path.clone(),
                source,
            })?
    }

    /// What the most recent load found; none before the first.
    pub fn last_load_outcome(&self) -> Option<LoadOutcome> {
        self.inner.state().last.clone()
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
                LoadOutcome::Corrupt { reason, moved_to } => {
                    metrics::counter!(CORRUPT_TOTAL).increment(1);
                    let moved_to = moved_to.as_ref().map_or_else(
                        || "nowhere (the move failed)".to_owned(),
                        |to| to.display().to_string(),
                    );
                    error!(%path, %reason, %moved_to, "checkpoint is corrupt; moved aside, starting with no prepared claims");
                }
                // A load that finds a newer format fails: logged below.
                LoadOutcome::NewerFormat { .. } => {}
            },
            Err(error) => error!(%error, "checkpoint not loaded"),
        }
    }
}

#[async_trait]
impl CheckpointStore for FileCheckpointStore {
    async fn load(&self) -> Result<Checkpoint, PortError> {
        Ok(self.load_with_outcome().await?.checkpoint)
    }

    async fn save(&self, checkpoint: &Checkpoint) -> Result<(), PortError> {
        Ok(self.save_checkpoint(checkpoint).await?)
    }
}

impl Inner {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a few plain values, each written whole: a panic elsewhere cannot
        // have left it half-updated.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn load(&self) -> Result<Loaded, CheckpointError> {
        let mut state = self.state();
        let result = self.load_locked(&mut state);
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
            state.last = Some(outcome);
        }
        result
    }

    fn load_locked(&self, state: &mut State) -> Result<Loaded, CheckpointError> {
        self.remove_stale_temps();
        let bytes = match fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                state.overwrite = Overwrite::Allowed;
                return Ok(empty(LoadOutcome::Missing));
            }
            Err(source) => {
                return Err(CheckpointError::Read {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let decoded = match envelope::decode(&bytes) {
            Ok(decoded) => decoded,
            Err(corruption) => {
                state.overwrite = Overwrite::Allowed;
                return Ok(empty(self.move_aside(&corruption)));
            }
        };
        match decoded {
            Decoded::Newer { format } => {
                state.overwrite = Overwrite::Refused { found: format };
                Err(self.newer(format))
            }
            Decoded::Current {
                boot_id,
                checkpoint,
            } => {
                state.overwrite = Overwrite::Allowed;
                if boot_id == self.boot_id {
                    let claims = checkpoint.claims.len();
                    return Ok(Loaded {
                        checkpoint,
                        outcome: LoadOutcome::Restored { claims },
                    });
                }
                // Deleted, not kept: a later load, before the first save, must not
                // find it and think it is of this boot.
                if let Err(error) = atomic::remove(&self.dir, CHECKPOINT_FILE) {
                    warn!(path = %self.path.display(), %error, "cannot delete the checkpoint of a previous boot; the next save replaces it");
                }
                Ok(empty(LoadOutcome::PreviousBoot {
                    written_on_boot: boot_id,
                }))
            }
        }
    }

    fn save(&self, bytes: &[u8]) -> Result<(), CheckpointError> {
        let mut state = self.state();
        if state.overwrite != Overwrite::Allowed {
            state.overwrite = self.probe_format()?;
        }
        if let Overwrite::Refused { found } = state.overwrite {
            return Err(self.newer(found));
        }
        let write_error = |source| CheckpointError::Write {
            path: self.path.clone(),
            source,
        };
        atomic::replace(&self.dir, CHECKPOINT_FILE, bytes, FILE_MODE).map_err(write_error)
    }

    /// Whether the file on disk may be replaced. Reads only its format: a save must not
    /// overwrite a newer domaind's state, even before any load (or after the newer file
    /// was removed by hand, when saving may go on).
    fn probe_format(&self) -> Result<Overwrite, CheckpointError> {
        match fs::read(&self.path) {
            Ok(bytes) => Ok(match envelope::format_of(&bytes) {
                Some(found) if found > FORMAT_VERSION => Overwrite::Refused { found },
                _ => Overwrite::Allowed,
            }),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(Overwrite::Allowed),
            Err(source) => Err(CheckpointError::Read {
                path: self.path.clone(),
                source,
            }),
        }
    }

    fn newer(&self, found: u32) -> CheckpointError {
        CheckpointError::NewerFormat {
            path: self.path.clone(),
            found,
            supported: FORMAT_VERSION,
        }
    }

    /// A crash between writing a temporary file and renaming it leaves the temporary
    /// file behind; the checkpoint itself is still the previous one.
    fn remove_stale_temps(&self) {
        match atomic::remove_stale_temps(&self.dir, |name| {
            atomic::is_temp_of(name, CHECKPOINT_FILE)
        }) {
            Ok(removed) if removed.is_empty() => {}
            Ok(removed) => warn!(
                dir = %self.dir.display(),
                ?removed,
                "removed temporary checkpoint files left by an interrupted write"
            ),
            Err(error) => {
                warn!(dir = %self.dir.display(), %error, "cannot clean temporary checkpoint files")
            }
        }
    }

    fn move_aside(&self, corruption: &Corruption) -> LoadOutcome {
        let reason = corruption.to_string();
        let aside = self.free_corrupt_name();
        let moved_to = match atomic::rename(&self.dir, CHECKPOINT_FILE, &aside) {
            Ok(()) => Some(self.dir.join(&aside)),
            Err(error) => {
                error!(path = %self.path.display(), %error, "cannot move the corrupt checkpoint aside; the next save replaces it");
                None
            }
        };
        self.prune_corrupt_copies();
        LoadOutcome::Corrupt { reason, moved_to }
    }

    fn corrupt_prefix(&self) -> String {
        format!("{}.corrupt-", CHECKPOINT_FILE)
    }

    /// `checkpoint.json.corrupt-<unix ms>`, with `-<n>` added when a copy of the same
    /// millisecond exists.
    fn free_corrupt_name(&self) -> String {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis());
        let base = format!("{}{now_ms}", self.corrupt_prefix());
        (0u32..)
            .map(|n| match n {
                0 => base.clone(),
                n => format!("{base}-{n}"),
            })
            .find(|name| !self.dir.join(name).exists())
            .unwrap_or(base)
    }

    fn prune_corrupt_copies(&self) {
        let prefix = self.corrupt_prefix();
        let mut copies: Vec<((u128, u32), String)> = match fs::read_dir(&self.dir) {
            Ok(entries) => entries
                .filter_map(Result::ok)
                .filter_map(|entry| entry.file_name().into_string().ok())
                .filter_map(|name| Some((corrupt_copy_order(&name, &prefix)?, name)))
                .collect(),
            Err(error) => {
                warn!(dir = %self.dir.display(), %error, "cannot list corrupt checkpoint copies");
                return;
            }
        };
        copies.sort();
        let excess = copies.len().saturating_sub(CORRUPT_COPIES_KEPT);
        for (_, name) in copies.into_iter().take(excess) {
            if let Err(error) = fs::remove_file(self.dir.join(&name)) {
                warn!(file = %name, %error, "cannot delete an old corrupt checkpoint copy");
            }
        }
    }
}

/// The age order of `<prefix><ms>[-<n>]`, or none for another file.
fn corrupt_copy_order(name: &str, prefix: &str) -> Option<(u128, u32)> {
    let rest = name.strip_prefix(prefix)?;
    let (ms, n) = match rest.split_once('-') {
        Some((ms, n)) => (ms, n.parse().ok()?),
        None => (rest, 0),
    };
    Some((ms.parse().ok()?, n))
}

fn empty(outcome: LoadOutcome) -> Loaded {
    Loaded {
        checkpoint: Checkpoint::default(),
        outcome,
    }
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
