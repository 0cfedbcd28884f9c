//! The report of `domaind-chaos run`: per fault kind, how many faults, how fast they
//! were detected and healed, what broke; as a table for people and JSON for tools.
//!
//! - **detect**: from the fault's injection until the survivors' view reflects it.
//!   node-kill, partition, churn (leave): the node is gone from the peer set (hosts
//!   block) of every other member whose IMEX daemon runs. daemon-kill, restart: every
//!   other member holds the node (its daemon silent, its IMEX alive); pause: held or
//!   gone. upgrade: nothing should notice (its notes say how many nodes peers held
//!   meanwhile). imex-crash: a
//!   new IMEX daemon runs on the node. cert-rotate: the node reports the rotation
//!   (`domaind_gossip_tls_reloads_total{result="rotated"}`). imex-port: the status
//!   names the node's IMEX as failing. domain-churn: a new domain's prepares all
//!   answered (its channel confirmed and handed on every node it holds), or a deleted
//!   domain shown by no node any more. loss and churn with an extra claim change no
//!   membership: nothing to detect.
//! - **imports**: every import of the workload stand-in found broken after a fault,
//!   counted against the fault that may break it (`invariants::may_break_imports`), or
//!   against the fault after which it was found, where it is a violation too.
//! - **heal**: from the fault's end (restart issued, SIGCONT, rules removed, claim
//!   prepared again, certificate written, port freed) until the domain is Ready with all its
//!   members again: every member sees all members Ready, the same peer set and slots,
//!   and the status file says so.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use domaind_testkit::percentile::percentile;
use serde::Serialize;

use crate::invariants::{Invariant, Violation};
use crate::schedule::{FaultKind, Schedule};

/// p50, p99 and max of a set of durations, in milliseconds (nearest rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Stats {
    pub samples: usize,
    pub p50_ms: u64,
    pub p99_ms: u64,
    pub max_ms: u64,
}

impl Stats {
    pub fn of(samples: &[u64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        Some(Self {
            samples: sorted.len(),
            p50_ms: percentile(&sorted, 50),
            p99_ms: percentile(&sorted, 99),
            max_ms: *sorted.last().expect("not empty"),
        })
    }
}

/// What became of one fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "outcome", content = "reason")]
pub enum Outcome {
    /// Injected, and the domain was whole again afterwards.
    Healed,
    /// Injected, and the domain was not whole within the limit (a violation).
    NotHealed,
    /// Not injected: what it needs is missing here (e.g. iptables, root).
    Skipped(String),
    /// Not injected: the run was too far behind its schedule.
    NotRun(String),
}

/// One injected (or skipped) fault.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    pub step: usize,
    pub kind: FaultKind,
    pub targets: Vec<String>,
    /// When the schedule wanted it, and when it came, from the fault phase's start.
    pub planned_at_ms: u64,
    pub injected_at_ms: Option<u64>,
    pub detect_ms: Option<u64>,
    pub heal_ms: Option<u64>,
    #[serde(flatten)]
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl FaultRecord {
    /// The progress line said when the fault healed (or not); `untargeted` names what
    /// a fault without targets hit.
    pub fn progress_line(&self, untargeted: &str) -> String {
        let ms = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |ms| format!("{ms} ms"));
        format!(
            "{} {}: detect {}, heal {}{}",
            self.kind,
            if self.targets.is_empty() {
                untargeted.to_owned()
            } else {
                self.targets.join(",")
            },
            ms(self.detect_ms),
            ms(self.heal_ms),
            if self.notes.is_empty() {
                String::new()
            } else {
                format!(" ({})", self.notes.join("; "))
            }
        )
    }
}

/// A violation as reported: when it was first seen, during which fault, how often.
#[derive(Debug, Clone, Serialize)]
pub struct ViolationRecord {
    #[serde(flatten)]
    pub violation: Violation,
    /// From the start of the run.
    pub first_seen_ms: u64,
    /// The fault being injected or healed then (none: formation or the final check).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub during: Option<FaultKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<usize>,
    /// Observations that showed it.
    pub times_seen: u64,
}

/// A daemon that died without being killed.
#[derive(Debug, Clone, Serialize)]
pub struct CrashRecord {
    pub node: String,
    pub at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub during: Option<FaultKind>,
    /// The end of its log.
    pub log_tail: Vec<String>,
}

/// Per fault kind.
#[derive(Debug, Clone, Serialize)]
pub struct KindReport {
    pub kind: FaultKind,
    pub injected: usize,
    pub skipped: usize,
    pub detected: usize,
    pub detect: Option<Stats>,
    pub heal: Option<Stats>,
    pub violations: usize,
    pub crashes: usize,
    /// Imports of the workload stand-in broken by faults of this kind, allowed or not
    /// (loopback runs; a cluster run holds none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub imports_broken: Option<usize>,
}

/// An import of the workload stand-in found broken.
#[derive(Debug, Clone, Serialize)]
pub struct BrokenImport {
    /// The node whose job held it, and the import's id in its IMEX.
    pub node: String,
    pub id: u64,
    pub domain: String,
    /// The peers it imported from.
    pub from: Vec<String>,
    /// Why, as imex-sim says (or why the importer's IMEX could not say).
    pub reason: String,
    /// The fault that may break it and hit the importer or the peer blamed: a break
    /// allowed. None: a violation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<FaultKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by_step: Option<usize>,
    /// The fault after whose heal it was found (none: after formation or at the end).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub found_after: Option<FaultKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub found_after_step: Option<usize>,
    /// From the start of the run.
    pub found_at_ms: u64,
}

impl BrokenImport {
    /// The kind it counts against: the fault allowed to break it, or else the one after
    /// which it was found.
    pub fn kind(&self) -> Option<FaultKind> {
        self.by.or(self.found_after)
    }
}

/// The workload stand-in's imports: each member of a Ready domain imports from every
/// other member, checked after every fault and at the end.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ImportsReport {
    /// Imports taken (again after each break or membership change).
    pub taken: usize,
    /// Imports looked at, each time they were checked.
    pub checked: usize,
    /// Imports held, unbroken, at the last check.
    pub held_at_end: usize,
    pub broken: Vec<BrokenImport>,
}

impl ImportsReport {
    /// Broken and allowed (by a fault that may break them), broken as violations.
    pub fn counts(&self) -> (usize, usize) {
        let allowed = self.broken.iter().filter(|b| b.by.is_some()).count();
        (allowed, self.broken.len() - allowed)
    }
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub seed: u64,
    /// Nodes of the clique under faults.
    pub nodes: usize,
    /// Cliques in the rack, each of `nodes` nodes; only the first takes faults.
    pub cliques: usize,
    /// Domains on the first clique's nodes at the start; more than one share them with
    /// `isolation: Channel`.
    pub domains: usize,
    pub scenario: Vec<FaultKind>,
    pub duration_s: u64,
    pub domaind: String,
    /// Prepares issued on every node → domain Ready with every node, all agreeing.
    pub formation_ms: Option<u64>,
    pub elapsed_ms: u64,
    /// How network faults were made, or why they were skipped.
    pub network: String,
    pub isolation_grace_ms: u64,
    /// Observations taken; every one was checked against the invariants.
    pub observations: u64,
    pub kinds: Vec<KindReport>,
    pub faults: Vec<FaultRecord>,
    pub violations: Vec<ViolationRecord>,
    pub crashes: Vec<CrashRecord>,
    pub imports: ImportsReport,
    pub schedule: Schedule,
    /// Where the rack's files (logs, state) were left, with `--keep-files`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_files: Option<std::path::PathBuf>,
    /// No violation and no crash (and, in a soak, nothing growing).
    pub ok: bool,
    /// With `--sample-every`: the daemons' vitals over the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soak: Option<crate::soak::SoakReport>,
}

impl Report {
    /// Per-kind figures from the fault records, violations, crashes and, where the run
    /// held imports, the broken ones.
    pub fn summarise(
        scenario: &[FaultKind],
        faults: &[FaultRecord],
        violations: &[ViolationRecord],
        crashes: &[CrashRecord],
        broken_imports: Option<&[BrokenImport]>,
    ) -> Vec<KindReport> {
        scenario
            .iter()
            .map(|kind| {
                let of_kind: Vec<&FaultRecord> =
                    faults.iter().filter(|f| f.kind == *kind).collect();
                let detects: Vec<u64> = of_kind.iter().filter_map(|f| f.detect_ms).collect();
                let heals: Vec<u64> = of_kind.iter().filter_map(|f| f.heal_ms).collect();
                KindReport {
                    kind: *kind,
                    injected: of_kind
                        .iter()
                        .filter(|f| f.injected_at_ms.is_some())
                        .count(),
                    skipped: of_kind
                        .iter()
                        .filter(|f| matches!(f.outcome, Outcome::Skipped(_) | Outcome::NotRun(_)))
                        .count(),
                    detected: detects.len(),
                    detect: Stats::of(&detects),
                    heal: Stats::of(&heals),
                    violations: violations
                        .iter()
                        .filter(|v| v.during == Some(*kind))
                        .count(),
                    crashes: crashes.iter().filter(|c| c.during == Some(*kind)).count(),
                    imports_broken: broken_imports
                        .map(|b| b.iter().filter(|b| b.kind() == Some(*kind)).count()),
                }
            })
            .collect()
    }

    /// The table printed at the end of a run.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "domaind-chaos: {} nodes{}, scenario {}, seed {}, {} s of faults ({} observations, each checked)",
            self.nodes,
            if self.cliques > 1 {
                format!(" (and {} more cliques of as many)", self.cliques - 1)
            } else {
                String::new()
            },
            self.scenario
                .iter()
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(","),
            self.seed,
            self.duration_s,
            self.observations
        );
        if let Some(ms) = self.formation_ms {
            let _ = writeln!(out, "formation: Ready {0}/{0} in {ms} ms", self.nodes);
        }
        let _ = writeln!(out, "network faults: {}", self.network);
        if self.domains > 1 {
            let _ = writeln!(
                out,
                "domains: {} with isolation: Channel on the same nodes at the start; every \
                 node's channels checked on every observation",
                self.domains
            );
        }
        if self.cliques > 1 {
            let _ = writeln!(
                out,
                "cliques: {} of {} nodes, faults in the first; every node checked for gossip \
                 members and IMEX peers of another clique on every observation",
                self.cliques, self.nodes
            );
        }
        let (allowed, violating) = self.imports.counts();
        let _ = writeln!(
            out,
            "imports: {} taken, {} checked, {} held at the end; broken: {allowed} by faults \
             that may break them, {violating} otherwise",
            self.imports.taken, self.imports.checked, self.imports.held_at_end
        );
        write_outcomes(
            &mut out,
            &self.kinds,
            &self.faults,
            &self.violations,
            &self.crashes,
        );
        if let Some(soak) = &self.soak {
            out.push_str(&soak.table());
        }
        out
    }

    /// How many violations break `invariant`.
    pub fn count(&self, invariant: Invariant) -> usize {
        self.violations
            .iter()
            .filter(|v| v.violation.invariant == invariant)
            .count()
    }
}

/// The per-kind table, the skipped kinds and the violations and crashes: the part of
/// the report a loopback run and a cluster run share.
pub fn write_outcomes(
    out: &mut String,
    kinds: &[KindReport],
    faults: &[FaultRecord],
    violations: &[ViolationRecord],
    crashes: &[CrashRecord],
) {
    let _ = writeln!(out);
    // A column only where the run held imports: a cluster run holds none.
    let imports = kinds.iter().any(|k| k.imports_broken.is_some());
    let imports_column = |cell: String| {
        if imports {
            format!(" {cell:>7}")
        } else {
            String::new()
        }
    };
    let _ = writeln!(
        out,
        "{:<18} {:>8} {:>8} {:>9}  {:>22}  {:>22}  {:>10} {:>7}{}",
        "SCENARIO",
        "INJECTED",
        "SKIPPED",
        "DETECTED",
        "DETECT p50/p99/max ms",
        "HEAL p50/p99/max ms",
        "VIOLATIONS",
        "CRASHES",
        imports_column("IMPORTS".into())
    );
    let triple = |s: &Option<Stats>| {
        s.map_or_else(
            || "-".to_owned(),
            |s| format!("{}/{}/{}", s.p50_ms, s.p99_ms, s.max_ms),
        )
    };
    for k in kinds {
        let _ = writeln!(
            out,
            "{:<18} {:>8} {:>8} {:>9}  {:>22}  {:>22}  {:>10} {:>7}{}",
            k.kind.name(),
            k.injected,
            k.skipped,
            k.detected,
            triple(&k.detect),
            triple(&k.heal),
            k.violations,
            k.crashes,
            imports_column(k.imports_broken.unwrap_or_default().to_string())
        );
    }
    let outside = violations.iter().filter(|v| v.during.is_none()).count();
    if outside > 0 {
        let _ = writeln!(
            out,
            "{:<18} {:>76}",
            "(no fault)",
            format!("{outside} violations")
        );
    }
    let skipped: BTreeMap<&str, &str> = faults
        .iter()
        .filter_map(|f| match &f.outcome {
            Outcome::Skipped(reason) | Outcome::NotRun(reason) => {
                Some((f.kind.name(), reason.as_str()))
            }
            _ => None,
        })
        .collect();
    for (kind, reason) in skipped {
        let _ = writeln!(out, "skipped {kind}: {reason}");
    }
    let _ = writeln!(out);
    if violations.is_empty() && crashes.is_empty() {
        let _ = writeln!(out, "invariants: 0 violations, 0 daemon crashes");
    } else {
        let _ = writeln!(
            out,
            "invariants: {} violations, {} daemon crashes",
            violations.len(),
            crashes.len()
        );
        for v in violations {
            let _ = writeln!(
                out,
                "  VIOLATION {} at {} ms{}{}: {}",
                v.violation.invariant,
                v.first_seen_ms,
                v.violation
                    .node
                    .as_ref()
                    .map(|n| format!(" on {n}"))
                    .unwrap_or_default(),
                v.during
                    .map(|k| format!(" (during {k}, step {})", v.step.unwrap_or_default()))
                    .unwrap_or_default(),
                v.violation.detail
            );
        }
        for c in crashes {
            let _ = writeln!(out, "  CRASH {} at {} ms; its log ends:", c.node, c.at_ms);
            for line in &c.log_tail {
                let _ = writeln!(out, "    {line}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<u64> = (1..=100).collect();
        let stats = Stats::of(&samples).unwrap();
        assert_eq!((stats.p50_ms, stats.p99_ms, stats.max_ms), (50, 99, 100));
        let one = Stats::of(&[7]).unwrap();
        assert_eq!((one.p50_ms, one.p99_ms, one.max_ms), (7, 7, 7));
        let few = Stats::of(&[30, 10, 20]).unwrap();
        assert_eq!((few.p50_ms, few.p99_ms, few.max_ms), (20, 30, 30));
        assert!(Stats::of(&[]).is_none());
    }
}
