//! Text from the code (doc comments, help, YAML comments) made safe for a markdown page:
//! it is written for a terminal, where `<clusterUUID>` or `*` mean themselves.

/// `text` as markdown prose: outside code spans, `<` and `>` become entities (markdown
/// would take `<node>` for an HTML tag and show nothing) and `*` is escaped (it would
/// start emphasis).
pub fn prose(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_code = false;
    for c in text.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                out.push(c);
            }
            '<' if !in_code => out.push_str("&lt;"),
            '>' if !in_code => out.push_str("&gt;"),
            '*' if !in_code => out.push_str("\\*"),
            _ => out.push(c),
        }
    }
    out
}

/// `text` as one table cell: prose on one line, its pipes escaped (in code spans too,
/// which a table's row splits on all the same).
pub fn cell(text: &str) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    prose(&one_line).replace('|', "\\|")
}

/// `text` as a code span, whatever backticks it holds.
pub fn code(text: &str) -> String {
    if text.contains('`') {
        format!("`` {text} ``")
    } else {
        format!("`{text}`")
    }
}

/// A table with `headers`; the cells are taken as they are (see [`cell`]).
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("| {} |\n", headers.join(" | "));
    out.push_str(&format!("|{}\n", "---|".repeat(headers.len())));
    for row in rows {
        assert_eq!(row.len(), headers.len(), "a row of {} cells", row.len());
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out
}

/// The id mdBook gives a heading of `text`: lower case, spaces as `-`, only letters,
/// digits, `-` and `_` kept.
pub fn anchor(text: &str) -> String {
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn angle_brackets_and_stars_show_as_written_outside_code() {
        assert_eq!(
            prose("joins `<a>.<b>` or <none>, 2 * 3"),
            "joins `<a>.<b>` or &lt;none&gt;, 2 \\* 3"
        );
    }

    #[test]
    fn a_cell_is_one_line_with_its_pipes_escaped() {
        assert_eq!(cell("a\n  b `x|y`"), "a b `x\\|y`");
    }

    #[test]
    fn anchors_are_as_mdbook_makes_them() {
        assert_eq!(anchor("`domaind certs init`"), "domaind-certs-init");
        assert_eq!(anchor("Events and conditions"), "events-and-conditions");
    }
}
