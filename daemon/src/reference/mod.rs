//! The book's reference pages that this binary's code defines (docs/src/reference/):
//! its command line, the metrics of its two processes, and the events and conditions
//! they write. Each test renders a page and fails when the committed one differs;
//! `DOMAIND_WRITE_REFERENCE=1` writes it instead (`domaind_docs_gen::page`).

mod events;

use clap::CommandFactory as _;
use domaind_docs_gen::metrics::{Described, described, render_table};
use domaind_docs_gen::page;

const REGENERATE: &str =
    "DOMAIND_WRITE_REFERENCE=1 cargo test -p domaind --bin domaind reference_pages";

fn check(name: &str, body: &str) {
    let text = page::render(REGENERATE, body);
    if let Err(error) = page::check(name, &text, REGENERATE) {
        panic!("{error}");
    }
}

#[test]
fn reference_pages_match_the_code_cli() {
    check(
        "cli.md",
        &domaind_docs_gen::cli::render(crate::cli::Cli::command()),
    );
}

#[test]
fn reference_pages_match_the_code_metrics() {
    check("metrics.md", &metrics_page());
}

#[test]
fn reference_pages_match_the_code_events() {
    check("events.md", &events::page());
}

/// The metrics of the node daemon and of the controller, those both record apart.
fn metrics_page() -> String {
    let node = described(domaind_node::describe_metrics).unwrap_or_else(|e| panic!("{e}"));
    let controller =
        described(domaind_controller::describe_metrics).unwrap_or_else(|e| panic!("{e}"));
    let in_other = |m: &Described, other: &[Described]| other.iter().any(|o| o == m);
    let both: Vec<Described> = node
        .iter()
        .filter(|m| in_other(m, &controller))
        .cloned()
        .collect();
    let node_only: Vec<Described> = node
        .iter()
        .filter(|m| !in_other(m, &both))
        .cloned()
        .collect();
    let controller_only: Vec<Described> = controller
        .iter()
        .filter(|m| !in_other(m, &both))
        .cloned()
        .collect();
    format!(
        "# Metrics\n\n\
         What each process serves on `/metrics`, with the help text it gives there: the node \
         daemon on the node's IP, the controller on its pod's (ports: the Helm values \
         `node.httpPort` and `controller.httpPort`, see [Helm values](helm-values.md)). \
         Labels are named in the text. Histograms are served as summaries (quantiles 0, 0.5, \
         0.9, 0.95, 0.99, 0.999 and 1).\n\n\
         ## Both processes\n\n{}\n\
         ## Node daemon (`domaind run`)\n\n{}\n\
         ## Controller (`domaind controller`)\n\n{}",
        render_table(&both),
        render_table(&node_only),
        render_table(&controller_only),
    )
}
