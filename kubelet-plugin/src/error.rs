//! Why the kubelet plugin servers could not start.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PluginServerError {
    #[error(
        "socket path in use: {path} answers connections, so another process (another domaind, \
         or an old plugin) is serving there; stop it first"
    )]
    SocketInUse { path: PathBuf },
    #[error(
        "socket path {path} may be in use: it exists and connecting to it failed with: {source}; \
         left as it is"
    )]
    SocketUndetermined { path: PathBuf, source: io::Error },
    #[error("{path} is a {found}, not a unix socket; refusing to replace it (remove it yourself)")]
    NotASocket { path: PathBuf, found: &'static str },
    #[error("socket path {path} is {len} bytes long; unix sockets allow at most {max}")]
    SocketPathTooLong {
        path: PathBuf,
        len: usize,
        max: usize,
    },
    #[error("cannot create directory {path}: {source}")]
    CreateDir { path: PathBuf, source: io::Error },
    #[error("cannot inspect {path}: {source}")]
    Inspect { path: PathBuf, source: io::Error },
    #[error("cannot remove stale socket {path}: {source}")]
    RemoveStale { path: PathBuf, source: io::Error },
    #[error("cannot listen on unix socket {path}: {source}")]
    Bind { path: PathBuf, source: io::Error },
    #[error("cannot listen for gRPC health on {addr}: {source}")]
    BindHealth { addr: SocketAddr, source: io::Error },
}
