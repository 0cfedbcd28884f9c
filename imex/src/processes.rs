//! The IMEX daemons a `domaind run` supervises, found among the processes this one can
//! see, and `domaind imex kill`, which SIGKILLs them so that their `domaind run` must
//! start them again.
//!
//! An operator forces an IMEX restart this way, and so does the chaos harness on a
//! cluster: through `kubectl exec` into the node daemon's container, whose image has
//! no shell and no `kill`, only `domaind`. In that container the processes are the
//! node daemon and its children; on a machine running several daemons (the loopback
//! rack), `--parent` picks one.

use anyhow::bail;
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::procfs::Process;

/// What `domaind imex kill` starts each line it prints with, then the pid: the chaos
/// harness reads the pids back ([`parse_killed`]).
pub const KILLED_PREFIX: &str = "killed IMEX daemon ";

/// The IMEX daemon runs as `<sim or nvidia-imex> -c CONFIG` (`domaind imex-sim -c
/// CONFIG` when built in; for the moment between the fork and the exec, the guard
/// `domaind imex-guard --parent PID -- ... -c CONFIG`, which becomes it); queries run
/// `... ctl -c CONFIG -q`.
pub fn is_imex_daemon(args: &[String]) -> bool {
    args.iter().any(|a| a == "-c") && !args.iter().any(|a| a == "ctl")
}

/// The `domaind` process that keeps IMEX daemons as its children: `run` (IMEX in the
/// node daemon's container) or `imex-runner` (IMEX kept by the runner), from a command
/// line `domaind [global options] SUBCOMMAND ...`.
pub fn imex_keeper(args: &[String]) -> Option<&'static str> {
    let subcommand = domaind_subcommand(args)?;
    ["run", "imex-runner"]
        .into_iter()
        .find(|keeper| *keeper == subcommand)
}

/// Whether a command line is `domaind [global options] run ...`.
pub fn is_domaind_run(args: &[String]) -> bool {
    domaind_subcommand(args) == Some("run")
}

/// The subcommand of `domaind [global options] SUBCOMMAND ...`: the global options come
/// before it, each with its value (`--log info` or `--log=info`).
fn domaind_subcommand(args: &[String]) -> Option<&str> {
    let (program, rest) = args.split_first()?;
    if std::path::Path::new(program)
        .file_name()
        .is_none_or(|name| name != "domaind")
    {
        return None;
    }
    let mut rest = rest.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--log" | "--log-format" => {
                rest.next();
            }
            option if option.starts_with("--log=") || option.starts_with("--log-format=") => {}
            subcommand => return Some(subcommand),
        }
    }
    None
}

/// An IMEX daemon and the `domaind run` or `domaind imex-runner` it is a child of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImexProcess {
    pub pid: u32,
    pub parent: u32,
    /// The parent's subcommand: `run` or `imex-runner`.
    pub keeper: &'static str,
    pub command: String,
}

/// The IMEX daemons among `processes` that are children of a `domaind run` or
/// `domaind imex-runner` (of `parent` only, when given), not ended. An error says why
/// there is none: no such process (or `parent` is not one), or one that runs no IMEX
/// daemon now.
pub fn imex_daemons_of_run(
    processes: &[Process],
    parent: Option<u32>,
) -> anyhow::Result<Vec<ImexProcess>> {
    let runs: Vec<(&Process, &'static str)> = processes
        .iter()
        .filter(|p| !p.ended())
        .filter_map(|p| Some((p, imex_keeper(&p.args)?)))
        .filter(|(p, _)| parent.is_none_or(|pid| p.pid == pid))
        .collect();
    if runs.is_empty() {
        match parent {
            Some(pid) => match processes.iter().find(|p| p.pid == pid) {
                Some(p) => bail!(
                    "process {pid} is not a running `domaind run` or `domaind imex-runner` \
                     (its command line: {})",
                    p.args.join(" ")
                ),
                None => bail!("there is no process {pid}"),
            },
            None => bail!("no `domaind run` or `domaind imex-runner` process is visible from here"),
        }
    }
    let found: Vec<ImexProcess> = processes
        .iter()
        .filter(|p| !p.ended() && is_imex_daemon(&p.args))
        .filter_map(|p| {
            let (_, keeper) = runs.iter().find(|(run, _)| run.pid == p.parent)?;
            Some(ImexProcess {
                pid: p.pid,
                parent: p.parent,
                keeper,
                command: p.args.join(" "),
            })
        })
        .collect();
    if found.is_empty() {
        let pids: Vec<String> = runs
            .iter()
            .map(|(r, keeper)| format!("`domaind {keeper}` pid {}", r.pid))
            .collect();
        bail!(
            "no IMEX daemon runs under {}: one runs only while this node holds a \
             ComputeDomain, and may be waiting to restart",
            pids.join(", ")
        );
    }
    Ok(found)
}

/// SIGKILLs the IMEX daemons of `domaind run` (of `parent` only, when given); those it
/// killed. One that exited meanwhile is not counted; when none is left, an error.
pub fn kill_imex_daemons(parent: Option<u32>) -> anyhow::Result<Vec<ImexProcess>> {
    let targets = imex_daemons_of_run(&crate::procfs::processes()?, parent)?;
    let mut killed = Vec::new();
    for target in targets {
        match kill(Pid::from_raw(target.pid as i32), Signal::SIGKILL) {
            Ok(()) => killed.push(target),
            Err(Errno::ESRCH) => {}
            Err(error) => bail!("cannot kill IMEX daemon {}: {error}", target.pid),
        }
    }
    if killed.is_empty() {
        bail!("every IMEX daemon found had exited before it could be killed");
    }
    Ok(killed)
}

/// The line `domaind imex kill` prints for a daemon it killed.
pub fn killed_line(killed: &ImexProcess) -> String {
    format!(
        "{KILLED_PREFIX}{} (child of domaind {} {}): {}",
        killed.pid, killed.keeper, killed.parent, killed.command
    )
}

/// The pids of the lines of `domaind imex kill`'s output that say a daemon was killed.
pub fn parse_killed(output: &str) -> Vec<u32> {
    output
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix(KILLED_PREFIX))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    fn process(pid: u32, parent: u32, state: &str, line: &str) -> Process {
        Process {
            pid,
            parent,
            state: state.into(),
            args: args(line),
        }
    }

    #[test]
    fn daemon_and_queries_are_told_apart() {
        assert!(is_imex_daemon(&args("imex-sim -c /s/imex/config.cfg")));
        assert!(is_imex_daemon(&args("domaind imex-sim -c /s/config.cfg")));
        assert!(is_imex_daemon(&args(
            "domaind imex-guard --parent 7 -- /usr/bin/nvidia-imex -c /s/config.cfg"
        )));
        assert!(!is_imex_daemon(&args("imex-sim ctl -c /s/config.cfg -q")));
    }

    #[test]
    fn domaind_run_is_the_subcommand_after_global_options() {
        assert!(is_domaind_run(&args("domaind run --backend=kube")));
        assert!(is_domaind_run(&args(
            "/usr/local/bin/domaind --log info run"
        )));
        assert!(is_domaind_run(&args(
            "domaind --log=info --log-format=json run --backend=kube"
        )));
        assert!(is_domaind_run(&args(
            "domaind --log-format json --log run run"
        )));
        assert!(!is_domaind_run(&args("domaind imex kill")));
        assert!(!is_domaind_run(&args("domaind demo --nodes 4")));
        assert!(!is_domaind_run(&args("domaind --log run")));
        assert!(!is_domaind_run(&args("/usr/bin/other run")));
        assert!(!is_domaind_run(&[]));
    }

    fn machine() -> Vec<Process> {
        vec![
            process(1, 0, "S", "domaind --log=info run --backend=kube"),
            process(20, 1, "S", "/usr/bin/nvidia-imex -c /imex/config.cfg"),
            process(
                21,
                1,
                "S",
                "/usr/bin/nvidia-imex-ctl ctl -c /imex/config.cfg -q",
            ),
            process(30, 0, "S", "domaind --log info run --node-name b"),
            process(31, 30, "Z", "imex-sim -c /b/config.cfg"),
            process(32, 30, "R", "domaind imex-sim -c /b/config.cfg"),
            // Not under a `domaind run`: another supervisor's, or one started by hand.
            process(40, 0, "S", "bash"),
            process(41, 40, "S", "imex-sim -c /c/config.cfg"),
            process(50, 0, "S", "domaind demo"),
            process(51, 50, "S", "imex-sim -c /d/config.cfg"),
            // Kept by the IMEX runner.
            process(
                60,
                0,
                "S",
                "domaind --log=info imex-runner --socket /r/runner.sock",
            ),
            process(61, 60, "S", "nvidia-imex -c /e/config.cfg"),
        ]
    }

    fn pids(found: &[ImexProcess]) -> Vec<(u32, u32)> {
        found.iter().map(|p| (p.pid, p.parent)).collect()
    }

    #[test]
    fn only_live_daemons_under_a_domaind_run_are_found() {
        let found = imex_daemons_of_run(&machine(), None).unwrap();
        assert_eq!(pids(&found), [(20, 1), (32, 30), (61, 60)]);
        assert_eq!(found[2].keeper, "imex-runner");
        assert_eq!(found[0].command, "/usr/bin/nvidia-imex -c /imex/config.cfg");
    }

    #[test]
    fn parent_narrows_to_one_run() {
        let found = imex_daemons_of_run(&machine(), Some(30)).unwrap();
        assert_eq!(pids(&found), [(32, 30)]);
    }

    #[test]
    fn why_none_is_found_is_said() {
        let error =
            |procs: &[Process], parent| imex_daemons_of_run(procs, parent).unwrap_err().to_string();
        let not_run = error(&machine(), Some(40));
        assert!(
            not_run.contains("process 40 is not a running `domaind run` or `domaind imex-runner`"),
            "{not_run}"
        );
        assert!(not_run.contains("bash"), "{not_run}");
        assert_eq!(error(&machine(), Some(99)), "there is no process 99");
        let no_run = error(&machine()[6..10], None);
        assert_eq!(
            no_run,
            "no `domaind run` or `domaind imex-runner` process is visible from here"
        );
        let idle = error(&machine()[..1], None);
        assert!(
            idle.contains("no IMEX daemon runs under `domaind run` pid 1:"),
            "{idle}"
        );
        let zombie_only = error(&[machine()[3].clone(), machine()[4].clone()], None);
        assert!(
            zombie_only.contains("`domaind run` pid 30"),
            "{zombie_only}"
        );
    }

    #[test]
    fn printed_lines_are_read_back() {
        let killed = [
            ImexProcess {
                pid: 20,
                parent: 1,
                keeper: "run",
                command: "/usr/bin/nvidia-imex -c /imex/config.cfg".into(),
            },
            ImexProcess {
                pid: 4242,
                parent: 7,
                keeper: "imex-runner",
                command: "imex-sim -c /x".into(),
            },
        ];
        let output: String = killed.iter().map(|k| killed_line(k) + "\n").collect();
        assert_eq!(
            output.lines().next(),
            Some(
                "killed IMEX daemon 20 (child of domaind run 1): /usr/bin/nvidia-imex -c /imex/config.cfg"
            )
        );
        assert_eq!(parse_killed(&output), [20, 4242]);
        assert_eq!(
            parse_killed("some warning\r\nkilled IMEX daemon x\n"),
            Vec::<u32>::new()
        );
        assert_eq!(parse_killed("killed IMEX daemon 5\r\n"), [5]);
    }
}
