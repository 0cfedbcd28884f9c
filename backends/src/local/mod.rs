//! The local backend: a directory that plays the API server's part for a rack without
//! a cluster (the demo, the chaos harness, tests, outside tools). Every daemon of a
//! local rack shares one directory, as nodes share an API server.
//!
//! Its files are an interface, documented in the book (docs/src/getting-started.md, "The
//! local backend"):
//! - `claims/<claim-uid>.json`: a claim allocated to a node ([`ClaimFile`]), written by
//!   whoever plays the scheduler; read by the daemons at prepare.
//! - `status/<cd-uid>.json`: the ComputeDomain's `.status` exactly as the CRD defines
//!   it, written atomically by the domain's reporter.
//! - `events/<cd-uid>.jsonl`: one [`LocalEvent`] per line, appended by every node.
//!
//! A claim whose file is removed while a daemon holds it prepared is released by that
//! daemon's stale-claim check ([`LocalClaimExistence`]).

mod claims;
mod events;
mod files;
mod stale;
mod status;

use std::io;
use std::path::{Path, PathBuf};

pub use claims::{ClaimFile, ComputeDomainRef, LocalClaimSource};
pub use events::{LocalEvent, LocalEventSink};
pub use files::{CLAIM_FILE_LIMIT, STATUS_FILE_LIMIT};
pub use stale::{LocalClaimExistence, LocalStaleClaimNotices};
pub use status::LocalStatusSink;

use domaind_actors::ports::{ErrorKind, PortError};
use domaind_kube_api::crd::ComputeDomainStatus;

/// Counts files of the local backend that could not be used, by `kind` (`claim`,
/// `status`, `events`) and `reason` ([`LocalError::reason`], or `invalid` for a claim
/// file that parses but is refused).
pub const BAD_FILES: &str = "domaind_local_bad_files_total";

/// Counts one bad file of `kind`.
fn count_bad_file(kind: &'static str, reason: &'static str) {
    metrics::counter!(BAD_FILES, "kind" => kind, "reason" => reason).increment(1);
}

/// Why a file of the local backend could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("{name:?} cannot name a file of the local backend: {reason}")]
    BadName { name: String, reason: &'static str },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is not valid: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is a symbolic link: the local backend does not follow links", path.display())]
    Symlink { path: PathBuf },
    #[error("{} is a {what}, not a regular file: the local backend reads regular files only", path.display())]
    NotRegular { path: PathBuf, what: &'static str },
    #[error("{} is larger than {limit} bytes, the most the local backend reads from such a file", path.display())]
    TooLarge { path: PathBuf, limit: u64 },
}

impl LocalError {
    /// The `reason` label of [`BAD_FILES`].
    pub fn reason(&self) -> &'static str {
        match self {
            LocalError::BadName { .. } => "bad_name",
            LocalError::Read { .. } => "unreadable",
            LocalError::Parse { .. } => "unparsable",
            LocalError::Write { .. } => "unwritable",
            LocalError::Symlink { .. } => "symlink",
            LocalError::NotRegular { .. } => "not_regular_file",
            LocalError::TooLarge { .. } => "too_large",
        }
    }

    /// Whether the file itself is wrong (and stays wrong until someone fixes it), as
    /// opposed to a failure to reach it.
    pub fn is_bad_file(&self) -> bool {
        !matches!(self, LocalError::Read { .. } | LocalError::Write { .. })
    }
}

/// A bad file stays bad, and so does a directory this process may not use; any other
/// failure to reach a file (a full disk, an interrupted call) may pass.
impl From<LocalError> for PortError {
    fn from(error: LocalError) -> Self {
        let refused = match &error {
            LocalError::Read { source, .. } | LocalError::Write { source, .. } => matches!(
                source.kind(),
                io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem
            ),
            _ => true,
        };
        let kind = if refused {
            ErrorKind::Permanent
        } else {
            ErrorKind::Transient
        };
        PortError::from_source(kind, error)
    }
}

/// The layout of a local backend directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalDir {
    root: PathBuf,
}

/// Files are readable by every tool of the rack.
const FILE_MODE: u32 = 0o644;

impl LocalDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn claims_dir(&self) -> PathBuf {
        self.root.join("claims")
    }

    pub fn status_dir(&self) -> PathBuf {
        self.root.join("status")
    }

    pub fn events_dir(&self) -> PathBuf {
        self.root.join("events")
    }

    pub fn claim_path(&self, claim_uid: &str) -> Result<PathBuf, LocalError> {
        Ok(self.claims_dir().join(file_name(claim_uid, "json")?))
    }

    pub fn status_path(&self, cd_uid: &str) -> Result<PathBuf, LocalError> {
        Ok(self.status_dir().join(file_name(cd_uid, "json")?))
    }

    pub fn events_path(&self, cd_uid: &str) -> Result<PathBuf, LocalError> {
        Ok(self.events_dir().join(file_name(cd_uid, "jsonl")?))
    }

    /// Writes a claim file atomically, as a scheduler would allocate the claim.
    pub fn write_claim(&self, claim: &ClaimFile) -> Result<(), LocalError> {
        let name = file_name(&claim.uid, "json")?;
        let bytes = serde_json::to_vec_pretty(claim).expect("a claim file always serialises");
        domaind_atomic_file::replace(&self.claims_dir(), &name, &bytes, FILE_MODE).map_err(
            |source| LocalError::Write {
                path: self.claims_dir().join(&name),
                source,
            },
        )
    }

    /// Removes a claim file, as when a claim is deleted. Returns whether there was one.
    pub fn remove_claim(&self, claim_uid: &str) -> Result<bool, LocalError> {
        let name = file_name(claim_uid, "json")?;
        domaind_atomic_file::remove(&self.claims_dir(), &name).map_err(|source| LocalError::Write {
            path: self.claims_dir().join(&name),
            source,
        })
    }

    /// A domain's status as last written, or `None` before its reporter wrote one.
    pub fn read_status(&self, cd_uid: &str) -> Result<Option<ComputeDomainStatus>, LocalError> {
        let path = self.status_path(cd_uid)?;
        read_json(&path, STATUS_FILE_LIMIT)
    }

    /// A domain's events, oldest first. A line that does not parse (a torn append after
    /// a crash) is skipped. For tools and tests: the daemons only append. Not capped,
    /// since the file only grows; a link or a FIFO is still refused.
    pub fn read_events(&self, cd_uid: &str) -> Result<Vec<LocalEvent>, LocalError> {
        let path = self.events_path(cd_uid)?;
        let Some(bytes) = files::read_bounded(&path, None)? else {
            return Ok(Vec::new());
        };
        Ok(String::from_utf8_lossy(&bytes)
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect())
    }
}

/// A JSON file of the backend, refused unless it is a regular file of at most `limit`
/// bytes; `None` when there is no file.
fn read_json<T: serde::de::DeserializeOwned>(
    path: &Path,
    limit: u64,
) -> Result<Option<T>, LocalError> {
    let Some(bytes) = files::read_bounded(path, Some(limit))? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| LocalError::Parse {
            path: path.to_owned(),
            source,
        })
}

/// `<uid>.<extension>`, for a UID that cannot climb out of its directory or hide.
fn file_name(uid: &str, extension: &str) -> Result<String, LocalError> {
    let bad = |reason| LocalError::BadName {
        name: uid.to_owned(),
        reason,
    };
    if uid.is_empty() {
        return Err(bad("it is empty"));
    }
    if uid.len() > 253 {
        return Err(bad("it is longer than 253 characters"));
    }
    if uid.starts_with('.') {
        return Err(bad("it starts with '.'"));
    }
    if !uid
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(bad(
            "it has a character other than letters, digits, '-', '_' and '.'",
        ));
    }
    Ok(format!("{uid}.{extension}"))
}

#[cfg(test)]
mod tests;
