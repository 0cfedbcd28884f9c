//! The jobs' memory imports in a cluster run, where the access can hold them
//! ([`crate::cluster::access::JobImports`]): once the domain is whole, each node's job imports
//! from every other node through its IMEX. After each fault heals, and at the end,
//! every import held is looked at; one that broke is judged by [`import_break`]
//! (allowed when a fault that may break imports hit its node or the exporter it names,
//! a violation otherwise), reported with IMEX's reason, and taken again once the
//! domain is whole.
//!
//! A fault that ends a node's job (its pod evicted by a drain, or deleted) lets go of
//! that node's imports and of the other nodes' imports of its memory before it is
//! injected, as the job's own end would: the unprepare that follows drops the node
//! from its peers' IMEX.

use super::ClusterRun;
use crate::cluster::access::ImportState;
use crate::invariants::{Hit, Invariant, Violation, import_break};
use crate::report::{BrokenImport, ImportsReport};
use crate::schedule::Step;

/// What the stand-in holds and has seen; `report` is `None` where the access holds no
/// imports.
#[derive(Debug, Default)]
pub(crate) struct ClusterImports {
    held: Vec<Held>,
    /// Every fault injected so far, in order: what a break may be blamed on.
    hits: Vec<Hit>,
    pub(super) report: Option<ImportsReport>,
}

#[derive(Debug, Clone)]
struct Held {
    /// The importing node and the exporters, as indexes of the run's nodes.
    node: usize,
    id: u64,
    from: Vec<usize>,
    /// Faults injected before it was taken: only later ones may break it.
    since: usize,
}

impl ClusterRun {
    fn node_name(&self, index: usize) -> String {
        self.workload.nodes[index].clone()
    }

    fn node_index(&self, name: &str) -> Option<usize> {
        self.workload.nodes.iter().position(|n| n == name)
    }

    /// `step` was injected: its targets are remembered for the imports it may break.
    pub(super) fn imports_hit(&mut self, step: &Step) {
        self.imports.hits.push(Hit {
            kind: step.kind,
            step: step.index,
            targets: step.targets.clone(),
        });
    }

    /// The job on `node` ends: its imports go, and so do the others' imports of its
    /// memory.
    pub(super) fn end_imports(&mut self, node: usize) {
        self.imports
            .held
            .retain(|h| h.node != node && !h.from.contains(&node));
    }

    /// Looks at every import held: a broken one is judged, reported and let go.
    pub(super) async fn check_imports(&mut self) {
        if self.imports.held.is_empty() {
            return;
        }
        let handles: Vec<(String, u64)> = self
            .imports
            .held
            .iter()
            .map(|h| (self.node_name(h.node), h.id))
            .collect();
        let Some(job) = self.access.job_imports() else {
            return;
        };
        let found = job.check(&handles).await;
        let mut kept = Vec::new();
        for (held, handle) in std::mem::take(&mut self.imports.held)
            .into_iter()
            .zip(handles)
        {
            let (reason, culprit) = match found.get(&handle) {
                Some(ImportState::Whole) | None => {
                    kept.push(held);
                    continue;
                }
                Some(ImportState::Broken { why, exporter }) => (
                    why.clone(),
                    exporter.as_deref().and_then(|e| self.node_index(e)),
                ),
                Some(ImportState::Lost(why)) => (why.clone(), Some(held.node)),
            };
            self.broken_import(&held, reason, culprit);
        }
        if let Some(report) = &mut self.imports.report {
            report.checked += found.len();
            report.held_at_end = kept.len();
        }
        self.imports.held = kept;
    }

    fn broken_import(&mut self, held: &Held, reason: String, culprit: Option<usize>) {
        let since = &self.imports.hits[held.since.min(self.imports.hits.len())..];
        let by = import_break(held.node, culprit, since).cloned();
        let name = self.node_name(held.node);
        let from: Vec<String> = held.from.iter().map(|p| self.node_name(*p)).collect();
        if by.is_none() {
            let faults: Vec<String> = since
                .iter()
                .map(|h| format!("{} (step {})", h.kind, h.step))
                .collect();
            self.record(Violation::new(
                Invariant::Imports,
                Some(&name),
                format!(
                    "import {} (from {}) broke: {reason}; no fault that may break imports hit \
                     it or its exporter since it was taken (faults since: {})",
                    held.id,
                    from.join(", "),
                    if faults.is_empty() {
                        "none".to_owned()
                    } else {
                        faults.join(", ")
                    }
                ),
            ));
        }
        let found_at_ms = self.started.elapsed().as_millis() as u64;
        let current = self.current;
        if let Some(report) = &mut self.imports.report {
            report.broken.push(BrokenImport {
                node: name,
                id: held.id,
                domain: crate::cluster::workload::DOMAIN_NAME.to_owned(),
                from,
                reason,
                by: by.as_ref().map(|h| h.kind),
                by_step: by.as_ref().map(|h| h.step),
                found_after: current.map(|(kind, _)| kind),
                found_after_step: current.map(|(_, step)| step),
                found_at_ms,
            });
        }
    }

    /// With the domain whole, every node's job imports from every other node, unless
    /// it holds such an import already. One that cannot is a liveness violation.
    pub(super) async fn take_imports(&mut self) {
        if self.imports.report.is_none() {
            return;
        }
        let whole = self
            .last
            .as_ref()
            .is_some_and(|o| self.unwhole(o).is_empty());
        if !whole {
            return;
        }
        let nodes = self.workload.nodes.len();
        for node in 0..nodes {
            let from: Vec<usize> = (0..nodes).filter(|p| *p != node).collect();
            if self
                .imports
                .held
                .iter()
                .any(|h| h.node == node && h.from == from)
            {
                continue;
            }
            let names: Vec<String> = from.iter().map(|p| self.node_name(*p)).collect();
            let name = self.node_name(node);
            let Some(job) = self.access.job_imports() else {
                return;
            };
            match job.import(&name, &names).await {
                Ok(id) => {
                    let since = self.imports.hits.len();
                    self.imports.held.push(Held {
                        node,
                        id,
                        from,
                        since,
                    });
                    if let Some(report) = &mut self.imports.report {
                        report.taken += 1;
                    }
                }
                Err(error) => self.liveness(format!(
                    "{name}'s job could not import from the other nodes once the domain was \
                     whole: {error:#}"
                )),
            }
        }
        let held = self.imports.held.len();
        if let Some(report) = &mut self.imports.report {
            report.held_at_end = held;
        }
    }

    /// When the run started holding imports (`None` where the access cannot).
    pub(super) fn start_imports(&mut self) {
        if self.access.job_imports().is_some() {
            self.imports.report = Some(ImportsReport::default());
        }
    }
}
