//! `<state-dir>/run.json`: where a running daemon listens, for the demo, the chaos
//! harness and operators (ports may have been chosen by the OS). Written once the
//! daemon is ready, removed on a clean stop; a stale one names a dead pid.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

const FILE: &str = "run.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunInfo {
    pub pid: u32,
    pub node: String,
    pub gossip_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// `/state`'s listener; `None` when `--state-addr off`.
    #[serde(default)]
    pub state_addr: Option<SocketAddr>,
    pub dra_socket: PathBuf,
    pub registration_socket: PathBuf,
}

impl RunInfo {
    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join(FILE)
    }

    pub fn write(&self, state_dir: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).expect("run info always serialises");
        crate::atomic_file::replace(state_dir, FILE, &bytes, 0o644)
    }

    /// The file of a daemon that is or was running; `None` if there is none yet.
    pub fn read(state_dir: &Path) -> std::io::Result<Option<Self>> {
        match std::fs::read(Self::path(state_dir)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn remove(state_dir: &Path) {
        let _ = crate::atomic_file::remove(state_dir, FILE);
    }
}
