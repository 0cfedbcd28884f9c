//! Status files: `status/<cd-uid>.json`, replaced atomically, so a reader sees the
//! last document whole.

use async_trait::async_trait;
use domaind_actors::model::DomainRef;
use domaind_actors::ports::{PortError, StatusSink};
use domaind_actors::rules::status::DomainStatus;
use time::OffsetDateTime;

use super::{FILE_MODE, LocalDir, LocalError, count_bad_file};
use crate::contract::{domain_from_status, status_from_domain};

/// Counts status documents written by outcome (`ok`, `failed`), as the Kubernetes
/// sink does under the same name.
pub const STATUS_WRITES: &str = "domaind_status_writes_total";

#[derive(Debug, Clone)]
pub struct LocalStatusSink {
    dir: LocalDir,
}

impl LocalStatusSink {
    pub fn new(dir: LocalDir) -> Self {
        Self { dir }
    }

    /// Returns why the previous file was unusable (and so replaced), if it was.
    fn write_blocking(
        &self,
        domain: &DomainRef,
        status: &DomainStatus,
    ) -> Result<Option<&'static str>, LocalError> {
        let uid = domain.uid.0.as_str();
        // The previous document only keeps the condition's transition time: one that
        // cannot be read is replaced. The rename replaces a link itself, never what it
        // points to.
        let (previous, garbled) = match self.dir.read_status(uid) {
            Ok(previous) => (previous, None),
            Err(error) => {
                tracing::warn!(%error, "replacing an unreadable status file");
                (None, Some(error.reason()))
            }
        };
        let document =
            status_from_domain(status, previous.as_ref(), None, OffsetDateTime::now_utc());
        let mut bytes = serde_json::to_vec_pretty(&document).expect("a status always serialises");
        bytes.push(b'\n');
        let path = self.dir.status_path(uid)?;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("status_path names a file")
            .to_owned();
        domaind_atomic_file::replace(&self.dir.status_dir(), &name, &bytes, FILE_MODE)
            .map_err(|source| LocalError::Write { path, source })?;
        Ok(garbled)
    }
}

#[async_trait]
impl StatusSink for LocalStatusSink {
    async fn write(&self, domain: &DomainRef, status: &DomainStatus) -> Result<(), PortError> {
        let (sink, domain, status) = (self.clone(), domain.clone(), status.clone());
        let written = tokio::task::spawn_blocking(move || sink.write_blocking(&domain, &status))
            .await
            .map_err(|e| PortError::transient("status write failed").with_source(e))
            .and_then(|result| result.map_err(PortError::from));
        let outcome = match written {
            Ok(garbled) => {
                if let Some(reason) = garbled {
                    count_bad_file("status", reason);
                }
                "ok"
            }
            Err(_) => "failed",
        };
        metrics::counter!(STATUS_WRITES, "backend" => "local", "outcome" => outcome).increment(1);
        written.map(drop)
    }

    /// An unreadable file is an error, not "nothing written": the reader would
    /// otherwise take a garbled status for an empty domain.
    async fn read(&self, domain: &DomainRef) -> Result<Option<DomainStatus>, PortError> {
        let (dir, uid) = (self.dir.clone(), domain.uid.0.clone());
        let read = tokio::task::spawn_blocking(move || dir.read_status(&uid))
            .await
            .map_err(|e| PortError::transient("status read failed").with_source(e))?;
        match read {
            Ok(status) => Ok(status.as_ref().map(domain_from_status)),
            Err(error) => {
                count_bad_file("status", error.reason());
                Err(error.into())
            }
        }
    }
}
