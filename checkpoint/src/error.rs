use std::io;
use std::path::PathBuf;

use domaind_actors::ports::{ErrorKind, PortError};

/// Why the checkpoint could not be read or written. Each names the file and, where
/// there is one, what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(
        "cannot read the boot id from {path}: {source}; domaind needs it to tell a \
         daemon restart from a node reboot (on Linux: /proc/sys/kernel/random/boot_id)"
    )]
    BootIdUnreadable { path: PathBuf, source: io::Error },

    #[error("the boot id in {path} is empty or not printable ASCII: {found:?}")]
    BootIdInvalid { path: PathBuf, found: String },

    #[error("cannot read the checkpoint {path}: {source}")]
    Read { path: PathBuf, source: io::Error },

    #[error(
        "the checkpoint {path} has format version {found}, but this domaind reads \
         versions up to {supported}: it was written by a newer domaind; upgrade domaind, \
         or remove the file (this node then forgets its prepared claims)"
    )]
    NewerFormat {
        path: PathBuf,
        found: u32,
        supported: u32,
    },

    #[error("the checkpoint's writer for {path} has stopped")]
    WriterGone { path: PathBuf },
}

impl CheckpointError {
    /// Only a read that may pass (not a refused one) is worth asking again soon: the
    /// boot id and a newer format stay as they are until someone acts, and a writer
    /// that stopped does not come back.
    pub fn kind(&self) -> ErrorKind {
        match self {
            CheckpointError::Read { source, .. } => io_kind(source),
            CheckpointError::BootIdUnreadable { .. }
            | CheckpointError::BootIdInvalid { .. }
            | CheckpointError::NewerFormat { .. }
            | CheckpointError::WriterGone { .. } => ErrorKind::Permanent,
        }
    }
}

/// A file this process may not use stays so until someone changes its permissions or
/// mount; other I/O failures (a full disk, an interrupted call) may pass.
pub(crate) fn io_kind(error: &io::Error) -> ErrorKind {
    match error.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => ErrorKind::Permanent,
        _ => ErrorKind::Transient,
    }
}

impl From<CheckpointError> for PortError {
    fn from(error: CheckpointError) -> Self {
        PortError::from_source(error.kind(), error)
    }
}
