//! Event files: `events/<cd-uid>.jsonl`, one event per line, appended by every node.
//! Each line is written with one `write` on a file opened for appending, so lines of
//! concurrent writers do not interleave.

use std::io::Write;

use async_trait::async_trait;
use domaind_actors::model::{DomainRef, NodeId};
use domaind_actors::ports::{DomainEvent, EventSink, PortError};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{LocalDir, LocalError, count_bad_file, files};
use crate::events::{EventText, EventType};

/// One line of an event file: what `kubectl describe` would show, and who saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalEvent {
    /// RFC 3339.
    pub time: String,
    /// The node that reported it.
    pub node: NodeId,
    #[serde(rename = "type")]
    pub type_: EventType,
    pub reason: String,
    pub message: String,
}

#[derive(Debug, Clone)]
pub struct LocalEventSink {
    dir: LocalDir,
    node: NodeId,
}

impl LocalEventSink {
    pub fn new(dir: LocalDir, node: impl Into<NodeId>) -> Self {
        Self {
            dir,
            node: node.into(),
        }
    }

    fn append(&self, domain: &DomainRef, event: &DomainEvent) -> Result<(), LocalError> {
        self.append_text(domain, EventText::of(event))
    }

    /// Appends an event that is not a [`DomainEvent`] (the stale-claim check's).
    pub fn append_text(&self, domain: &DomainRef, text: EventText) -> Result<(), LocalError> {
        let line = LocalEvent {
            time: OffsetDateTime::now_utc()
                .format(&Rfc3339)
                .expect("a UTC time always formats as RFC 3339"),
            node: self.node.clone(),
            type_: text.type_,
            reason: text.reason,
            message: text.message,
        };
        let mut bytes = serde_json::to_vec(&line).expect("an event always serialises");
        bytes.push(b'\n');
        let path = self.dir.events_path(&domain.uid.0)?;
        let write = |source| LocalError::Write {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(self.dir.events_dir()).map_err(write)?;
        // Appended as root: a link to a system file, or a FIFO nobody reads, is refused.
        let mut file = files::open_append(&path).inspect_err(|error| {
            if error.is_bad_file() {
                count_bad_file("events", error.reason());
            }
        })?;
        file.write_all(&bytes).map_err(write)
    }
}

#[async_trait]
impl EventSink for LocalEventSink {
    async fn emit(&self, domain: &DomainRef, event: DomainEvent) -> Result<(), PortError> {
        let (sink, domain) = (self.clone(), domain.clone());
        tokio::task::spawn_blocking(move || sink.append(&domain, &event))
            .await
            .map_err(|e| PortError::transient("event not recorded").with_source(e))?
            .map_err(PortError::from)
    }
}
