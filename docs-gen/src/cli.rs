//! A command line as a page, from clap's model of it: every visible command with its
//! usage and text, and every visible flag with its environment variable, default,
//! values and help. `--help` prints the same text; the page is for reading it all at
//! once and linking to it.

use std::fmt::Write as _;

use clap::{Arg, Command};

use crate::markdown::{anchor, code, prose};

/// The page of `root` and its subcommands.
pub fn render(mut root: Command) -> String {
    root.build();
    let name = root.get_name().to_owned();
    let mut out = format!("# `{name}` command line\n\n");
    out.push_str(
        "Every command also takes `-h` (a summary) and `--help` (this text). A flag with an \
         environment variable takes its value from it when not given.\n\n",
    );
    command(&mut out, &root, true);
    out
}

fn visible_subcommands(cmd: &Command) -> impl Iterator<Item = &Command> {
    cmd.get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
}

fn command(out: &mut String, cmd: &Command, root: bool) {
    let path = cmd.get_bin_name().unwrap_or(cmd.get_name()).to_owned();
    let _ = writeln!(out, "## `{path}`\n");
    if let Some(text) = cmd.get_long_about().or(cmd.get_about()) {
        paragraphs(out, &text.to_string(), "");
    }
    let usage = cmd.clone().render_usage().to_string();
    let usage = usage.strip_prefix("Usage: ").unwrap_or(&usage);
    let _ = writeln!(out, "```text\n{}\n```\n", usage.trim_end());

    let subcommands: Vec<&Command> = visible_subcommands(cmd).collect();
    if !subcommands.is_empty() {
        out.push_str("Commands:\n\n");
        for sub in &subcommands {
            let sub_path = format!("{path} {}", sub.get_name());
            let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
            let _ = writeln!(
                out,
                "- [`{}`](#{}): {}",
                sub.get_name(),
                anchor(&sub_path),
                prose(about.trim())
            );
        }
        out.push('\n');
    }

    let args: Vec<&Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        // Global flags are listed once, on the command that declares them.
        .filter(|a| root || !a.is_global_set())
        .collect();
    if !args.is_empty() {
        out.push_str(if args.iter().any(|a| a.is_positional()) {
            "Arguments and flags:\n\n"
        } else {
            "Flags:\n\n"
        });
        for arg in args {
            argument(out, arg);
        }
    }
    for sub in subcommands {
        command(out, sub, false);
    }
}

fn argument(out: &mut String, arg: &Arg) {
    let takes_values = arg.get_action().takes_values();
    let value_names = match arg.get_value_names() {
        Some(names) => names.iter().map(|n| format!("<{n}>")).collect::<Vec<_>>(),
        None => vec![format!("<{}>", arg.get_id().as_str().to_uppercase())],
    };
    let many = arg.get_num_args().is_some_and(|n| n.max_values() > 1);
    let values = format!("{}{}", value_names.join(" "), if many { "..." } else { "" });
    let spelled = if arg.is_positional() {
        values
    } else {
        let mut names = Vec::new();
        if let Some(short) = arg.get_short() {
            names.push(format!("-{short}"));
        }
        if let Some(long) = arg.get_long() {
            names.push(format!("--{long}"));
        }
        let mut spelled = names.join(", ");
        if takes_values {
            spelled.push(' ');
            spelled.push_str(&values);
        }
        spelled
    };

    let mut facts = vec![code(&spelled)];
    if arg.is_required_set() {
        facts.push("required".into());
    }
    if arg.is_global_set() {
        facts.push("global: also after the command".into());
    }
    if let Some(env) = arg.get_env().filter(|_| !arg.is_hide_env_set()) {
        facts.push(format!("env {}", code(&env.to_string_lossy())));
    }
    let defaults = arg.get_default_values();
    if takes_values && !defaults.is_empty() && !arg.is_hide_default_value_set() {
        let joined = defaults
            .iter()
            .map(|d| d.to_string_lossy())
            .collect::<Vec<_>>()
            .join(",");
        facts.push(format!(
            "default {}",
            if joined.is_empty() {
                "`\"\"`".into()
            } else {
                code(&joined)
            }
        ));
    }
    if takes_values && !arg.is_hide_possible_values_set() {
        let possible: Vec<String> = arg
            .get_possible_values()
            .into_iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| match v.get_help() {
                Some(help) => format!("{} ({})", code(v.get_name()), prose(&help.to_string())),
                None => code(v.get_name()),
            })
            .collect();
        if !possible.is_empty() {
            facts.push(format!("one of {}", possible.join(", ")));
        }
    }
    if let Some(aliases) = arg.get_visible_aliases() {
        let aliases: Vec<String> = aliases.iter().map(|a| code(&format!("--{a}"))).collect();
        facts.push(format!("also {}", aliases.join(", ")));
    }
    let _ = writeln!(out, "- {}\n", facts.join(" · "));
    if let Some(help) = arg.get_long_help().or(arg.get_help()) {
        paragraphs(out, &help.to_string(), "  ");
    }
}

/// `text`'s paragraphs (blank-line separated), each on one line, indented by `indent`.
fn paragraphs(out: &mut String, text: &str, indent: &str) {
    for paragraph in text.split("\n\n") {
        let paragraph = paragraph.split_whitespace().collect::<Vec<_>>().join(" ");
        if !paragraph.is_empty() {
            let _ = writeln!(out, "{indent}{}\n", prose(&paragraph));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{ArgAction, Parser, Subcommand, ValueEnum};

    /// A made-up tool: one of each kind of flag the page shows.
    #[derive(Debug, Parser)]
    #[command(name = "tool", about = "Does <things>.")]
    struct Tool {
        /// Shown once, on the root.
        #[arg(long, global = true, default_value = "info")]
        log: String,
        #[command(subcommand)]
        command: Sub,
    }

    #[derive(Debug, Clone, Copy, ValueEnum)]
    enum Mode {
        /// The usual one.
        Fast,
        Slow,
    }

    #[derive(Debug, Subcommand)]
    enum Sub {
        /// Runs it.
        ///
        /// Longer text: `--port` and
        /// more.
        Run {
            /// Where to listen.
            #[arg(long, env = "TOOL_PORT", default_value_t = 80)]
            port: u16,
            /// How.
            #[arg(long, value_enum, default_value_t = Mode::Fast)]
            mode: Mode,
            #[arg(long, action = ArgAction::SetTrue)]
            dry_run: bool,
            /// The input.
            file: std::path::PathBuf,
        },
        #[command(hide = true)]
        Secret,
    }

    #[test]
    fn commands_flags_env_defaults_and_values_are_listed_hidden_ones_are_not() {
        let page = render(<Tool as clap::CommandFactory>::command());
        assert!(page.starts_with("# `tool` command line\n"), "{page}");
        assert!(
            page.contains("## `tool`\n\nDoes &lt;things&gt;.\n"),
            "{page}"
        );
        // clap drops the period of a one-line help, in `--help` too.
        assert!(page.contains("- [`run`](#tool-run): Runs it\n"), "{page}");
        assert!(
            page.contains("## `tool run`\n\nRuns it.\n\nLonger text: `--port` and more.\n"),
            "{page}"
        );
        assert!(
            page.contains("```text\ntool run [OPTIONS] <FILE>\n```"),
            "{page}"
        );
        assert!(
            page.contains(
                "- `--port <PORT>` · env `TOOL_PORT` · default `80`\n\n  Where to listen\n"
            ),
            "{page}"
        );
        assert!(
            page.contains(
                "- `--mode <MODE>` · default `fast` · one of `fast` (The usual one), `slow`"
            ),
            "{page}"
        );
        assert!(page.contains("- `--dry-run`\n"), "{page}");
        assert!(
            page.contains("- `<FILE>` · required\n\n  The input\n"),
            "{page}"
        );
        assert!(
            page.contains("- `--log <LOG>` · global: also after the command · default `info`"),
            "{page}"
        );
        assert_eq!(page.matches("--log <LOG>").count(), 1, "{page}");
        assert!(!page.contains("secret"), "{page}");
        assert!(!page.contains("- `-h, --help`"), "{page}");
    }
}
