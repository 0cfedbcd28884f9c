//! Which nodes a cluster run takes, and what `--dry-run` prints: everything the run
//! would do, from read-only calls.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Context as _, bail};
use domaind_kube_api::names::CLIQUE_LABEL;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt as _};

use super::NodeChoice;
use super::workload::Workload;
use crate::schedule::Schedule;

/// What the choice needs to know of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    pub clique: Option<String>,
    pub ready: bool,
    pub schedulable: bool,
}

impl NodeFacts {
    pub fn of(node: &Node) -> Self {
        Self {
            name: node.name_any(),
            clique: node.labels().get(CLIQUE_LABEL).cloned(),
            ready: node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            schedulable: !node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
        }
    }
}

/// `count` Ready, schedulable nodes of one clique (the first, by clique id, that has
/// enough), by name: a ComputeDomain lives in one NVLink clique.
pub fn choose(candidates: &[NodeFacts], count: usize) -> anyhow::Result<Vec<String>> {
    let mut cliques: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for node in candidates.iter().filter(|n| n.ready && n.schedulable) {
        cliques
            .entry(node.clique.as_deref().unwrap_or(""))
            .or_default()
            .push(&node.name);
    }
    for names in cliques.values_mut() {
        names.sort_unstable();
    }
    if let Some(names) = cliques.values().find(|names| names.len() >= count) {
        return Ok(names[..count].iter().map(|n| (*n).to_owned()).collect());
    }
    let found: Vec<String> = cliques
        .iter()
        .map(|(clique, names)| {
            let clique = if clique.is_empty() {
                "(no clique label)"
            } else {
                clique
            };
            format!("{clique}: {}", names.len())
        })
        .collect();
    bail!(
        "no NVLink clique has {count} Ready, schedulable nodes among those selected \
         (Ready and schedulable per clique: {}); pass --nodes with fewer, or --node NAME for each",
        if found.is_empty() {
            "none".to_owned()
        } else {
            found.join(", ")
        }
    )
}

/// The run's nodes, from the API server (read only).
pub async fn resolve(client: &Client, choice: &NodeChoice) -> anyhow::Result<Vec<String>> {
    let nodes = Api::<Node>::all(client.clone());
    match choice {
        NodeChoice::Named(names) => {
            for name in names {
                let node = nodes
                    .get_opt(name)
                    .await
                    .with_context(|| format!("cannot read node {name}"))?
                    .with_context(|| format!("there is no node {name}"))?;
                let facts = NodeFacts::of(&node);
                if !facts.ready || !facts.schedulable {
                    bail!("node {name} is not Ready and schedulable");
                }
            }
            Ok(names.clone())
        }
        NodeChoice::Selected { selector, count } => {
            let list = nodes
                .list(&ListParams::default().labels(selector))
                .await
                .with_context(|| format!("cannot list the nodes matching {selector:?}"))?;
            let facts: Vec<NodeFacts> = list.items.iter().map(NodeFacts::of).collect();
            choose(&facts, *count).with_context(|| format!("nodes matching {selector:?}"))
        }
    }
}

/// What `--dry-run` prints.
pub fn describe(workload: &Workload, schedule: &Schedule, access: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "domaind-chaos run --cluster --dry-run: nothing is created"
    );
    let _ = writeln!(out, "nodes: {}", workload.nodes.join(", "));
    let _ = writeln!(out, "daemons and controller: {access}");
    let _ = writeln!(out, "\nwould create (then delete at the end):");
    let objects = [
        workload.namespace_object(),
        serde_json::to_value(workload.compute_domain()).unwrap_or_default(),
        workload.workload_object(),
    ];
    for object in objects {
        let _ = writeln!(out, "---");
        match serde_saphyr::to_string(&object) {
            Ok(yaml) => out.push_str(&yaml),
            Err(error) => {
                let _ = writeln!(out, "# cannot print as YAML: {error}");
            }
        }
    }
    let _ = writeln!(
        out,
        "\nfaults (seed {}, {} s; each waits for the previous one to heal):",
        schedule.seed,
        schedule.duration.as_secs()
    );
    for step in &schedule.steps {
        let targets: Vec<&str> = step
            .targets
            .iter()
            .map(|t| workload.nodes[*t].as_str())
            .collect();
        let _ = writeln!(
            out,
            "  at {:>6.1}s  {:<18} {}{}",
            step.at.as_secs_f64(),
            step.kind.name(),
            if targets.is_empty() {
                "(the controller)".to_owned()
            } else {
                targets.join(",")
            },
            if step.hold.is_zero() {
                String::new()
            } else {
                format!(" for {} ms", step.hold.as_millis())
            }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, clique: Option<&str>, ready: bool, schedulable: bool) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            clique: clique.map(str::to_owned),
            ready,
            schedulable,
        }
    }

    #[test]
    fn nodes_come_from_one_clique_ready_and_schedulable() {
        let nodes = [
            node("a-3", Some("a.1"), true, true),
            node("a-1", Some("a.1"), true, true),
            node("a-2", Some("a.1"), false, true),
            node("b-2", Some("b.1"), true, true),
            node("b-1", Some("b.1"), true, true),
            node("b-3", Some("b.1"), true, true),
            node("b-4", Some("b.1"), true, false),
        ];
        // Clique a.1 has two usable nodes: too few for three; b.1 has three.
        assert_eq!(choose(&nodes, 3).unwrap(), ["b-1", "b-2", "b-3"]);
        assert_eq!(choose(&nodes, 2).unwrap(), ["a-1", "a-3"]);
        let error = choose(&nodes, 4).unwrap_err().to_string();
        assert!(
            error.contains("a.1: 2") && error.contains("b.1: 3"),
            "{error}"
        );
        assert!(choose(&[], 2).unwrap_err().to_string().contains("none"));
    }
}
