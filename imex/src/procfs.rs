//! Reading a process's `/proc/<pid>/stat` line and command line, and listing the
//! processes this one can see.

use std::str::SplitWhitespace;

use anyhow::Context as _;

/// The fields of a `/proc/<pid>/stat` line after the command name: state, parent
/// pid, and on. The command name (field 2) is in parentheses and may itself hold
/// spaces and parentheses, so fields are counted from the last ')'.
pub fn fields_after_command(stat: &str) -> Option<SplitWhitespace<'_>> {
    Some(stat[stat.rfind(')')? + 1..].split_whitespace())
}

/// The arguments of a NUL-separated `/proc/<pid>/cmdline`.
pub fn command_line_args(cmdline: &[u8]) -> impl Iterator<Item = &[u8]> {
    cmdline.split(|b| *b == 0).filter(|arg| !arg.is_empty())
}

/// A process as `/proc` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    pub parent: u32,
    /// The state letter of its stat line: `R`, `S`, `Z`, ...
    pub state: String,
    pub args: Vec<String>,
}

impl Process {
    /// A zombie or dead process: signals no longer reach anything.
    pub fn ended(&self) -> bool {
        matches!(self.state.as_str(), "Z" | "X" | "x")
    }
}

/// Every process this one can see, by one pass over `/proc` (Linux).
pub fn processes() -> anyhow::Result<Vec<Process>> {
    let mut found = Vec::new();
    let entries = std::fs::read_dir("/proc").context("cannot list /proc")?;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // A process may exit between the listing and the read: skip it.
        let Some((state, parent)) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|stat| state_and_parent(&stat))
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args = command_line_args(&cmdline)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        found.push(Process {
            pid,
            parent,
            state,
            args,
        });
    }
    Ok(found)
}

/// The parent pid in a `/proc/<pid>/stat` line.
pub fn parent_of(stat: &str) -> Option<u32> {
    state_and_parent(stat).map(|(_, parent)| parent)
}

fn state_and_parent(stat: &str) -> Option<(String, u32)> {
    let mut fields = fields_after_command(stat)?;
    let state = fields.next()?.to_owned();
    Some((state, fields.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_start_after_the_last_parenthesis() {
        let mut fields = fields_after_command("42 (a) b (c) S 9 1 1").unwrap();
        assert_eq!(fields.next(), Some("S"));
        assert_eq!(fields.next(), Some("9"));
        assert!(fields_after_command("garbage").is_none());
    }

    #[test]
    fn arguments_are_split_at_nul() {
        let args: Vec<&[u8]> = command_line_args(b"imex-sim\0-c\0/s/config.cfg\0").collect();
        assert_eq!(args, [&b"imex-sim"[..], b"-c", b"/s/config.cfg"]);
        assert_eq!(command_line_args(b"").count(), 0);
    }

    #[test]
    fn parent_and_state_are_read_after_the_command_name() {
        assert_eq!(parent_of("42 (imex-sim) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parent_of("42 (a) b (c) S 9 1 1"), Some(9));
        assert_eq!(parent_of("garbage"), None);
        assert_eq!(
            state_and_parent("42 (imex-sim) Z 7 42"),
            Some(("Z".to_owned(), 7))
        );
    }

    #[test]
    fn this_process_is_listed_with_its_parent() {
        let me = std::process::id();
        let parent = parent_of(&std::fs::read_to_string("/proc/self/stat").unwrap()).unwrap();
        let found = processes().unwrap();
        assert!(
            found
                .iter()
                .any(|p| p.pid == me && p.parent == parent && !p.args.is_empty() && !p.ended()),
            "{found:?}"
        );
    }
}
