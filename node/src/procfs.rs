//! Reading a process's `/proc/<pid>/stat` line and command line.

use std::str::SplitWhitespace;

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
}
