//! An IMEX daemon left running by a domaind that died without stopping it.
//!
//! In a pod the container's end takes the child with it, and under systemd the unit's
//! cgroup does. Anywhere else (a daemon run by hand, a supervisor that only signals
//! the main process), a SIGKILLed domaind leaves its IMEX daemon behind, still bound
//! to the IMEX ports and serving the old peer set: the next domaind's IMEX would fail
//! to start over and over. So the running daemon's pid is kept beside its config, and
//! a starting adapter stops the process it names first.
//!
//! A pid alone could by now belong to anything; the process is only touched when its
//! command line still names our config file (`-c <config_dir>/config.cfg`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::time::{Instant, sleep};
use tracing::{info, warn};

use crate::procfs;

/// Counts leftover IMEX daemons stopped at start-up.
pub const IMEX_LEFTOVERS: &str = "domaind_imex_leftovers_stopped_total";

const PID_FILE: &str = "imex.pid";
/// How often a stopping leftover is checked for having gone.
const EXIT_POLL: Duration = Duration::from_millis(20);

pub fn pid_path(config_dir: &Path) -> PathBuf {
    config_dir.join(PID_FILE)
}

/// Records the pid of the daemon just started.
pub fn record(config_dir: &Path, pid: u32) -> std::io::Result<()> {
    crate::atomic_file::replace(config_dir, PID_FILE, format!("{pid}\n").as_bytes(), 0o644)
}

/// Forgets the daemon: it was stopped, or it exited.
pub fn forget(config_dir: &Path) {
    match std::fs::remove_file(pid_path(config_dir)) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => warn!(%error, "cannot remove the IMEX pid file"),
    }
}

/// The pid a pid file names, if it names one.
pub fn parse_pid(text: &str) -> Option<i32> {
    text.trim().parse::<i32>().ok().filter(|pid| *pid > 1)
}

/// Whether a process's NUL-separated command line passes `-c <config>`.
pub fn names_config(cmdline: &[u8], config: &Path) -> bool {
    let config = config.as_os_str().as_encoded_bytes();
    let args: Vec<&[u8]> = procfs::command_line_args(cmdline).collect();
    args.windows(2)
        .any(|pair| pair[0] == b"-c" && pair[1] == config)
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

/// Stops the daemon a previous domaind left, if one still runs with our config: SIGTERM,
/// up to `stop_timeout`, then SIGKILL. Returns its pid when there was one.
pub async fn stop(config_dir: &Path, config: &Path, stop_timeout: Duration) -> Option<i32> {
    let text = std::fs::read_to_string(pid_path(config_dir)).ok()?;
    let Some(pid) = parse_pid(&text) else {
        warn!(file = %pid_path(config_dir).display(), "ignoring an unreadable IMEX pid file");
        forget(config_dir);
        return None;
    };
    let ours = std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|cmdline| names_config(&cmdline, config));
    if !ours || !running(pid) {
        forget(config_dir);
        return None;
    }
    info!(
        pid,
        "stopping the IMEX daemon a previous domaind left running"
    );
    metrics::counter!(IMEX_LEFTOVERS).increment(1);
    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    let deadline = Instant::now() + stop_timeout;
    while running(pid) && Instant::now() < deadline {
        sleep(EXIT_POLL).await;
    }
    if running(pid) {
        warn!(pid, timeout = ?stop_timeout, "the leftover IMEX daemon ignored SIGTERM; killing it");
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    forget(config_dir);
    Some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_file_names_one_process_or_none() {
        assert_eq!(parse_pid("4242\n"), Some(4242));
        assert_eq!(parse_pid(" 77 "), Some(77));
        for bad in ["", "x", "-5", "0", "1", "12 13"] {
            assert_eq!(parse_pid(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn only_a_process_run_with_our_config_is_ours() {
        let config = Path::new("/var/lib/domaind/imex/config.cfg");
        let ours = b"/usr/bin/nvidia-imex\0-c\0/var/lib/domaind/imex/config.cfg\0";
        assert!(names_config(ours, config));
        let other = b"/usr/bin/nvidia-imex\0-c\0/etc/nvidia-imex/config.cfg\0";
        assert!(!names_config(other, config));
        let reused = b"sleep\0/var/lib/domaind/imex/config.cfg\0";
        assert!(!names_config(reused, config));
        assert!(!names_config(b"", config));
    }

    #[test]
    fn the_state_is_read_after_the_command_name() {
        assert!(!stat_says_ended("4242 (nvidia-imex) S 1 4242 4242 0 -1"));
        assert!(stat_says_ended("4242 (nvidia-imex) Z 1 4242 4242 0 -1"));
        assert!(!stat_says_ended("4242 (a) Z (b)) R 1 2 3"));
        assert!(!stat_says_ended("garbage"));
    }
}
