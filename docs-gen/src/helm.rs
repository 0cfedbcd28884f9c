//! The Helm chart's values as a page: every key of values.yaml with its default and the
//! comment above it, which is where the chart documents its values.
//!
//! The comment directly above a key (no blank line between) is the key's. A map is
//! listed key by key, unless it has a comment and none of its keys has one: then it is
//! one value (`nodeSelector`, `labels`), shown whole as its default.

use crate::markdown::{cell, code, table};

/// The chart's values.yaml of this checkout.
pub fn values_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/domaind/values.yaml")
}

/// A key of the file, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    path: Vec<String>,
    comment: String,
}

/// The page of values.yaml's text.
pub fn render(values_yaml: &str) -> Result<String, String> {
    let keys = keys(values_yaml)?;
    let values: serde_json::Value =
        serde_saphyr::from_str(values_yaml).map_err(|e| format!("values.yaml: {e}"))?;
    let commented_below = |key: &Key| {
        keys.iter().any(|k| {
            k.path.len() > key.path.len() && k.path.starts_with(&key.path) && !k.comment.is_empty()
        })
    };
    let mut rows = Vec::new();
    let mut whole: Vec<&[String]> = Vec::new();
    for key in &keys {
        if whole.iter().any(|w| key.path.starts_with(w)) {
            continue;
        }
        let value = key
            .path
            .iter()
            .try_fold(&values, |v, segment| v.get(segment))
            .ok_or_else(|| format!("values.yaml: {} has no value", key.path.join(".")))?;
        let section = value.as_object().is_some_and(|m| !m.is_empty())
            && (key.comment.is_empty() || commented_below(key));
        if section {
            if !key.comment.is_empty() {
                rows.push(vec![
                    code(&key.path.join(".")),
                    String::new(),
                    cell(&key.comment),
                ]);
            }
            continue;
        }
        if value.is_object() {
            whole.push(&key.path);
        }
        let default = serde_json::to_string(value).map_err(|e| e.to_string())?;
        rows.push(vec![
            code(&key.path.join(".")),
            code(&default),
            cell(&key.comment),
        ]);
    }
    Ok(format!(
        "# Helm values\n\n\
         The values of the chart in `deploy/helm/domaind/`, as `helm show values` prints \
         them with their comments. A key with no default is a group of the keys below it. \
         Defaults are written as JSON.\n\n{}",
        table(&["key", "default", "what it is"], &rows)
    ))
}

/// Every key of a block-style YAML file, with its comment. List items and what is
/// nested in them belong to the list's key, not listed apart.
fn keys(text: &str) -> Result<Vec<Key>, String> {
    let mut keys = Vec::new();
    let mut comment: Vec<&str> = Vec::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut list_item: Option<usize> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.is_empty() {
            comment.clear();
            continue;
        }
        if let Some(text) = trimmed.strip_prefix('#') {
            comment.push(text.trim());
            continue;
        }
        if list_item.is_some_and(|at| indent > at) {
            continue;
        }
        list_item = None;
        if trimmed == "-" || trimmed.starts_with("- ") {
            list_item = Some(indent);
            comment.clear();
            continue;
        }
        let Some(name) = key_of(trimmed) else {
            return Err(format!(
                "values.yaml line {}: neither a key, a list item nor a comment: {line}",
                n + 1
            ));
        };
        while stack.last().is_some_and(|(at, _)| *at >= indent) {
            stack.pop();
        }
        stack.push((indent, name));
        keys.push(Key {
            path: stack.iter().map(|(_, k)| k.clone()).collect(),
            comment: comment.join(" "),
        });
        comment.clear();
    }
    Ok(keys)
}

/// The key of a `key: value` or `key:` line, unquoted.
fn key_of(line: &str) -> Option<String> {
    let end = line
        .char_indices()
        .find(|&(i, c)| c == ':' && line[i + 1..].chars().next().is_none_or(|n| n == ' '))?
        .0;
    let key = line[..end].trim();
    let unquoted = key
        .strip_prefix('"')
        .and_then(|k| k.strip_suffix('"'))
        .unwrap_or(key);
    (!unquoted.is_empty()).then(|| unquoted.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALUES: &str = "\
# The file's own comment, not a key's.

# The driver.
driverName: x.example.com

image:
  repository: domaind
  # Empty: the chart's version.
  tag: \"\"
node:
  # Where it runs.
  nodeSelector:
    nvidia.com/gpu.present: \"true\"
  tolerations:
    - key: nvidia.com/gpu
      operator: Exists
  # Peers.
  seeds:
    # apiServer or static.
    mode: apiServer
    url: https://example.com/a:b
";

    #[test]
    fn keys_have_the_comment_right_above_them_and_list_items_are_no_keys() {
        let keys = keys(VALUES).unwrap();
        let shown: Vec<(String, &str)> = keys
            .iter()
            .map(|k| (k.path.join("."), k.comment.as_str()))
            .collect();
        assert_eq!(
            shown,
            [
                ("driverName".into(), "The driver."),
                ("image".into(), ""),
                ("image.repository".into(), ""),
                ("image.tag".into(), "Empty: the chart's version."),
                ("node".into(), ""),
                ("node.nodeSelector".into(), "Where it runs."),
                ("node.nodeSelector.nvidia.com/gpu.present".into(), ""),
                ("node.tolerations".into(), ""),
                ("node.seeds".into(), "Peers."),
                ("node.seeds.mode".into(), "apiServer or static."),
                ("node.seeds.url".into(), ""),
            ]
        );
    }

    #[test]
    fn a_commented_map_without_commented_keys_is_one_value() {
        let page = render(VALUES).unwrap();
        let rows: Vec<&str> = page.lines().filter(|l| l.starts_with("| `")).collect();
        assert_eq!(
            rows,
            [
                "| `driverName` | `\"x.example.com\"` | The driver. |",
                "| `image.repository` | `\"domaind\"` |  |",
                "| `image.tag` | `\"\"` | Empty: the chart's version. |",
                "| `node.nodeSelector` | `{\"nvidia.com/gpu.present\":\"true\"}` | Where it runs. |",
                "| `node.tolerations` | `[{\"key\":\"nvidia.com/gpu\",\"operator\":\"Exists\"}]` |  |",
                "| `node.seeds` |  | Peers. |",
                "| `node.seeds.mode` | `\"apiServer\"` | apiServer or static. |",
                "| `node.seeds.url` | `\"https://example.com/a:b\"` |  |",
            ]
        );
    }

    #[test]
    fn a_line_that_is_no_key_is_an_error() {
        assert!(render("a: 1\njust text\n").is_err());
    }

    #[test]
    fn reference_pages_match_the_code() {
        let text = std::fs::read_to_string(values_path()).unwrap();
        let page = crate::page::render(
            "DOMAIND_WRITE_REFERENCE=1 cargo test -p domaind-docs-gen --lib reference_pages",
            &render(&text).unwrap(),
        );
        if let Err(error) = crate::page::check(
            "helm-values.md",
            &page,
            "DOMAIND_WRITE_REFERENCE=1 cargo test -p domaind-docs-gen --lib reference_pages",
        ) {
            panic!("{error}");
        }
    }
}
