//! A generated page against the committed one: the test fails, naming the command that
//! writes the page again, or writes it when asked to.

use std::path::{Path, PathBuf};

/// Set to `1`, the tests write the pages instead of comparing them.
pub const WRITE_VAR: &str = "DOMAIND_WRITE_REFERENCE";

/// docs/src/reference/ of this checkout.
pub fn reference_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/reference")
}

/// The page's text: a mark (not shown in the book) that says it is generated and by
/// what, then `body`.
pub fn render(regenerate: &str, body: &str) -> String {
    format!(
        "<!-- Generated from the code by `{regenerate}`; do not edit. -->\n\n{}\n",
        body.trim_end()
    )
}

/// Compares `text` with the committed page `name` of docs/src/reference/; with
/// [`WRITE_VAR`]`=1`, writes it there instead. The error says what differs and the
/// command `regenerate` that brings the page up to date.
pub fn check(name: &str, text: &str, regenerate: &str) -> Result<(), String> {
    let path = reference_dir().join(name);
    let shown = format!("docs/src/reference/{name}");
    if std::env::var(WRITE_VAR).is_ok_and(|v| v == "1") {
        std::fs::write(&path, text).map_err(|e| format!("cannot write {shown}: {e}"))?;
        return Ok(());
    }
    let committed = match std::fs::read_to_string(&path) {
        Ok(committed) => committed,
        Err(error) => {
            return Err(format!(
                "cannot read {shown} ({error}); write it with `{regenerate}`"
            ));
        }
    };
    match first_difference(&committed, text) {
        None => Ok(()),
        Some((line, was, now)) => Err(format!(
            "{shown} is not what the code generates (line {line}: the page has {was:?}, the \
             code gives {now:?}); it is generated, not edited: run `{regenerate}` and commit \
             the result"
        )),
    }
}

/// The first line (1-based) where `a` and `b` differ, with each side's line.
fn first_difference(a: &str, b: &str) -> Option<(usize, String, String)> {
    let mut left = a.lines();
    let mut right = b.lines();
    let mut line = 0;
    loop {
        line += 1;
        match (left.next(), right.next()) {
            (None, None) => {
                return (a.ends_with('\n') != b.ends_with('\n'))
                    .then(|| (line, "(end)".into(), "(end)".into()));
            }
            (l, r) if l == r => {}
            (l, r) => {
                let shown = |s: Option<&str>| s.map_or("(end)".into(), str::to_owned);
                return Some((line, shown(l), shown(r)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_differing_line_is_named() {
        assert_eq!(first_difference("a\nb\n", "a\nb\n"), None);
        assert_eq!(
            first_difference("a\nb\nc\n", "a\nB\nc\n"),
            Some((2, "b".into(), "B".into()))
        );
        assert_eq!(
            first_difference("a\n", "a\nb\n"),
            Some((2, "(end)".into(), "b".into()))
        );
    }

    #[test]
    fn a_page_says_it_is_generated_and_how() {
        let text = render("make it", "# Title\n\nbody\n\n");
        assert_eq!(
            text,
            "<!-- Generated from the code by `make it`; do not edit. -->\n\n# Title\n\nbody\n"
        );
    }
}
