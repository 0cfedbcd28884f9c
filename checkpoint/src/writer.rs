//! The checkpoint's one writer: a task that owns the journal and commits changes in
//! groups.
//!
//! Changes reach it in the order they were recorded (one channel). It takes every
//! change waiting at once, writes them with one append and one `fdatasync`, and answers
//! every caller of the group; changes that arrive meanwhile make the next group. So a
//! storm of prepares costs a few writes, not one each, and a write costs what changed,
//! not the whole checkpoint. It keeps the checkpoint in memory too (the mirror), so
//! that it can write the journal whole: to compact it once appends outnumber what it
//! holds twice over, and to catch up after writes failed.
//!
//! A write that fails (a full or read-only disk, an I/O error) is not the caller's
//! failure: the change is in memory, the node serves from it, and the writer says so
//! ([`Persistence::NotPersisted`]), retries with a backoff, and writes the journal
//! whole once the disk takes it. Only a journal of a newer format refuses changes: a
//! downgrade never overwrites newer state.

use std::time::Duration;

use domaind_actors::model::DomainRef;
use domaind_actors::ports::{Checkpoint, CheckpointChange, PortError};
use domaind_backoff::Backoff;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::error::CheckpointError;
use super::journal::Journal;
use super::line::{self, FORMAT_VERSION, Op};
use super::metrics_names as names;
use super::outcome::{LoadOutcome, Loaded};
use super::replay::{self, Replay};
use domaind_gossip::version::NewerVersions;

/// Requests taken in one group at most: the answer to the first must not wait for an
/// unbounded batch to be encoded.
const MAX_GROUP: usize = 1024;
/// Appends since the journal was last written whole before it is compacted, at least.
const COMPACT_AFTER_MIN: usize = 1024;
/// Retries of a failed write wait from this, doubling...
const RETRY_MIN: Duration = Duration::from_millis(100);
/// ...up to this: a disk that has space again is written within this long.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Whether what the node holds is on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Persistence {
    /// Everything recorded is on disk.
    Persisted,
    /// Writes fail: changes are kept in memory, answered, and written once the disk
    /// takes them. A restart now would lose them.
    NotPersisted {
        error: String,
        /// The domains of the claims held when the writes began to fail.
        domains: Vec<DomainRef>,
    },
    /// The journal on disk is of a newer format: changes are refused.
    Refused { error: String },
}

/// What the writer has done, for tests and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Appends that reached the disk.
    pub appends: u64,
    /// Times the journal was written whole (compactions, migrations, catching up).
    pub rewrites: u64,
    /// Changes recorded.
    pub changes: u64,
    /// Writes that failed.
    pub failures: u64,
}

pub(super) enum Request {
    Load(oneshot::Sender<Result<Loaded, CheckpointError>>),
    Record {
        changes: Vec<CheckpointChange>,
        done: oneshot::Sender<Result<(), PortError>>,
    },
    Stats(oneshot::Sender<WriterStats>),
}

/// Where the journal stands against the mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Disk {
    /// The journal holds the mirror: appends may go on.
    InStep,
    /// The journal lags (a write failed, perhaps halfway): only writing it whole
    /// brings it back in step.
    Behind { error: String },
    /// A newer format: nothing may be written.
    Refused { found: u32 },
}

pub(super) struct Writer {
    /// None only while a blocking call holds it.
    journal: Option<Box<dyn Journal>>,
    boot_id: String,
    mirror: Checkpoint,
    loaded: bool,
    /// Records that came before the first load: they apply on top of what it finds.
    held: Vec<Request>,
    appended: usize,
    disk: Disk,
    retry: Backoff,
    retry_at: Option<Instant>,
    stats: WriterStats,
    health: watch::Sender<Persistence>,
}

impl Writer {
    pub(super) fn new(
        journal: Box<dyn Journal>,
        boot_id: String,
        health: watch::Sender<Persistence>,
    ) -> Self {
        Self {
            journal: Some(journal),
            boot_id,
            mirror: Checkpoint::default(),
            loaded: false,
            held: Vec::new(),
            appended: 0,
            disk: Disk::InStep,
            retry: Backoff::new(RETRY_MIN, RETRY_MAX),
            retry_at: None,
            stats: WriterStats::default(),
            health,
        }
    }

    /// Serves requests until every sender is gone.
    pub(super) async fn run(mut self, mut requests: mpsc::UnboundedReceiver<Request>) {
        let mut next: Option<Request> = None;
        loop {
            let request = match next.take() {
                Some(request) => request,
                None => {
                    let retry_at = self.retry_at;
                    tokio::select! {
                        request = requests.recv() => match request {
                            Some(request) => request,
                            None => break,
                        },
                        () = sleep_until(retry_at), if retry_at.is_some() => {
                            self.retry_at = None;
                            self.write_whole().await;
                            continue;
                        }
                    }
                }
            };
            match request {
                Request::Load(reply) => {
                    let loaded = self.load().await;
                    let _ = reply.send(loaded);
                    let held = std::mem::take(&mut self.held);
                    if !held.is_empty() {
                        self.commit(held).await;
                    }
                }
                Request::Stats(reply) => {
                    let _ = reply.send(self.stats);
                }
                record if !self.loaded => self.held.push(record),
                record => {
                    let mut group = vec![record];
                    while group.len() < MAX_GROUP {
                        match requests.try_recv() {
                            Ok(record @ Request::Record { .. }) => group.push(record),
                            Ok(other) => {
                                next = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    self.commit(group).await;
                }
            }
        }
    }

    /// Runs `work` on the journal in a blocking task.
    async fn blocking<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut dyn Journal) -> T + Send + 'static,
    ) -> T {
        let mut journal = self
            .journal
            .take()
            .expect("the journal is back between calls");
        let (journal, result) = tokio::task::spawn_blocking(move || {
            let result = work(journal.as_mut());
            (journal, result)
        })
        .await
        // The work is file I/O of our own; a panic there is a bug to surface, not to
        // paper over (the daemon's panic hook restarts it).
        .expect("the checkpoint's file task panicked");
        self.journal = Some(journal);
        result
    }

    fn path(&self) -> std::path::PathBuf {
        self.journal
            .as_ref()
            .map(|journal| journal.path().to_owned())
            .unwrap_or_default()
    }

    async fn commit(&mut self, group: Vec<Request>) {
        let mut lines = Vec::new();
        let mut changes = 0;
        let mut waiting = Vec::with_capacity(group.len());
        for request in group {
            let Request::Record {
                changes: recorded,
                done,
            } = request
            else {
                continue;
            };
            for change in recorded {
                lines.extend(line::encode(&Op::from(change.clone()), &self.boot_id));
                self.mirror.apply(change);
                changes += 1;
            }
            waiting.push(done);
        }
        self.stats.changes += changes as u64;
        let answer = match &self.disk {
            Disk::Refused { .. } => self.write_unless_refused().await,
            // Served from memory; the retry writes it all.
            Disk::Behind { .. } => Ok(()),
            Disk::InStep if changes == 0 => Ok(()),
            Disk::InStep if self.appended + changes >= self.compact_after() => {
                self.write_whole().await;
                Ok(())
            }
            Disk::InStep => {
                self.append(lines, changes).await;
                Ok(())
            }
        };
        metrics::histogram!(names::GROUP_SIZE).record(waiting.len() as f64);
        for done in waiting {
            let _ = done.send(answer.clone());
        }
    }

    fn compact_after(&self) -> usize {
        COMPACT_AFTER_MIN.max(2 * (self.mirror.claims.len() + self.mirror.slots.len()))
    }

    async fn append(&mut self, lines: Vec<u8>, changes: usize) {
        let started = Instant::now();
        let written = self.blocking(move |journal| journal.append(&lines)).await;
        metrics::histogram!(names::WRITE_SECONDS, "kind" => "append")
            .record(started.elapsed().as_secs_f64());
        match written {
            Ok(()) => {
                self.stats.appends += 1;
                self.appended += changes;
            }
            Err(error) => self.failed(format!(
                "cannot append to {}: {error}",
                self.path().display()
            )),
        }
    }

    /// Replaces the journal with the mirror: compaction, migration, catching up.
    async fn write_whole(&mut self) {
        let bytes = replay::compacted(&self.mirror, &self.boot_id);
        let started = Instant::now();
        let written = self.blocking(move |journal| journal.replace(&bytes)).await;
        metrics::histogram!(names::WRITE_SECONDS, "kind" => "whole")
            .record(started.elapsed().as_secs_f64());
        match written {
            Ok(()) => {
                self.stats.rewrites += 1;
                self.appended = 0;
                self.in_step();
            }
            Err(error) => self.failed(format!("cannot write {}: {error}", self.path().display())),
        }
    }

    /// While refused: asks the disk again (the newer journal may have been removed by
    /// hand), and writes the mirror if it may.
    async fn write_unless_refused(&mut self) -> Result<(), PortError> {
        let boot = self.boot_id.clone();
        let probed = self
            .blocking(move |journal| newer_on_disk(journal, &boot))
            .await;
        match probed {
            Ok(Some(found)) => {
                self.disk = Disk::Refused { found };
                Err(self.newer(found).into())
            }
            Ok(None) => {
                self.write_whole().await;
                Ok(())
            }
            Err(error) => Err(PortError::new(
                crate::error::io_kind(&error),
                format!("cannot read {}", self.path().display()),
            )
            .with_source(error)),
        }
    }

    fn newer(&self, found: u32) -> CheckpointError {
        CheckpointError::NewerFormat {
            path: self.path(),
            found,
            supported: FORMAT_VERSION,
        }
    }

    fn failed(&mut self, error: String) {
        self.stats.failures += 1;
        metrics::counter!(names::WRITE_FAILURES).increment(1);
        metrics::gauge!(names::PERSISTED).set(0.0);
        let delay = self.retry.fail();
        self.retry_at = Some(Instant::now() + delay);
        let first = !matches!(self.disk, Disk::Behind { .. });
        if first {
            error!(
                %error,
                retry_in = ?delay,
                "the checkpoint cannot be written: prepared claims are kept in memory and \
                 answered, and written once the state directory takes them; a restart \
                 before then forgets them"
            );
        } else {
            warn!(%error, failures = self.retry.failures(), retry_in = ?delay, "the checkpoint still cannot be written");
        }
        self.disk = Disk::Behind {
            error: error.clone(),
        };
        let domains = domains_of(&self.mirror);
        self.health.send_if_modified(|health| {
            let now = Persistence::NotPersisted { error, domains };
            // One report per episode: a new error text alone is not news.
            let news = !matches!(health, Persistence::NotPersisted { .. });
            *health = now;
            news
        });
    }

    fn in_step(&mut self) {
        if let Disk::Behind { error } = &self.disk {
            info!(
                previous_error = %error,
                failures = self.retry.failures(),
                "the checkpoint is written again: everything held in memory is on disk"
            );
        }
        self.disk = Disk::InStep;
        self.retry.succeed();
        self.retry_at = None;
        metrics::gauge!(names::PERSISTED).set(1.0);
        self.health.send_if_modified(|health| {
            let news = *health != Persistence::Persisted;
            *health = Persistence::Persisted;
            news
        });
    }

    async fn load(&mut self) -> Result<Loaded, CheckpointError> {
        let boot = self.boot_id.clone();
        let path = self.path();
        let found = self.blocking(move |journal| find(journal, &boot)).await;
        let assessed = assess(found.map_err(|source| CheckpointError::Read {
            path: path.clone(),
            source,
        })?);
        self.loaded = true;
        for note in &assessed.notes {
            warn!(path = %path.display(), "checkpoint: {note}");
        }
        if let Some((records, rev)) = assessed.newer_revision {
            // One load per start: a fresh log of newer versions logs it once per file.
            NewerVersions::default().note(
                "checkpoint",
                &path.display().to_string(),
                u64::from(rev),
                u64::from(line::REVISION),
                records,
            );
        }
        if let Some(found) = assessed.refused {
            self.disk = Disk::Refused { found };
            let error = self.newer(found);
            self.health.send_replace(Persistence::Refused {
                error: error.to_string(),
            });
            return Err(error);
        }
        self.mirror = assessed.checkpoint.clone();
        let mut outcome = assessed.outcome;
        if let Some((of, bytes)) = assessed.set_aside {
            let kept = self
                .blocking(move |journal| journal.set_aside(&of, &bytes))
                .await;
            let kept = kept
                .map_err(
                    |error| error!(%error, "cannot keep a copy of the damaged checkpoint records"),
                )
                .ok();
            if let LoadOutcome::Damaged { moved_to, .. } = &mut outcome {
                *moved_to = kept;
            }
        }
        if assessed.rewrite {
            self.write_whole().await;
        } else {
            self.in_step();
        }
        Ok(Loaded {
            checkpoint: assessed.checkpoint,
            outcome,
        })
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The domains of the claims `checkpoint` holds, each once.
pub(super) fn domains_of(checkpoint: &Checkpoint) -> Vec<DomainRef> {
    let mut domains: Vec<DomainRef> = Vec::new();
    for record in checkpoint.claims.values() {
        if !domains.iter().any(|d| d.uid == record.info.domain.uid) {
            domains.push(record.info.domain.clone());
        }
    }
    domains
}

/// What the state directory holds.
#[derive(Debug)]
enum Found {
    Nothing,
    Journal(Replay),
}

fn find(journal: &mut dyn Journal, boot_id: &str) -> std::io::Result<Found> {
    journal.remove_stale_temps();
    Ok(match journal.read()? {
        Some(bytes) => Found::Journal(replay::replay(&bytes, boot_id)),
        None => Found::Nothing,
    })
}

/// A newer format in the journal.
fn newer_on_disk(journal: &mut dyn Journal, boot_id: &str) -> std::io::Result<Option<u32>> {
    Ok(journal
        .read()?
        .and_then(|bytes| replay::replay(&bytes, boot_id).newer))
}

/// What a load does about what it found.
#[derive(Debug)]
struct Assessed {
    checkpoint: Checkpoint,
    outcome: LoadOutcome,
    /// The journal must be written whole: to drop damaged records, a torn tail or
    /// or another boot's records.
    rewrite: bool,
    set_aside: Option<(String, Vec<u8>)>,
    refused: Option<u32>,
    /// Harmless findings, for the log.
    notes: Vec<String>,
    /// Records of a newer revision read, and the newest revision.
    newer_revision: Option<(usize, u32)>,
}

impl Assessed {
    fn new(checkpoint: Checkpoint, outcome: LoadOutcome) -> Self {
        Self {
            checkpoint,
            outcome,
            rewrite: false,
            set_aside: None,
            refused: None,
            notes: Vec::new(),
            newer_revision: None,
        }
    }

    fn refused(found: u32) -> Self {
        Self {
            refused: Some(found),
            ..Self::new(
                Checkpoint::default(),
                LoadOutcome::NewerFormat {
                    found,
                    supported: FORMAT_VERSION,
                },
            )
        }
    }
}

fn assess(found: Found) -> Assessed {
    match found {
        Found::Nothing => Assessed::new(Checkpoint::default(), LoadOutcome::Missing),
        Found::Journal(replay) => assess_journal(replay),
    }
}

fn assess_journal(replay: Replay) -> Assessed {
    if let Some(found) = replay.newer {
        return Assessed::refused(found);
    }
    if replay.records == 0
        && let Some(written_on_boot) = replay.other_boot.clone()
    {
        let mut assessed = Assessed::new(
            Checkpoint::default(),
            LoadOutcome::PreviousBoot { written_on_boot },
        );
        assessed.rewrite = true;
        return assessed;
    }
    let claims = replay.checkpoint.claims.len();
    let rewrite = !replay.damaged.is_empty()
        || replay.torn_tail > 0
        || replay.other_boot_records > 0
        || replay.repaired > 0;
    let mut notes = Vec::new();
    if replay.torn_tail > 0 {
        notes.push(format!(
            "dropped a last record cut short by a crash ({} bytes; never answered)",
            replay.torn_tail
        ));
    }
    if replay.repaired > 0 {
        notes.push(format!(
            "read {} pair(s) of records whose separating newline was damaged; nothing lost",
            replay.repaired
        ));
    }
    if replay.other_boot_records > 0 {
        notes.push(format!(
            "dropped {} record(s) of a previous boot",
            replay.other_boot_records
        ));
    }
    let outcome = if replay.damaged.is_empty() {
        LoadOutcome::Restored { claims }
    } else {
        let lost_claims: Vec<String> = replay
            .lost
            .iter()
            .filter_map(|(key, _)| match key {
                line::Key::Claim(uid) => Some(uid.clone()),
                line::Key::Slot(_) => None,
            })
            .collect();
        let unattributed = replay.damaged.iter().filter(|d| d.key.is_none()).count();
        let mut domains: Vec<DomainRef> = Vec::new();
        let mut add = |domain: &DomainRef| {
            if !domains.iter().any(|d| d.uid == domain.uid) {
                domains.push(domain.clone());
            }
        };
        replay
            .lost
            .iter()
            .filter_map(|(_, d)| d.as_ref())
            .for_each(&mut add);
        if unattributed > 0 {
            domains_of(&replay.checkpoint).iter().for_each(&mut add);
        }
        LoadOutcome::Damaged {
            claims,
            damaged_records: replay.damaged.len(),
            lost_claims,
            unattributed,
            details: replay
                .damaged
                .iter()
                .map(|d| format!("line {}: {}", d.line, d.damage))
                .collect(),
            domains,
            moved_to: None,
        }
    };
    let set_aside = (!replay.damaged.is_empty()).then(|| {
        let mut bytes = Vec::new();
        for damaged in &replay.damaged {
            bytes.extend_from_slice(&damaged.bytes);
            bytes.push(b'\n');
        }
        (super::journal::JOURNAL_FILE.to_owned(), bytes)
    });
    Assessed {
        rewrite,
        set_aside,
        notes,
        newer_revision: replay
            .newer_revision
            .map(|rev| (replay.newer_revision_records, rev)),
        ..Assessed::new(replay.checkpoint, outcome)
    }
}
