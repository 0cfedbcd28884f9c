//! The journal's files: the only code of the checkpoint that touches the disk. The
//! writer calls it from blocking tasks, one call at a time.
//!
//! - `checkpoint.journal`: the records, appended and flushed with `fdatasync`, or
//!   replaced whole (temporary file, fsync, rename, fsync of the directory) to compact
//!   it or to recover from a failed append.
//! - `checkpoint.journal.damaged-<unix ms>`: damaged records set aside at a load, the
//!   three newest kept.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::warn;

use domaind_atomic_file as atomic;

/// The journal's file name in the state directory.
pub const JOURNAL_FILE: &str = "checkpoint.journal";

/// Copies of damaged records kept for a post-mortem.
const ASIDE_COPIES_KEPT: usize = 3;
const FILE_MODE: u32 = 0o600;

/// The files the writer keeps. A trait so that tests can make the disk fail on cue.
pub trait Journal: Send + std::fmt::Debug + 'static {
    /// The journal's path, for errors and logs.
    fn path(&self) -> &Path;
    /// The journal's bytes; none when there is no journal.
    fn read(&mut self) -> io::Result<Option<Vec<u8>>>;
    /// Appends `bytes` and flushes them to disk. A failure may leave part of them
    /// written: the caller replaces the journal before appending again.
    fn append(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// Replaces the journal with `bytes`, atomically.
    fn replace(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// Keeps `bytes` (damaged records) beside the journal, named after `of`; returns
    /// where.
    fn set_aside(&mut self, of: &str, bytes: &[u8]) -> io::Result<PathBuf>;
    /// Removes temporary files a crash left.
    fn remove_stale_temps(&mut self);
}

/// The journal in a state directory.
#[derive(Debug)]
pub struct DirJournal {
    dir: PathBuf,
    path: PathBuf,
    /// Open for appending; dropped after a replace (the rename gave the name a new
    /// file) and after a failure.
    file: Option<File>,
}

impl DirJournal {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        Self {
            path: dir.join(JOURNAL_FILE),
            dir,
            file: None,
        }
    }

    fn open_for_append(&mut self) -> io::Result<&mut File> {
        if let Some(file) = &self.file
            && file.metadata()?.nlink() == 0
        {
            // Deleted under us: appending would write into a file nobody reads.
            self.file = None;
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} was removed while domaind held it", self.path.display()),
            ));
        }
        if self.file.is_none() {
            let file = OpenOptions::new()
                .append(true)
                .create(true)
                .mode(FILE_MODE)
                .open(&self.path)?;
            self.file = Some(file);
        }
        Ok(self.file.as_mut().expect("opened above"))
    }

    fn read_file(path: &Path) -> io::Result<Option<Vec<u8>>> {
        match fs::read(path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    fn prune_aside_copies(&self, prefix: &str) {
        let mut copies: Vec<((u128, u32), String)> = match fs::read_dir(&self.dir) {
            Ok(entries) => entries
                .filter_map(Result::ok)
                .filter_map(|entry| entry.file_name().into_string().ok())
                .filter_map(|name| Some((aside_copy_order(&name, prefix)?, name)))
                .collect(),
            Err(error) => {
                warn!(dir = %self.dir.display(), %error, "cannot list the checkpoint's set-aside copies");
                return;
            }
        };
        copies.sort();
        let excess = copies.len().saturating_sub(ASIDE_COPIES_KEPT);
        for (_, name) in copies.into_iter().take(excess) {
            if let Err(error) = fs::remove_file(self.dir.join(&name)) {
                warn!(file = %name, %error, "cannot delete an old set-aside checkpoint copy");
            }
        }
    }

    /// `<prefix><unix ms>`, with `-<n>` added when a copy of the same millisecond
    /// exists.
    fn free_aside_name(&self, prefix: &str) -> String {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis());
        let base = format!("{prefix}{now_ms}");
        (0u32..)
            .map(|n| match n {
                0 => base.clone(),
                n => format!("{base}-{n}"),
            })
            .find(|name| !self.dir.join(name).exists())
            .unwrap_or(base)
    }
}

impl Journal for DirJournal {
    fn path(&self) -> &Path {
        &self.path
    }

    fn read(&mut self) -> io::Result<Option<Vec<u8>>> {
        Self::read_file(&self.path)
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        let file = self.open_for_append()?;
        let written = file.write_all(bytes).and_then(|()| file.sync_data());
        if written.is_err() {
            self.file = None;
        }
        written
    }

    fn replace(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file = None;
        atomic::replace(&self.dir, JOURNAL_FILE, bytes, FILE_MODE)
    }

    fn set_aside(&mut self, of: &str, bytes: &[u8]) -> io::Result<PathBuf> {
        let prefix = aside_prefix(of);
        let name = self.free_aside_name(&prefix);
        atomic::replace(&self.dir, &name, bytes, FILE_MODE)?;
        self.prune_aside_copies(&prefix);
        Ok(self.dir.join(name))
    }

    fn remove_stale_temps(&mut self) {
        match atomic::remove_stale_temps(&self.dir, |name| atomic::is_temp_of(name, JOURNAL_FILE)) {
            Ok(removed) if removed.is_empty() => {}
            Ok(removed) => warn!(
                dir = %self.dir.display(),
                ?removed,
                "removed temporary checkpoint files left by an interrupted write"
            ),
            Err(error) => {
                warn!(dir = %self.dir.display(), %error, "cannot clean temporary checkpoint files")
            }
        }
    }
}

/// What set-aside copies of `of` are named after: `checkpoint.journal` gives
/// `checkpoint.journal.damaged-`.
pub fn aside_prefix(of: &str) -> String {
    format!("{of}.damaged-")
}

/// The age order of `<prefix><ms>[-<n>]`, or none for another file.
fn aside_copy_order(name: &str, prefix: &str) -> Option<(u128, u32)> {
    let rest = name.strip_prefix(prefix)?;
    let (ms, n) = match rest.split_once('-') {
        Some((ms, n)) => (ms, n.parse().ok()?),
        None => (rest, 0),
    };
    Some((ms.parse().ok()?, n))
}
