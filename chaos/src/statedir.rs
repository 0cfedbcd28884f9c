//! The `disk-full` fault's ground: as root, a small tmpfs mounted over each node's
//! state directory before its daemon first starts, so that the fault can fill one (a
//! file taking all its space) and free it again, without touching the machine's disks
//! or waiting on them.
//!
//! The tmpfs holds the whole state directory, IMEX's config and hosts file with it
//! (`--imex-config-dir` defaults to `<state dir>/imex`): a full `/var/lib/domaind` on a
//! real node fills both, and that is the fault. It lives as long as the rack, so kills
//! and restarts keep their checkpoints as on a disk.
//!
//! Mounts are named `domaind-chaos-<pid>` after the harness that made them. They are
//! unmounted when the value is dropped (end of run, Ctrl-C, a panic), after the rack's
//! daemons are gone and before its directory is removed; one left by a harness killed
//! with SIGKILL is unmounted by the next run that mounts, since its pid is gone.

use std::fs::OpenOptions;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

/// The size of each node's state directory: far above what a daemon keeps there (a
/// checkpoint of a few claims, run.json, IMEX's three small files), small enough that
/// filling it costs nothing.
pub const STATE_DIR_SIZE: u64 = 8 << 20;
/// What fills a state directory.
pub const FILL_FILE: &str = "domaind-chaos-fill";
const SOURCE_PREFIX: &str = "domaind-chaos-";

/// The tmpfs mounts of one run.
#[derive(Debug)]
pub struct StateDirs {
    source: String,
    mounted: Vec<PathBuf>,
}

impl StateDirs {
    /// Mounts a tmpfs over each of `dirs` (created if missing), or says why not: not
    /// root, or no tmpfs here.
    pub fn mount(dirs: &[PathBuf]) -> Result<Self, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err(
                "not root: disk-full mounts a tmpfs over a node's state directory (run as root)"
                    .into(),
            );
        }
        remove_leftovers();
        let mut mounts = Self {
            source: format!("{SOURCE_PREFIX}{}", std::process::id()),
            mounted: Vec::new(),
        };
        for dir in dirs {
            // On failure the mounts made so far go with `mounts`.
            mounts.mount_one(dir).map_err(|error| {
                format!("cannot mount a tmpfs over a state directory: {error:#}")
            })?;
        }
        Ok(mounts)
    }

    fn mount_one(&mut self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let options = format!("size={STATE_DIR_SIZE},mode=0755");
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &options, &self.source])
            .arg(dir))?;
        self.mounted.push(dir.to_owned());
        Ok(())
    }

    /// Fills `dir` (one of the mounted directories) until the file system has no room
    /// left; the bytes it took.
    pub fn fill(&self, dir: &Path) -> anyhow::Result<u64> {
        if !self.mounted.iter().any(|m| m == dir) {
            bail!("{} is not a state directory of this run", dir.display());
        }
        let path = dir.join(FILL_FILE);
        let mut file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        // Big writes first, then small ones for the last pages: a partial page left
        // free would let a small checkpoint through.
        let mut written = 0u64;
        for chunk in [64 * 1024, 512] {
            let bytes = vec![0u8; chunk];
            // Bounded by the file system's size, whatever write answers.
            for _ in 0..=STATE_DIR_SIZE / chunk as u64 {
                match file.write(&bytes) {
                    Ok(0) => break,
                    Ok(n) => written += n as u64,
                    Err(error) if is_full(&error) => break,
                    Err(error) => {
                        return Err(error)
                            .with_context(|| format!("cannot fill {}", path.display()));
                    }
                }
            }
        }
        let free = nix::sys::statvfs::statvfs(dir)
            .map(|s| s.blocks_available() * s.fragment_size())
            .with_context(|| format!("cannot ask {} for its free space", dir.display()))?;
        if free > 0 {
            bail!(
                "{} still has {free} bytes free after the fill",
                dir.display()
            );
        }
        Ok(written)
    }

    /// Removes what [`Self::fill`] wrote.
    pub fn free(&self, dir: &Path) -> anyhow::Result<()> {
        let path = dir.join(FILL_FILE);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(error).with_context(|| format!("cannot remove {}", path.display())),
        }
    }

    /// The mounted directories.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.mounted
    }
}

impl Drop for StateDirs {
    fn drop(&mut self) {
        for dir in self.mounted.drain(..).rev() {
            unmount(&dir);
        }
    }
}

fn is_full(error: &io::Error) -> bool {
    error.raw_os_error() == Some(nix::errno::Errno::ENOSPC as i32)
}

fn run(command: &mut Command) -> anyhow::Result<()> {
    let out = command
        .output()
        .with_context(|| format!("cannot run {:?}", command.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} failed: {}",
            command,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Unmounts `dir`; lazily if something still holds it (a process not yet reaped), so
/// that the rack's directory can be removed in any case.
fn unmount(dir: &Path) {
    if run(Command::new("umount").arg(dir)).is_err() {
        let _ = run(Command::new("umount").arg("-l").arg(dir));
    }
}

/// Unmounts tmpfs mounts of harnesses that are gone.
fn remove_leftovers() {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    for (point, owner) in leftover_mounts(&table) {
        if !Path::new("/proc").join(owner.to_string()).exists() {
            unmount(&point);
        }
    }
}

/// Our tmpfs mounts in a mountinfo table: mount point and the pid of the harness that
/// made it.
fn leftover_mounts(mountinfo: &str) -> Vec<(PathBuf, u32)> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let point = before.split(' ').nth(4)?;
            let mut fields = after.split(' ');
            let (kind, source) = (fields.next()?, fields.next()?);
            let owner = source.strip_prefix(SOURCE_PREFIX)?.parse().ok()?;
            (kind == "tmpfs").then(|| (PathBuf::from(point), owner))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_tmpfs_mounts_are_leftovers() {
        let table = "\
22 1 0:21 / / rw,relatime - ext4 /dev/vda rw
42 22 0:39 / /tmp/dchAb12/node-01/state rw,relatime - tmpfs domaind-chaos-4242 rw,size=8192k
43 22 0:40 / /tmp/other rw,relatime - tmpfs tmpfs rw
44 22 0:41 / /tmp/x rw,relatime - ext4 domaind-chaos-17 rw
45 22 0:42 / /tmp/y rw,relatime - tmpfs domaind-chaos-notapid rw
";
        assert_eq!(
            leftover_mounts(table),
            vec![(PathBuf::from("/tmp/dchAb12/node-01/state"), 4242)]
        );
    }

    /// As root: mounted, filled to the last byte, freed, and unmounted when dropped.
    #[test]
    fn a_state_directory_fills_frees_and_unmounts() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("node-01").join("state");
        let mounts = match StateDirs::mount(std::slice::from_ref(&dir)) {
            Ok(mounts) => mounts,
            Err(reason) => {
                eprintln!("skipped: {reason}");
                return;
            }
        };
        std::fs::write(dir.join("checkpoint.json"), b"{}").unwrap();
        let filled = mounts.fill(&dir).unwrap();
        assert!(filled > STATE_DIR_SIZE / 2, "{filled}");
        let error = std::fs::write(dir.join("more"), vec![0u8; 4096]).unwrap_err();
        assert!(is_full(&error), "{error}");
        mounts.free(&dir).unwrap();
        std::fs::write(dir.join("more"), vec![0u8; 4096]).unwrap();
        drop(mounts);
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            !table.contains(&dir.display().to_string()),
            "still mounted: {table}"
        );
        // What was written on the tmpfs went with it.
        assert!(!dir.join("checkpoint.json").exists());
    }
}
