//! How the local backend opens its files. The directory is written by whoever plays the
//! scheduler, and the daemon runs as root: a claim file linked to `/etc/shadow` must not
//! be read, a FIFO must not hold a worker thread forever, and a huge file must not be
//! read into memory. So a file is opened only if it is a regular file, never through a
//! symbolic link (`O_NOFOLLOW` on the last component), never blocking on open
//! (`O_NONBLOCK`: a FIFO opens at once and is then refused), and read only up to a cap.
//!
//! The type is checked twice: on the path before opening, so a device or FIFO is never
//! opened at all (opening some devices has effects), and on the opened descriptor,
//! which is what counts if the path was swapped in between.
//!
//! The directories themselves (`claims/`, `status/`, `events/`) are taken as the
//! operator configured them: whoever can replace those can replace `--local-dir`.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read as _};
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;

use super::LocalError;

/// The most a claim file may hold. A real one is a few hundred bytes (namespace, name,
/// uid, the domain's reference and a few options, each at most a Kubernetes name), so
/// this is far above any real file and far below what would hurt a daemon to read.
pub const CLAIM_FILE_LIMIT: u64 = 64 * 1024;

/// The most a status file may hold. A node's row is about 200 bytes, and a local rack
/// has at most 250 nodes: about 50 KiB at most.
pub const STATUS_FILE_LIMIT: u64 = 1024 * 1024;

/// Reads `path` whole if it is a regular file of at most `limit` bytes; `None` if
/// there is no such file.
pub(super) fn read_bounded(path: &Path, limit: Option<u64>) -> Result<Option<Vec<u8>>, LocalError> {
    let mut options = OpenOptions::new();
    options.read(true);
    let Some(file) = open_regular(path, &options)? else {
        return Ok(None);
    };
    let read_error = |source| LocalError::Read {
        path: path.to_owned(),
        source,
    };
    let mut bytes = Vec::new();
    match limit {
        Some(limit) => {
            // One byte past the limit tells a file at the limit from one above it,
            // whatever its size said when it was opened (it may still be growing).
            file.take(limit + 1)
                .read_to_end(&mut bytes)
                .map_err(read_error)?;
            if bytes.len() as u64 > limit {
                return Err(LocalError::TooLarge {
                    path: path.to_owned(),
                    limit,
                });
            }
        }
        None => {
            let mut file = file;
            file.read_to_end(&mut bytes).map_err(read_error)?;
        }
    }
    Ok(Some(bytes))
}

/// Opens `path` for appending, creating it if missing, only as a regular file.
pub(super) fn open_append(path: &Path) -> Result<File, LocalError> {
    let mut options = OpenOptions::new();
    options.create(true).append(true);
    open_regular(path, &options)?.ok_or_else(|| LocalError::Write {
        path: path.to_owned(),
        source: io::Error::new(io::ErrorKind::NotFound, "vanished while being opened"),
    })
}

/// Opens `path` with `options` if it is a regular file, never following a link and
/// never blocking; `None` if it does not exist (and `options` do not create it).
fn open_regular(path: &Path, options: &OpenOptions) -> Result<Option<File>, LocalError> {
    match std::fs::symlink_metadata(path) {
        Ok(metadata) => check_type(path, &metadata)?,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(LocalError::Read {
                path: path.to_owned(),
                source,
            });
        }
    }
    let mut options = options.clone();
    options.custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).bits());
    let file = match options.open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        // O_NOFOLLOW's answer when the last component is a link.
        Err(error) if error.raw_os_error() == Some(Errno::ELOOP as i32) => {
            return Err(LocalError::Symlink {
                path: path.to_owned(),
            });
        }
        // A FIFO opened for writing without a reader, with O_NONBLOCK.
        Err(error) if error.raw_os_error() == Some(Errno::ENXIO as i32) => {
            return Err(LocalError::NotRegular {
                path: path.to_owned(),
                what: "FIFO or socket",
            });
        }
        Err(source) => {
            return Err(LocalError::Read {
                path: path.to_owned(),
                source,
            });
        }
    };
    let metadata = file.metadata().map_err(|source| LocalError::Read {
        path: path.to_owned(),
        source,
    })?;
    check_type(path, &metadata)?;
    Ok(Some(file))
}

fn check_type(path: &Path, metadata: &Metadata) -> Result<(), LocalError> {
    let kind = metadata.file_type();
    let what = if kind.is_file() {
        return Ok(());
    } else if kind.is_symlink() {
        return Err(LocalError::Symlink {
            path: path.to_owned(),
        });
    } else if kind.is_dir() {
        "directory"
    } else if kind.is_fifo() {
        "FIFO"
    } else if kind.is_socket() {
        "socket"
    } else if kind.is_char_device() {
        "character device"
    } else if kind.is_block_device() {
        "block device"
    } else {
        "special file"
    };
    Err(LocalError::NotRegular {
        path: path.to_owned(),
        what,
    })
}
