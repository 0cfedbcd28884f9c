//! The chart's dashboard and alerts stay true to the code and the docs: every `domaind_*`
//! metric they name is one the code records, every alert links to a runbook anchor that
//! docs/OPERATIONS.md has, and each alert says what it is. Every metric the code records
//! is on the book's metrics page.
//!
//! The code has no single registry of metric names (each module keeps its own
//! constants), so the names are collected by scanning the crates' `src/` for string
//! literals that start with `domaind_`, tests left out. (The rendered objects are checked
//! on a real API server by tests/e2e/helm_chart.py.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn dashboard_path() -> PathBuf {
    root().join("deploy/helm/domaind/dashboards/domaind.json")
}

fn rule_path() -> PathBuf {
    root().join("deploy/helm/domaind/templates/prometheusrule.yaml")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "tests" {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

/// `domaind_[a-z0-9_]+` tokens of `text`; with `quoted`, only those that open a string
/// literal.
fn metric_tokens(text: &str, quoted: bool) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("domaind_") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let word_start = !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if word_start && (!quoted || before == Some('"')) {
            found.insert(tail[..len].to_owned());
        }
        rest = &tail[len..];
    }
    found
}

/// Every metric name the crates' code records (string literals `"domaind_..."` in
/// `*/src/`, tests left out).
fn code_metrics() -> BTreeSet<String> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(root()).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join("Cargo.toml").is_file() {
            rust_files(&dir.join("src"), &mut files);
        }
    }
    let names: BTreeSet<String> = files
        .iter()
        .flat_map(|f| metric_tokens(&read(f), true))
        .collect();
    assert!(
        names.len() > 30,
        "the scan found too few metrics: {names:?}"
    );
    names
}

/// What a query names, with Prometheus' series suffixes of histograms and summaries
/// taken back to the metric the code records.
fn unknown_metrics(named: &BTreeSet<String>, code: &BTreeSet<String>) -> Vec<String> {
    named
        .iter()
        .filter(|name| {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .filter(|base| code.contains(*base));
            base.is_none() && !code.contains(*name)
        })
        .cloned()
        .collect()
}

fn dashboard() -> Value {
    serde_json::from_str(&read(&dashboard_path())).expect("the dashboard is JSON")
}

fn dashboard_queries() -> Vec<String> {
    dashboard()["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn every_metric_the_dashboard_and_alerts_name_is_recorded_by_the_code() {
    let code = code_metrics();
    let mut named: BTreeSet<String> = dashboard_queries()
        .iter()
        .flat_map(|q| metric_tokens(q, false))
        .collect();
    let from_dashboard = named.len();
    named.extend(metric_tokens(&read(&rule_path()), false));
    assert!(from_dashboard >= 10, "{named:?}");
    let unknown = unknown_metrics(&named, &code);
    assert!(
        unknown.is_empty(),
        "named by the dashboard or the alerts but recorded nowhere in the code: {unknown:?}"
    );
}

/// The book's metrics page is generated from the metrics' descriptions (a test of the
/// daemon's keeps it so): a metric the code records with no description is missing there.
#[test]
fn every_metric_the_code_records_is_described_in_the_reference() {
    let page = read(&root().join("docs/src/reference/metrics.md"));
    let listed = metric_tokens(&page, false);
    let missing: Vec<String> = code_metrics()
        .into_iter()
        .filter(|m| !listed.contains(m))
        .collect();
    assert!(
        missing.is_empty(),
        "recorded by the code but not on docs/src/reference/metrics.md: {missing:?}; give each \
         a description (`describe_counter!` and the like, in its crate's describe function) \
         and write the page again (its first line says how)"
    );
}

#[test]
fn a_metric_the_code_lacks_is_found_and_series_suffixes_are_not() {
    let code: BTreeSet<String> = ["domaind_a_seconds".to_owned()].into();
    let named = metric_tokens(
        "rate(domaind_a_seconds_count[5m]) / domaind_a_seconds_sum + domaind_b_total \
         + xdomaind_c",
        false,
    );
    assert_eq!(unknown_metrics(&named, &code), ["domaind_b_total"]);
    assert_eq!(
        metric_tokens(r#"const A: &str = "domaind_x_total"; // domaind_y"#, true),
        ["domaind_x_total".to_owned()].into()
    );
}

#[test]
fn every_dashboard_panel_queries_something_and_ids_are_unique() {
    let dash = dashboard();
    let panels = dash["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    for panel in panels {
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "duplicate id: {panel}"
        );
        if panel["type"] != "row" {
            let targets = panel["targets"].as_array().unwrap();
            assert!(!targets.is_empty(), "no query: {}", panel["title"]);
            for target in targets {
                assert_eq!(target["datasource"]["uid"], "${datasource}", "{target}");
            }
        }
    }
    // The datasource is the user's choice, not a name of ours.
    assert_eq!(dash["templating"]["list"][0]["name"], "datasource");
}

/// GitHub's anchor of a Markdown heading: lower case, punctuation but `-` and `_`
/// dropped, spaces to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn operations_anchors() -> BTreeSet<String> {
    read(&root().join("docs/OPERATIONS.md"))
        .lines()
        .filter_map(|line| line.strip_prefix('#'))
        .map(|heading| anchor(heading.trim_start_matches('#')))
        .collect()
}

#[test]
fn every_alert_says_what_it_is_and_links_to_a_runbook_that_exists() {
    let rule = read(&rule_path());
    let alerts: Vec<&str> = rule
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert_eq!(
        alerts,
        [
            "DomaindComputeDomainNotReady",
            "DomaindImexCrashLooping",
            "DomaindGossipRefusing",
            "DomaindApiRequestsFailing",
            "DomaindCertificateExpiring",
        ]
    );
    for key in [
        "summary:",
        "description:",
        "runbook_url:",
        "severity:",
        "for:",
    ] {
        let count = rule.lines().filter(|l| l.trim().starts_with(key)).count();
        assert_eq!(count, alerts.len(), "every alert has one {key}");
    }
    let anchors = operations_anchors();
    let links: Vec<&str> = rule
        .lines()
        .filter(|l| l.trim().starts_with("runbook_url:"))
        .map(|l| {
            let start = l.find('#').expect("a runbook link names an anchor") + 1;
            l[start..].trim_end_matches(['"', '}', ' ', '$'])
        })
        .map(|a| a.split('"').next().unwrap())
        .collect();
    for (alert, link) in alerts.iter().zip(&links) {
        assert_eq!(*link, alert.to_lowercase(), "{alert}'s runbook anchor");
        assert!(
            anchors.contains(*link),
            "docs/OPERATIONS.md has no heading with anchor #{link} (for {alert})"
        );
    }
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(
        anchor(" DomaindImexCrashLooping"),
        "domaindimexcrashlooping"
    );
    assert_eq!(
        anchor("A pod hangs in `ContainerCreating`"),
        "a-pod-hangs-in-containercreating"
    );
    assert_eq!(
        anchor("Moving over from NVIDIA's driver"),
        "moving-over-from-nvidias-driver"
    );
}
