//! Unix sockets for the kubelet: a stale socket left by a dead process is replaced, a
//! live one is never taken over, and anything that is not a socket is never deleted.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};

use super::error::PluginServerError;

/// `sun_path` holds 108 bytes, one of them the terminating NUL.
pub(crate) const MAX_SOCKET_PATH: usize = 107;

/// A live listener answers a connect at once (the kernel queues it); this bounds a
/// listener whose backlog is full, which is alive but too busy to tell.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// A socket file we created, and which one: so that we remove it at shutdown only if it
/// is still ours, not one a successor has bound at the same path since.
#[derive(Debug)]
pub(crate) struct SocketFile {
    path: PathBuf,
    identity: (u64, u64),
}

impl SocketFile {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the file if it is still the one we bound. Failures are logged: at shutdown
    /// nothing better can be done, and the next start clears a stale socket anyway.
    pub(crate) fn remove(&self) {
        match std::fs::symlink_metadata(&self.path) {
            Ok(meta) if (meta.dev(), meta.ino()) == self.identity => {
                if let Err(error) = std::fs::remove_file(&self.path) {
                    tracing::warn!(path = %self.path.display(), %error, "cannot remove socket");
                }
            }
            Ok(_) => tracing::warn!(
                path = %self.path.display(),
                "socket was replaced by someone else; leaving it"
            ),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(path = %self.path.display(), %error, "cannot inspect socket")
            }
        }
    }
}

/// Listens on `path`: creates its directory, clears a stale socket, refuses a live one.
pub(crate) async fn bind(path: &Path) -> Result<(UnixListener, SocketFile), PluginServerError> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(PluginServerError::SocketPathTooLong {
            path: path.to_path_buf(),
            len,
            max: MAX_SOCKET_PATH,
        });
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| PluginServerError::CreateDir {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    clear_stale(path).await?;
    let listener = UnixListener::bind(path).map_err(|source| PluginServerError::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    let meta = std::fs::symlink_metadata(path).map_err(|source| PluginServerError::Inspect {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((
        listener,
        SocketFile {
            path: path.to_path_buf(),
            identity: (meta.dev(), meta.ino()),
        },
    ))
}

async fn clear_stale(path: &Path) -> Result<(), PluginServerError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(PluginServerError::Inspect {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let file_type = meta.file_type();
    if !file_type.is_socket() {
        let found = if file_type.is_dir() {
            "directory"
        } else if file_type.is_symlink() {
            "symbolic link"
        } else if file_type.is_file() {
            "regular file"
        } else {
            "special file"
        };
        return Err(PluginServerError::NotASocket {
            path: path.to_path_buf(),
            found,
        });
    }
    match tokio::time::timeout(PROBE_TIMEOUT, UnixStream::connect(path)).await {
        Ok(Ok(_)) => Err(PluginServerError::SocketInUse {
            path: path.to_path_buf(),
        }),
        Ok(Err(error)) if error.kind() == io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path).or_else(|source| match source.kind() {
                io::ErrorKind::NotFound => Ok(()),
                _ => Err(PluginServerError::RemoveStale {
                    path: path.to_path_buf(),
                    source,
                }),
            })?;
            tracing::info!(path = %path.display(), "removed a stale socket nobody listens on");
            Ok(())
        }
        Ok(Err(error)) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Ok(Err(source)) => Err(PluginServerError::SocketUndetermined {
            path: path.to_path_buf(),
            source,
        }),
        Err(_) => Err(PluginServerError::SocketUndetermined {
            path: path.to_path_buf(),
            source: io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {PROBE_TIMEOUT:?}"),
            ),
        }),
    }
}
