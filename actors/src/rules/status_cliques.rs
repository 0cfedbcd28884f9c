//! A ComputeDomain whose pods span NVLink cliques: each clique is a gossip cluster of
//! its own with a reporter of its own, and one status document lists them all.
//!
//! Each clique's reporter owns its clique's rows of `status.nodes` (a list keyed by
//! node name, so rows of different writers merge). The domain-wide fields (phase,
//! counts, the `Ready` condition) are computed from every clique's rows: from its own
//! document and the other cliques' rows as last read. Every reporter computes them
//! alike from the same rows, so the last write is right once every clique's rows are
//! in; a reporter that sees another clique's rows change writes again.
//!
//! With one clique nothing is merged: the document is the reporter's own, with its
//! detailed reasons (lost nodes, slots, IMEX failing).

use std::collections::BTreeSet;

use crate::model::Phase;
use crate::rules::status::{DomainStatus, NodeStatus};

/// Names of not-ready nodes the merged message lists before "and N more".
const NOT_READY_NAMED: usize = 8;

/// The rows of `written` that are `clique`'s: what this clique's reporter wrote, as a
/// document of its own (counts and phase over those rows). A reporter taking over
/// compares its view with this, not with other cliques' nodes it can never see.
pub fn clique_part(written: &DomainStatus, clique: &str) -> DomainStatus {
    if written.nodes.iter().all(|n| n.clique_id == clique) {
        return written.clone();
    }
    let nodes: Vec<NodeStatus> = written
        .nodes
        .iter()
        .filter(|n| n.clique_id == clique)
        .cloned()
        .collect();
    let ready = nodes.iter().filter(|n| n.status == Phase::Ready).count();
    DomainStatus {
        status: if !nodes.is_empty() && ready == nodes.len() {
            Phase::Ready
        } else {
            Phase::NotReady
        },
        ready_nodes: ready as u32,
        total_nodes: nodes.len() as u32,
        message: format!("{ready}/{} nodes ready", nodes.len()),
        nodes,
        channel: written.channel,
    }
}

/// The rows of `written` that other cliques' reporters own: not `clique`'s, and not
/// listed in `mine` (a node that moved here from another clique is this clique's now).
pub fn other_cliques_rows(
    written: &DomainStatus,
    clique: &str,
    mine: &DomainStatus,
) -> Vec<NodeStatus> {
    let listed: BTreeSet<&str> = mine.nodes.iter().map(|n| n.name.as_str()).collect();
    written
        .nodes
        .iter()
        .filter(|n| n.clique_id != clique && !listed.contains(n.name.as_str()))
        .cloned()
        .collect()
}

/// The document a clique's reporter writes: `mine` with the `others` rows of other
/// cliques. Ready when every row is ready and there are at least `num_nodes` of them
/// (`spec.numNodes` counts the whole domain, not one clique).
pub fn merged(mine: &DomainStatus, others: &[NodeStatus], num_nodes: u32) -> DomainStatus {
    if others.is_empty() {
        return mine.clone();
    }
    let mut nodes: Vec<NodeStatus> = mine.nodes.iter().chain(others).cloned().collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let not_ready: Vec<&str> = nodes
        .iter()
        .filter(|n| n.status != Phase::Ready)
        .map(|n| n.name.as_str())
        .collect();
    let total = nodes.len();
    let ready = total - not_ready.len();
    let cliques: BTreeSet<&str> = nodes.iter().map(|n| n.clique_id.as_str()).collect();
    let enough = num_nodes == 0 || total as u64 >= u64::from(num_nodes);
    let mut message = format!(
        "{ready}/{total} nodes ready in {} NVLink cliques",
        cliques.len()
    );
    if !enough {
        message.push_str(&format!(", waiting for {num_nodes} nodes (spec.numNodes)"));
    }
    if !not_ready.is_empty() {
        message.push_str(", not ready: ");
        message.push_str(&not_ready[..not_ready.len().min(NOT_READY_NAMED)].join(", "));
        if not_ready.len() > NOT_READY_NAMED {
            message.push_str(&format!(" and {} more", not_ready.len() - NOT_READY_NAMED));
        }
    }
    DomainStatus {
        status: if not_ready.is_empty() && enough {
            Phase::Ready
        } else {
            Phase::NotReady
        },
        ready_nodes: ready as u32,
        total_nodes: total as u32,
        message,
        nodes,
        channel: mine.channel,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, clique: &str, status: Phase) -> NodeStatus {
        NodeStatus {
            name: name.into(),
            ip_address: "10.0.0.1".into(),
            clique_id: clique.into(),
            index: Some(0),
            status,
        }
    }

    fn document(rows: Vec<NodeStatus>, status: Phase, message: &str) -> DomainStatus {
        let ready = rows.iter().filter(|n| n.status == Phase::Ready).count() as u32;
        DomainStatus {
            status,
            ready_nodes: ready,
            total_nodes: rows.len() as u32,
            message: message.into(),
            nodes: rows,
            channel: None,
        }
    }

    #[test]
    fn one_clique_is_the_reporters_own_document() {
        let mine = document(
            vec![
                row("a1", "c.a", Phase::Ready),
                row("a2", "c.a", Phase::NotReady),
            ],
            Phase::NotReady,
            "1/2 nodes ready, lost: a2",
        );
        assert_eq!(merged(&mine, &[], 4), mine);
        assert_eq!(clique_part(&mine, "c.a"), mine);
        assert!(other_cliques_rows(&mine, "c.a", &mine).is_empty());
    }

    #[test]
    fn two_cliques_ready_are_the_whole_domain_ready() {
        // Each clique alone is short of numNodes; together they are not.
        let mine = document(
            vec![
                row("a1", "c.a", Phase::Ready),
                row("a2", "c.a", Phase::Ready),
            ],
            Phase::NotReady,
            "2/2 nodes ready, waiting for 4 nodes (spec.numNodes)",
        );
        let others = [
            row("b1", "c.b", Phase::Ready),
            row("b2", "c.b", Phase::Ready),
        ];
        let whole = merged(&mine, &others, 4);
        assert_eq!(whole.status, Phase::Ready);
        assert_eq!((whole.ready_nodes, whole.total_nodes), (4, 4));
        assert_eq!(whole.message, "4/4 nodes ready in 2 NVLink cliques");
        let names: Vec<&str> = whole.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a1", "a2", "b1", "b2"]);
    }

    #[test]
    fn any_clique_not_ready_or_too_few_nodes_is_not_ready_and_says_who() {
        let mine = document(
            vec![row("a1", "c.a", Phase::Ready)],
            Phase::Ready,
            "1/1 nodes ready",
        );
        let others: Vec<NodeStatus> = (1..=10)
            .map(|i| row(&format!("b{i:02}"), "c.b", Phase::NotReady))
            .collect();
        let whole = merged(&mine, &others, 0);
        assert_eq!(whole.status, Phase::NotReady);
        assert_eq!(
            whole.message,
            "1/11 nodes ready in 2 NVLink cliques, not ready: b01, b02, b03, b04, b05, \
             b06, b07, b08 and 2 more"
        );
        let few = merged(&mine, &[row("b1", "c.b", Phase::Ready)], 3);
        assert_eq!(few.status, Phase::NotReady);
        assert_eq!(
            few.message,
            "2/2 nodes ready in 2 NVLink cliques, waiting for 3 nodes (spec.numNodes)"
        );
    }

    #[test]
    fn every_clique_computes_the_same_domain_wide_fields_from_the_same_rows() {
        let a = vec![
            row("a1", "c.a", Phase::Ready),
            row("a2", "c.a", Phase::NotReady),
        ];
        let b = vec![row("b1", "c.b", Phase::Ready)];
        let from_a = merged(&document(a.clone(), Phase::NotReady, "a's words"), &b, 3);
        let from_b = merged(&document(b, Phase::Ready, "b's words"), &a, 3);
        assert_eq!(from_a, from_b);
    }

    #[test]
    fn a_clique_reads_back_its_own_rows_and_the_others_apart() {
        let written = document(
            vec![
                row("a1", "c.a", Phase::Ready),
                row("b1", "c.b", Phase::Ready),
                row("b2", "c.b", Phase::NotReady),
                // Moved from c.b to c.a: c.a lists it now.
                row("m", "c.b", Phase::Ready),
            ],
            Phase::NotReady,
            "3/4 nodes ready in 2 NVLink cliques, not ready: b2",
        );
        let part = clique_part(&written, "c.a");
        assert_eq!(part.nodes, vec![row("a1", "c.a", Phase::Ready)]);
        assert_eq!(
            (part.status, part.ready_nodes, part.total_nodes),
            (Phase::Ready, 1, 1)
        );
        let mine = document(
            vec![
                row("a1", "c.a", Phase::Ready),
                row("m", "c.a", Phase::Ready),
            ],
            Phase::Ready,
            "2/2 nodes ready",
        );
        let others = other_cliques_rows(&written, "c.a", &mine);
        let names: Vec<&str> = others.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["b1", "b2"]);
        // A clique whose last node left lists none of its rows, and the rest stands.
        let vacated = crate::rules::status::vacated_document();
        let rest = merged(&vacated, &other_cliques_rows(&written, "c.a", &vacated), 0);
        let names: Vec<&str> = rest.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["b1", "b2", "m"]);
    }
}
