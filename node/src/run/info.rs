//! `<state-dir>/run.json`: where a running daemon listens, for the demo, the chaos
//! harness and operators (ports may have been chosen by the OS). Written once the
//! daemon is ready, removed on a clean stop; a stale one names a dead pid.
//!
//! Versions: `"version": 1` beside the fields (absent before it was added: 1 too). A
//! newer version may add fields, which a reader of this one skips; a reader meeting
//! one counts it and logs it once per file. A field this version reads may not change
//! its meaning: the tools that read run.json may be older than the daemon.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use domaind_gossip::version::NewerVersions;
use serde::{Deserialize, Serialize};

const FILE: &str = "run.json";

/// The version of run.json this domaind writes, and the newest it reads whole.
pub const RUN_INFO_VERSION: u32 = 1;

/// Tools read run.json in polling loops, each read on its own: the log of newer
/// versions is the process's, so that each file is logged once.
static NEWER: LazyLock<NewerVersions> = LazyLock::new(NewerVersions::default);

#[derive(Serialize)]
struct Versioned<'a> {
    version: u32,
    #[serde(flatten)]
    info: &'a RunInfo,
}

#[derive(Deserialize)]
struct Version {
    #[serde(default = "first_version")]
    version: u32,
}

fn first_version() -> u32 {
    1
}

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
        let bytes = serde_json::to_vec_pretty(&Versioned {
            version: RUN_INFO_VERSION,
            info: self,
        })
        .expect("run info always serialises");
        domaind_atomic_file::replace(state_dir, FILE, &bytes, 0o644)
    }

    /// The file of a daemon that is or was running; `None` if there is none yet.
    pub fn read(state_dir: &Path) -> std::io::Result<Option<Self>> {
        let path = Self::path(state_dir);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let invalid = |e| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
                let Version { version } = serde_json::from_slice(&bytes).map_err(invalid)?;
                let info = serde_json::from_slice(&bytes).map_err(invalid)?;
                if version > RUN_INFO_VERSION {
                    NEWER.note(
                        "run_json",
                        &path.display().to_string(),
                        u64::from(version),
                        u64::from(RUN_INFO_VERSION),
                        1,
                    );
                }
                Ok(Some(info))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn remove(state_dir: &Path) {
        let _ = domaind_atomic_file::remove(state_dir, FILE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RunInfo {
        RunInfo {
            pid: 7,
            node: "node-a".into(),
            gossip_addr: "127.0.0.2:7946".parse().unwrap(),
            http_addr: "127.0.0.2:9464".parse().unwrap(),
            state_addr: None,
            dra_socket: "/run/dra.sock".into(),
            registration_socket: "/run/reg.sock".into(),
        }
    }

    fn newer_counted(snapshotter: &metrics_util::debugging::Snapshotter) -> u64 {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == domaind_gossip::metrics::NEWER_VERSION)
            .map(|(.., value)| match value {
                metrics_util::debugging::DebugValue::Counter(n) => n,
                _ => 0,
            })
            .sum()
    }

    #[test]
    fn it_reads_back_with_its_version() {
        let dir = tempfile::tempdir().unwrap();
        sample().write(dir.path()).unwrap();
        let text = std::fs::read_to_string(RunInfo::path(dir.path())).unwrap();
        assert!(text.contains("\"version\": 1"), "{text}");
        assert_eq!(RunInfo::read(dir.path()).unwrap(), Some(sample()));
    }

    #[test]
    fn a_newer_version_is_read_as_far_as_this_one_understands_it() {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let dir = tempfile::tempdir().unwrap();
        let mut json = serde_json::to_value(sample()).unwrap();
        json["version"] = (RUN_INFO_VERSION + 1).into();
        json["added"] = serde_json::json!({"by": "the next version"});
        std::fs::write(RunInfo::path(dir.path()), json.to_string()).unwrap();
        let read = metrics::with_local_recorder(&recorder, || RunInfo::read(dir.path()));
        assert_eq!(read.unwrap(), Some(sample()));
        assert_eq!(newer_counted(&snapshotter), 1);
    }

    #[test]
    fn a_file_without_a_version_is_version_1() {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            RunInfo::path(dir.path()),
            serde_json::to_vec(&sample()).unwrap(),
        )
        .unwrap();
        let read = metrics::with_local_recorder(&recorder, || RunInfo::read(dir.path()));
        assert_eq!(read.unwrap(), Some(sample()));
        assert_eq!(newer_counted(&snapshotter), 0);
    }
}
