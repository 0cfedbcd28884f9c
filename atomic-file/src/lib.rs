//! Replacing a file so that a reader, or the next start after a crash, sees either the
//! old content or the new, never a mix. The one writer of every file domaind keeps: the
//! checkpoint, CDI specs, IMEX config, TLS material, the GPU topology.
//!
//! A write goes to a temporary file in the target's own directory (a rename across
//! file systems is not atomic), is flushed to disk, renamed over the target, and the
//! directory is flushed so that the rename itself survives a power loss.
//!
//! Temporary files are named `.<target>.<random>.tmp`: hidden, and with an extension
//! that neither our loaders nor a CDI registry (which reads `*.json` and `*.yaml`)
//! would take for a real file.

use std::fs::{self, File, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

const TEMP_SUFFIX: &str = ".tmp";

fn temp_prefix(target: &str) -> String {
    format!(".{target}.")
}

/// Whether `name` is a temporary file left by a write of `target`.
pub fn is_temp_of(name: &str, target: &str) -> bool {
    name.strip_prefix(&temp_prefix(target))
        .and_then(|rest| rest.strip_suffix(TEMP_SUFFIX))
        .is_some_and(|random| !random.is_empty())
}

/// Directories this module creates: readable by all, as `/var/run/cdi` must be.
const DIR_MODE: u32 = 0o755;

/// Whether a write must survive a power loss, or only a crash of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Flushed to disk (file and directory) before the call returns.
    PowerLoss,
    /// Left in the page cache: readers and a restarted process see it, a reboot may
    /// not. For files that mean nothing after a reboot anyway.
    ProcessCrash,
}

/// Replaces `dir/target` with `bytes`, created with `mode` (before the umask), durably.
/// `dir` is created (mode 0755) if missing: a state directory may have been removed
/// under a running daemon.
pub fn replace(dir: &Path, target: &str, bytes: &[u8], mode: u32) -> io::Result<()> {
    replace_with(dir, target, bytes, mode, Durability::PowerLoss)
}

/// [`replace`] of the file at `path`.
pub fn replace_at(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let target = path
        .file_name()
        .and_then(|name| name.to_str())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} does not name a file", path.display()),
            )
        })?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    replace(dir, target, bytes, mode)
}

/// [`replace`], as durable as `durability` asks.
pub fn replace_with(
    dir: &Path,
    target: &str,
    bytes: &[u8],
    mode: u32,
    durability: Durability,
) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)?;
    let mut temp = tempfile::Builder::new()
        .prefix(&temp_prefix(target))
        .suffix(TEMP_SUFFIX)
        .permissions(Permissions::from_mode(mode))
        .tempfile_in(dir)?;
    temp.write_all(bytes)?;
    if durability == Durability::PowerLoss {
        temp.as_file().sync_all()?;
    }
    // On failure the temporary file is dropped, and so removed.
    temp.persist(dir.join(target))
        .map_err(|error| error.error)?;
    if durability == Durability::PowerLoss {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Removes `dir/target`, durably; a file that is already gone is not an error. Returns
/// whether there was one.
pub fn remove(dir: &Path, target: &str) -> io::Result<bool> {
    remove_with(dir, target, Durability::PowerLoss)
}

/// [`remove`], as durable as `durability` asks.
pub fn remove_with(dir: &Path, target: &str, durability: Durability) -> io::Result<bool> {
    match fs::remove_file(dir.join(target)) {
        Ok(()) => {
            if durability == Durability::PowerLoss {
                sync_dir(dir)?;
            }
            Ok(true)
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(error),
    }
}

/// Removes the temporary files that writes of any target `belongs` accepts left behind
/// (a crash between create and rename). Returns their names. Call it only while no
/// write of those targets is in flight: it would pull the file from under it.
pub fn remove_stale_temps(dir: &Path, belongs: impl Fn(&str) -> bool) -> io::Result<Vec<String>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !belongs(&name) || !entry.file_type()?.is_file() {
            continue;
        }
        match fs::remove_file(entry.path()) {
            Ok(()) => removed.push(name),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
    }
    if !removed.is_empty() {
        sync_dir(dir)?;
    }
    removed.sort();
    Ok(removed)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn replace_writes_the_target_with_its_mode_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        replace(dir.path(), "state.json", b"one", 0o600).unwrap();
        replace(dir.path(), "state.json", b"two", 0o600).unwrap();

        assert_eq!(fs::read(dir.path().join("state.json")).unwrap(), b"two");
        let mode = fs::metadata(dir.path().join("state.json")).unwrap().mode();
        assert_eq!(mode & 0o777, 0o600);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, ["state.json"]);
    }

    #[test]
    fn a_failed_replace_leaves_the_target_and_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        // A non-empty directory in the target's place makes the rename fail after the
        // temporary file has been written.
        fs::create_dir(dir.path().join("state.json")).unwrap();
        fs::write(dir.path().join("state.json/x"), b"kept").unwrap();

        assert!(replace(dir.path(), "state.json", b"new", 0o600).is_err());

        assert_eq!(fs::read(dir.path().join("state.json/x")).unwrap(), b"kept");
        let temps = remove_stale_temps(dir.path(), |name| is_temp_of(name, "state.json")).unwrap();
        assert!(temps.is_empty(), "the failed write left {temps:?}");
    }

    #[test]
    fn temp_names_are_recognised_per_target() {
        assert!(is_temp_of(".state.json.a1B2c3.tmp", "state.json"));
        assert!(!is_temp_of(".state.json..tmp", "state.json"));
        assert!(!is_temp_of("state.json", "state.json"));
        assert!(!is_temp_of(".state.json.a1B2c3.tmp", "other.json"));
        assert!(!is_temp_of(".state.json.a1B2c3", "state.json"));
    }

    #[test]
    fn stale_temps_of_other_targets_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".state.json.x1.tmp"), b"half").unwrap();
        fs::write(dir.path().join(".other.json.x2.tmp"), b"theirs").unwrap();

        let removed =
            remove_stale_temps(dir.path(), |name| is_temp_of(name, "state.json")).unwrap();

        assert_eq!(removed, [".state.json.x1.tmp"]);
        assert!(dir.path().join(".other.json.x2.tmp").exists());
    }

    #[test]
    fn replace_at_writes_the_named_file_and_refuses_a_path_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/key.pem");
        replace_at(&path, b"secret", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"secret");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);

        let error = replace_at(Path::new("/"), b"x", 0o600).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn removing_a_missing_file_is_fine() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!remove(dir.path(), "gone.json").unwrap());
        fs::write(dir.path().join("here.json"), b"").unwrap();
        assert!(remove(dir.path(), "here.json").unwrap());
        assert!(!dir.path().join("here.json").exists());
    }
}
