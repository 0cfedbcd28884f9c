//! The checkpoint store: what this node's prepared claims and slots are, kept in
//! `<state dir>/checkpoint.journal` so that a restarted daemon answers the kubelet as
//! before.
//!
//! - The journal is a file of records, one line each, every one with its own CRC-32,
//!   format version and boot id (`line`): a change to the checkpoint is one record, so
//!   what a prepare writes does not grow with the claims held.
//! - One writer task owns the file (`writer`): changes recorded while a write is under
//!   way are written together, with one append and one `fdatasync` (group commit); the
//!   journal is rewritten whole (atomically) when appends outnumber what it holds twice
//!   over.
//! - Reading it back (`replay`) applies records in order. A damaged record is set
//!   aside (copied to `checkpoint.journal.damaged-<ms>`), counted in
//!   [`CORRUPT_TOTAL`], and costs only the claim it was the last word on: the rest is
//!   restored. A write cut short by a crash (a last line without its newline) was never
//!   answered and is dropped.
//! - A journal of a previous boot starts empty: claims, device nodes and containers do
//!   not survive a node reboot.
//! - A full or read-only state directory is not fatal: changes are kept in memory and
//!   answered, the store says it is not persisted ([`Persistence`]), retries with a
//!   backoff, and writes the journal whole once it can.
//! - A journal of a newer format fails the load, and every record, until domaind is
//!   upgraded or the file removed: a downgrade never overwrites newer state. Records
//!   of a newer revision of this format are read as far as this domaind understands
//!   them, counted in `domaind_newer_version_total{format="checkpoint"}` and logged.

mod error;
mod journal;
/// One journal record's encoding; public for the fuzz targets (`fuzz/`).
pub mod line;
mod outcome;
mod replay;
mod store;
#[cfg(test)]
pub(crate) mod tests;
mod writer;

pub use error::CheckpointError;
pub use journal::{DirJournal, JOURNAL_FILE, Journal};
pub use line::FORMAT_VERSION;
pub use outcome::{LoadOutcome, Loaded};
pub use replay::{Replay, replay};
pub use store::{CheckpointConfig, DEFAULT_BOOT_ID_PATH, FileCheckpointStore};
pub use writer::{Persistence, WriterStats};

/// Counter: damaged checkpoint records found and set aside.
pub const CORRUPT_TOTAL: &str = "domaind_checkpoint_corrupt_total";

pub(crate) mod metrics_names {
    /// Counter: writes of the checkpoint that failed (each retry counts).
    pub const WRITE_FAILURES: &str = "domaind_checkpoint_write_failures_total";
    /// Gauge: 1 while everything recorded is on disk, 0 while some is only in memory.
    pub const PERSISTED: &str = "domaind_checkpoint_persisted";
    /// Histogram: callers answered by one write (group commit at work).
    pub const GROUP_SIZE: &str = "domaind_checkpoint_group_size";
    /// Histogram: seconds per write, by `kind` (`append`, `whole`).
    pub const WRITE_SECONDS: &str = "domaind_checkpoint_write_seconds";
}
pub use metrics_names::{GROUP_SIZE, PERSISTED, WRITE_FAILURES, WRITE_SECONDS};

/// Gives the checkpoint's metrics their help text (`# HELP` on `/metrics`, and the
/// book's metrics reference); the daemon calls it once, after installing its recorder.
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        CORRUPT_TOTAL,
        "Damaged checkpoint records found at start and set aside (each logged with its line)."
    );
    describe_counter!(
        WRITE_FAILURES,
        "Checkpoint writes that failed (each retry counts)."
    );
    describe_gauge!(
        PERSISTED,
        "1 while everything the node recorded is on disk, 0 while some is only in memory \
         (a restart then would forget it)."
    );
    describe_histogram!(
        GROUP_SIZE,
        "Callers answered by one checkpoint write (group commit)."
    );
    describe_histogram!(
        WRITE_SECONDS,
        "Seconds per checkpoint write, by `kind`: `append`, `whole`."
    );
}

/// The claim uids in the journal of `state_dir`, as a reader outside the daemon sees
/// it (the chaos harness): no side effects, no boot check. `None` when there is no
/// journal.
pub fn inspect(state_dir: &std::path::Path) -> std::io::Result<Option<Replay>> {
    match std::fs::read(state_dir.join(JOURNAL_FILE)) {
        Ok(bytes) => {
            let boot = inspect_boot(&bytes);
            Ok(Some(replay::replay(&bytes, &boot)))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// The boot the last intact record was written on: an outside reader has no boot id
/// of the daemon's to compare with, and the daemon's newest records are its own.
fn inspect_boot(bytes: &[u8]) -> String {
    bytes
        .split(|b| *b == b'\n')
        .rev()
        .find_map(|text| match line::decode(text) {
            Ok(line::Decoded::Record { boot, .. }) => Some(boot),
            _ => None,
        })
        .unwrap_or_default()
}
