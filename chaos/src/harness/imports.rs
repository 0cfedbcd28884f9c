//! The jobs' memory imports, held as the pods of the harness's claims would hold them:
//! once a domain is Ready, each of its members imports from every other member through
//! its IMEX (imex-sim's `import`). After every fault heals, and at the end, every import
//! held is looked at; one that broke is judged by [`import_break`] (allowed when a fault
//! that may break imports hit its node or the peer it broke on, a violation otherwise),
//! reported with imex-sim's reason, and taken again once the domain is whole.
//!
//! A job whose claim the harness unprepares (churn, a deleted domain) has ended: its
//! imports, and the other members' imports of its memory, are let go before the
//! unprepare, since a peer leaving the config is what ends them, and the stand-in is
//! the one that made it leave.

use std::collections::BTreeMap;
use std::time::Instant;

use domaind_testbed::imex_sim::imports::Import;
use domaind_testbed::rack::HeldImport;

use super::Harness;
use crate::invariants::{ClaimPhase, Hit, Invariant, Violation, import_break};
use crate::report::{BrokenImport, FaultRecord, ImportsReport};
use crate::schedule::Step;

/// What the stand-in holds and has seen.
#[derive(Debug, Default)]
pub(super) struct Imports {
    held: Vec<Held>,
    /// Every fault injected so far, in order: what an import's break may be blamed on.
    hits: Vec<Hit>,
    pub(super) report: ImportsReport,
}

#[derive(Debug, Clone)]
struct Held {
    import: HeldImport,
    domain: String,
    /// The members it imports from.
    from: Vec<usize>,
    /// How many faults had been injected when it was taken: it may be broken only by
    /// those after.
    since: usize,
}

impl Harness {
    /// `step` was injected (by one of its `records` at least): its targets are
    /// remembered for the imports it may break.
    pub(super) fn imports_hit(&mut self, step: &Step, records: &[FaultRecord]) {
        if records.iter().any(|r| r.injected_at_ms.is_some()) {
            self.imports.hits.push(Hit {
                kind: step.kind,
                step: step.index,
                targets: step.targets.clone(),
            });
        }
    }

    /// The job on `node` ends for `domain`: its imports go, and so do the other
    /// members' imports of its memory.
    pub(super) fn end_imports(&mut self, node: usize, domain: &str) {
        self.imports
            .held
            .retain(|h| h.domain != domain || (h.import.node != node && !h.from.contains(&node)));
    }

    /// Looks at every import held: a broken one is judged, reported and let go.
    pub(super) async fn check_imports(&mut self) {
        if self.imports.held.is_empty() {
            return;
        }
        let handles: Vec<HeldImport> = self.imports.held.iter().map(|h| h.import).collect();
        let found = self.rack.check_imports(&handles).await;
        self.imports.report.checked += handles.len();
        let mut kept = Vec::new();
        for held in std::mem::take(&mut self.imports.held) {
            let (reason, culprit) = match found.get(&held.import) {
                Some(Ok(Import { broken: None, .. })) | None => {
                    kept.push(held);
                    continue;
                }
                Some(Ok(Import {
                    broken: Some(why), ..
                })) => (why.clone(), self.blamed(&held, why)),
                // Its own IMEX lost it (restarted) or could not say.
                Some(Err(why)) => (why.clone(), Some(held.import.node)),
            };
            self.broken_import(&held, reason, culprit);
        }
        self.imports.report.held_at_end = kept.len();
        self.imports.held = kept;
    }

    /// The peer of `held` that imex-sim names first in `why` (it starts with the
    /// exporting peer's address), if any.
    fn blamed(&self, held: &Held, why: &str) -> Option<usize> {
        held.from.iter().copied().find(|peer| {
            why.strip_prefix(&self.world.nodes[*peer].ip.to_string())
                .is_some_and(|rest| rest.starts_with(' '))
        })
    }

    fn broken_import(&mut self, held: &Held, reason: String, culprit: Option<usize>) {
        let importer = held.import.node;
        let since = &self.imports.hits[held.since.min(self.imports.hits.len())..];
        let by = import_break(importer, culprit, since).cloned();
        let from: Vec<String> = held.from.iter().map(|p| self.name(*p)).collect();
        let domain = self.domain_name(&held.domain);
        if by.is_none() {
            let faults: Vec<String> = since
                .iter()
                .map(|h| format!("{} (step {})", h.kind, h.step))
                .collect();
            let blamed = culprit
                .filter(|c| *c != importer)
                .map(|c| format!(" or {}", self.name(c)))
                .unwrap_or_default();
            let name = self.name(importer);
            self.record(Violation::new(
                Invariant::Imports,
                Some(&name),
                format!(
                    "import {} of {domain} (from {}) broke: {reason}; no fault that may break \
                     imports hit {name}{blamed} since it was taken (faults since: {})",
                    held.import.id,
                    from.join(", "),
                    if faults.is_empty() {
                        "none".to_owned()
                    } else {
                        faults.join(", ")
                    }
                ),
            ));
        }
        let found_at_ms = self.ms_since_start(Instant::now());
        self.imports.report.broken.push(BrokenImport {
            node: self.name(importer),
            id: held.import.id,
            domain,
            from,
            reason,
            by: by.as_ref().map(|h| h.kind),
            by_step: by.as_ref().map(|h| h.step),
            found_after: self.current.map(|(kind, _)| kind),
            found_after_step: self.current.map(|(_, step)| step),
            found_at_ms,
        });
    }

    /// Every member of every domain whose claims are all prepared imports from every
    /// other member, unless it holds such an import already: at formation and after
    /// each heal. One that cannot is a liveness violation.
    pub(super) async fn take_imports(&mut self) {
        for (domain, members) in self.prepared_domains() {
            if members.len() < 2 {
                continue;
            }
            for &node in &members {
                let from: Vec<usize> = members.iter().copied().filter(|m| *m != node).collect();
                let current = |h: &Held| h.domain == domain && h.import.node == node;
                if self
                    .imports
                    .held
                    .iter()
                    .any(|h| current(h) && h.from == from)
                {
                    continue;
                }
                // Its domain's members changed: the job imports anew.
                self.imports.held.retain(|h| !current(h));
                match self.rack.import_from(node, &from).await {
                    Ok(import) => {
                        self.imports.report.taken += 1;
                        self.imports.held.push(Held {
                            import,
                            domain: domain.clone(),
                            from,
                            since: self.imports.hits.len(),
                        });
                    }
                    Err(error) => {
                        let detail = format!(
                            "its job could not import from the other members of {} once it \
                             was whole: {error:#}",
                            self.domain_name(&domain)
                        );
                        self.liveness(Some(node), detail);
                    }
                }
            }
        }
        self.imports.report.held_at_end = self.imports.held.len();
    }

    /// Each domain with a claim in the world, and the nodes holding one of its claims,
    /// if every claim of it is prepared (nothing under way).
    fn prepared_domains(&self) -> BTreeMap<String, Vec<usize>> {
        let mut domains: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let mut unsettled: Vec<String> = Vec::new();
        for (i, node) in self.world.nodes.iter().enumerate() {
            for (claim, phase) in &node.claims {
                let domain = self.world.domain_of(claim).to_owned();
                match phase {
                    ClaimPhase::Prepared => {
                        let members = domains.entry(domain).or_default();
                        if !members.contains(&i) {
                            members.push(i);
                        }
                    }
                    ClaimPhase::Released => {}
                    ClaimPhase::Preparing | ClaimPhase::Unpreparing => unsettled.push(domain),
                }
            }
        }
        domains.retain(|domain, _| !unsettled.contains(domain));
        domains
    }
}
