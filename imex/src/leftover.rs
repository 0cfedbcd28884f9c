//! IMEX daemons of ours that are not our child: left running by a domaind that died
//! without stopping them.
//!
//! A daemon is started through the guard ([`super::guard`]) and dies with the domaind
//! that started it, so normally there is none. This is the second line, for what the
//! guard cannot cover: a daemon started by a domaind older than the guard, or a
//! process started by hand with our config.
//!
//! What makes a daemon ours is what it holds, not a record written after its start
//! (a pid file written after the fork can always be cut off by a SIGKILL, which is how
//! issue 15's orphan escaped): its command line ends with `-c <our config>`, the one
//! form the adapter starts it in (status queries pass more after the config, so they
//! never match), the path resolved against the process's own working directory. A
//! starting adapter scans `/proc` for such processes, and when IMEX's port is taken,
//! looks at whoever holds it ([`super::holders`]). Anything else is never touched.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::time::{Instant, sleep};
use tracing::{info, warn};

use crate::procfs;

/// Counts leftover IMEX daemons stopped.
pub const IMEX_LEFTOVERS: &str = "domaind_imex_leftovers_stopped_total";

/// How often a stopping leftover is checked for having gone.
const EXIT_POLL: Duration = Duration::from_millis(20);

/// The config path a command line runs the IMEX daemon with: its last two arguments
/// are `-c PATH`.
pub fn daemon_config_arg(cmdline: &[u8]) -> Option<&OsStr> {
    let args: Vec<&[u8]> = procfs::command_line_args(cmdline).collect();
    match args.as_slice() {
        [.., flag, path] if *flag == b"-c" => Some(OsStr::from_bytes(path)),
        _ => None,
    }
}

/// A path as the process named it, resolved against its working directory, then
/// through the file system where it exists; as written otherwise.
fn resolve(path: &Path, cwd: Option<&Path>) -> Option<PathBuf> {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd?.join(path)
    };
    Some(std::fs::canonicalize(&joined).unwrap_or(joined))
}

/// Whether a process with this command line and working directory runs the IMEX
/// daemon on `config` (resolved against our own working directory).
pub fn runs_config(cmdline: &[u8], cwd: Option<&Path>, config: &Path) -> bool {
    let Some(named) = daemon_config_arg(cmdline) else {
        return false;
    };
    let ours = std::env::current_dir().ok();
    match (
        resolve(Path::new(named), cwd),
        resolve(config, ours.as_deref()),
    ) {
        (Some(named), Some(config)) => named == config,
        _ => false,
    }
}

/// Whether a `/proc/<pid>/stat` line says the process has ended (a zombie, or dead).
pub fn stat_says_ended(stat: &str) -> bool {
    procfs::fields_after_command(stat)
        .and_then(|mut fields| fields.next())
        .is_some_and(|state| matches!(state, "Z" | "X" | "x"))
}

fn running(pid: i32) -> bool {
    if matches!(kill(Pid::from_raw(pid), None), Err(Errno::ESRCH)) {
        return false;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat_says_ended(&stat))
        .unwrap_or(false)
}

/// Whether process `pid` is a running IMEX daemon on `config`, and not this process.
pub fn is_ours(pid: i32, config: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    if daemon_config_arg(&cmdline).is_none() || pid == std::process::id() as i32 || !running(pid) {
        return false;
    }
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
    runs_config(&cmdline, cwd.as_deref(), config)
}

/// Every running IMEX daemon on `config`, by one pass over `/proc`.
pub fn find(config: &Path) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| is_ours(*pid, config))
        .collect()
}

/// Stops `pids` (leftovers of ours): SIGTERM, up to `stop_timeout`, then SIGKILL;
/// each is counted and logged, saying how it was found (`how`).
pub async fn stop_pids(pids: &[i32], stop_timeout: Duration, how: &str) {
    if pids.is_empty() {
        return;
    }
    for pid in pids {
        info!(
            pid,
            how, "stopping an IMEX daemon that no running domaind owns"
        );
        metrics::counter!(IMEX_LEFTOVERS).increment(1);
        let _ = kill(Pid::from_raw(*pid), Signal::SIGTERM);
    }
    let deadline = Instant::now() + stop_timeout;
    while pids.iter().any(|pid| running(*pid)) && Instant::now() < deadline {
        sleep(EXIT_POLL).await;
    }
    for pid in pids.iter().filter(|pid| running(**pid)) {
        warn!(pid, timeout = ?stop_timeout, "the leftover IMEX daemon ignored SIGTERM; killing it");
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    // SIGKILL cannot be ignored, but the process is gone only once the kernel has
    // torn it down and released its sockets; the bound guards against a stuck one.
    let deadline = Instant::now() + stop_timeout;
    while pids.iter().any(|pid| running(*pid)) && Instant::now() < deadline {
        sleep(EXIT_POLL).await;
    }
}

/// Stops every IMEX daemon on `config` that is not our child (a starting adapter has
/// none). Returns their pids.
pub async fn stop(config: &Path, stop_timeout: Duration) -> Vec<i32> {
    let found = find(config);
    stop_pids(&found, stop_timeout, "its command line names our config").await;
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemon_is_told_by_the_config_it_ends_with() {
        let config = b"/var/lib/domaind/imex/config.cfg";
        let arg = |cmdline: &[u8]| daemon_config_arg(cmdline).map(|a| a.as_bytes().to_vec());
        let ours = b"/usr/bin/nvidia-imex\0-c\0/var/lib/domaind/imex/config.cfg\0";
        assert_eq!(arg(ours).as_deref(), Some(&config[..]));
        let guarded = b"domaind\0imex-guard\0--parent\x004242\0--\0imex-sim\0-c\0/var/lib/domaind/imex/config.cfg\0";
        assert_eq!(arg(guarded).as_deref(), Some(&config[..]));
        // Status queries pass more after the config.
        let query = b"nvidia-imex-ctl\0-c\0/var/lib/domaind/imex/config.cfg\0-q\0";
        assert_eq!(arg(query), None);
        let sim_query = b"imex-sim\0ctl\0-c\0/var/lib/domaind/imex/config.cfg\0-N\0-j\0";
        assert_eq!(arg(sim_query), None);
        assert_eq!(
            arg(b"sleep\0/var/lib/domaind/imex/config.cfg\0"),
            None,
            "a reused pid running something else"
        );
        assert_eq!(arg(b""), None);
    }

    #[test]
    fn a_config_is_the_same_file_however_it_was_named() {
        let dir = tempfile::tempdir().unwrap();
        let imex = dir.path().join("state/imex");
        std::fs::create_dir_all(&imex).unwrap();
        let config = imex.join("config.cfg");
        std::fs::write(&config, "").unwrap();
        let line = |path: &str| format!("nvidia-imex\0-c\0{path}\0").into_bytes();

        assert!(runs_config(
            &line(&config.display().to_string()),
            None,
            &config
        ));
        // Relative to the process's working directory, as a daemon run by hand with
        // `--state-dir state` names it.
        assert!(runs_config(
            &line("state/imex/config.cfg"),
            Some(dir.path()),
            &config
        ));
        assert!(runs_config(
            &line("./state/../state/imex/config.cfg"),
            Some(dir.path()),
            &config
        ));
        // Relative, with no working directory to read: not ours.
        assert!(!runs_config(&line("state/imex/config.cfg"), None, &config));
        // Another node's config, in the same rack.
        let other = dir.path().join("other/imex/config.cfg");
        assert!(!runs_config(
            &line(&other.display().to_string()),
            None,
            &config
        ));
        // A config that does not exist (yet) compares as written.
        let missing = dir.path().join("fresh/imex/config.cfg");
        assert!(runs_config(
            &line(&missing.display().to_string()),
            None,
            &missing
        ));
    }

    #[test]
    fn the_state_is_read_after_the_command_name() {
        assert!(!stat_says_ended("4242 (nvidia-imex) S 1 4242 4242 0 -1"));
        assert!(stat_says_ended("4242 (nvidia-imex) Z 1 4242 4242 0 -1"));
        assert!(!stat_says_ended("4242 (a) Z (b)) R 1 2 3"));
        assert!(!stat_says_ended("garbage"));
    }

    #[test]
    fn this_process_is_never_ours() {
        let me = std::process::id() as i32;
        assert!(!is_ours(me, Path::new("/nonexistent/config.cfg")));
    }
}
