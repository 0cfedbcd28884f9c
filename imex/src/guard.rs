//! `domaind imex-guard --parent PID -- PROGRAM ARGS...`: what the IMEX daemon is
//! started through, so that it dies with the domaind that started it, even when that
//! domaind is SIGKILLed and runs no destructor.
//!
//! The guard is the freshly forked child, still running our binary. It asks the
//! kernel for SIGKILL when its parent dies (`PR_SET_PDEATHSIG`), then checks that its
//! parent is still `PID`: a domaind killed between the fork and the `prctl` has
//! already handed the child to init, and the signal would never come. Then it execs
//! the daemon, which keeps the parent-death signal (exec clears it only for
//! set-user-ID, set-group-ID or file-capability programs) and the pid: the daemon is
//! the guard, not a child of it, so signals, exit status and output need no relay.
//!
//! Why a guard and not `pre_exec`: setting the signal between fork and exec in the
//! parent's image needs `unsafe`, which the workspace denies outside the NVML fabric
//! bindings. Our own binary, started afresh, runs safe code only.
//!
//! The signal follows the *thread* that forked, not the process: the kernel sends it
//! when that thread exits. So the adapter forks from a thread of its own that lives as
//! long as the adapter ([`super::spawner`]), never from a pool thread that may end
//! while the daemon runs.

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::process::ExitCode;

use nix::sys::signal::Signal;
use nix::unistd::getppid;

/// The hidden subcommand of `domaind` that runs the guard.
pub const SUBCOMMAND: &str = "imex-guard";

const USAGE: &str = "usage: domaind imex-guard --parent PID -- PROGRAM [ARGS...]";

/// What the guard was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardArgs {
    /// The domaind that spawned the guard, whose death must end the daemon.
    pub parent: i32,
    pub program: OsString,
    pub args: Vec<OsString>,
}

/// Parses the guard's command line (`args` without the program name and subcommand).
pub fn parse(args: &[OsString]) -> Result<GuardArgs, String> {
    let [flag, pid, separator, program, rest @ ..] = args else {
        return Err(format!("too few arguments\n{USAGE}"));
    };
    if flag != "--parent" || separator != "--" {
        return Err(format!("unexpected arguments\n{USAGE}"));
    }
    let parent = pid
        .to_str()
        .and_then(|p| p.parse::<i32>().ok())
        .filter(|p| *p > 1)
        .ok_or_else(|| format!("--parent takes a process id, not {pid:?}\n{USAGE}"))?;
    Ok(GuardArgs {
        parent,
        program: program.clone(),
        args: rest.to_vec(),
    })
}

/// The command line that runs `program args` through the guard `guard` (our binary
/// and its subcommand), for the domaind of pid `parent`.
pub fn command_line(
    guard: &super::Command,
    parent: u32,
    program: &std::path::Path,
    args: &[OsString],
) -> (std::path::PathBuf, Vec<OsString>) {
    let mut line: Vec<OsString> = guard.args.iter().map(OsString::from).collect();
    line.extend(["--parent".into(), parent.to_string().into(), "--".into()]);
    line.push(program.as_os_str().to_owned());
    line.extend(args.iter().cloned());
    (guard.program.clone(), line)
}

/// The IMEX daemon's command, `PROGRAM ARGS... -c CONFIG` with `env`: through the
/// guard `guard` when given, for this process as the parent whose death ends it; in a
/// process group of its own either way, so that a signal meant for its starter's group
/// (a terminal's Ctrl-C) does not reach it: the starter stops it. Output piped, for
/// the starter to follow; killed if the handle is dropped before it is watched.
pub fn daemon_command(
    guard: Option<&super::Command>,
    program: &std::path::Path,
    args: &[String],
    config: &std::path::Path,
    env: &[(String, String)],
) -> tokio::process::Command {
    let mut daemon_args: Vec<OsString> = args.iter().map(Into::into).collect();
    daemon_args.push("-c".into());
    daemon_args.push(config.as_os_str().to_owned());
    let (program, line) = match guard {
        Some(guard) => command_line(guard, std::process::id(), program, &daemon_args),
        None => (program.to_path_buf(), daemon_args),
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(line)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    command
}

/// Runs the guard: returns only when the daemon could not be started.
pub fn main(args: &[OsString]) -> ExitCode {
    let guard = match parse(args) {
        Ok(guard) => guard,
        Err(error) => {
            eprintln!("domaind imex-guard: {error}");
            return ExitCode::from(2);
        }
    };
    if let Err(error) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        eprintln!(
            "domaind imex-guard: cannot ask for a parent-death signal ({error}); not starting \
             the IMEX daemon, which could outlive domaind"
        );
        return ExitCode::FAILURE;
    }
    // After the prctl: a parent that dies from here on sends the signal.
    let parent = getppid().as_raw();
    if parent != guard.parent {
        eprintln!(
            "domaind imex-guard: domaind (pid {}) is gone (the parent is now pid {parent}); \
             not starting the IMEX daemon",
            guard.parent
        );
        return ExitCode::FAILURE;
    }
    let error = std::process::Command::new(&guard.program)
        .args(&guard.args)
        .exec();
    eprintln!(
        "domaind imex-guard: cannot run the IMEX daemon {}: {error} (is the NVIDIA IMEX \
         package installed? the binary path is configurable; imex-sim stands in for it \
         without GPUs)",
        std::path::Path::new(&guard.program).display()
    );
    ExitCode::from(127)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_command_line_names_the_parent_and_the_daemon() {
        let parsed = parse(&os(&[
            "--parent",
            "4242",
            "--",
            "/usr/bin/nvidia-imex",
            "-c",
            "/s/config.cfg",
        ]))
        .unwrap();
        assert_eq!(parsed.parent, 4242);
        assert_eq!(parsed.program, "/usr/bin/nvidia-imex");
        assert_eq!(parsed.args, os(&["-c", "/s/config.cfg"]));
    }

    #[test]
    fn a_bad_command_line_is_refused_with_the_reason() {
        for (bad, says) in [
            (vec!["--parent", "4242"], "too few"),
            (vec!["--parent", "x", "--", "imex"], "process id"),
            (vec!["--parent", "1", "--", "imex"], "process id"),
            (vec!["--parent", "0", "--", "imex"], "process id"),
            (vec!["--pid", "7", "--", "imex"], "unexpected"),
            (vec!["--parent", "7", "imex", "-c"], "unexpected"),
        ] {
            let error = parse(&os(&bad)).unwrap_err();
            assert!(error.contains(says), "{bad:?}: {error}");
        }
    }

    #[test]
    fn what_the_adapter_runs_parses_back() {
        let guard = super::super::Command::new("/bin/domaind").arg(SUBCOMMAND);
        let (program, args) = command_line(
            &guard,
            77,
            std::path::Path::new("/bin/imex-sim"),
            &os(&["-c", "/s/config.cfg"]),
        );
        assert_eq!(program, std::path::Path::new("/bin/domaind"));
        assert_eq!(args[0], SUBCOMMAND);
        let parsed = parse(&args[1..]).unwrap();
        assert_eq!(
            parsed,
            GuardArgs {
                parent: 77,
                program: "/bin/imex-sim".into(),
                args: os(&["-c", "/s/config.cfg"]),
            }
        );
    }
}
