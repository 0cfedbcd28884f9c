//! What broke: violations, each recorded once with the fault it came during and how
//! often it was seen since, and the daemons that died on their own.

use std::collections::HashMap;

use crate::invariants::Violation;
use crate::report::{CrashRecord, ViolationRecord};
use crate::schedule::FaultKind;

#[derive(Debug, Default)]
pub(crate) struct Findings {
    violations: Vec<ViolationRecord>,
    /// Where each violation sits in `violations`: a breach seen on many observations
    /// is one violation.
    seen: HashMap<Violation, usize>,
    crashes: Vec<CrashRecord>,
}

impl Findings {
    /// Records `violation`, seen `at_ms` after the start during `current` (the fault
    /// kind and step under way); the progress line to say when it is new, nothing when
    /// it was seen before (it only counts).
    pub(crate) fn record(
        &mut self,
        violation: Violation,
        at_ms: u64,
        current: Option<(FaultKind, usize)>,
    ) -> Option<String> {
        if let Some(&index) = self.seen.get(&violation) {
            self.violations[index].times_seen += 1;
            return None;
        }
        let line = format!(
            "VIOLATION {}{}: {}",
            violation.invariant,
            violation
                .node
                .as_ref()
                .map(|n| format!(" on {n}"))
                .unwrap_or_default(),
            violation.detail
        );
        self.seen.insert(violation.clone(), self.violations.len());
        self.violations.push(ViolationRecord {
            violation,
            first_seen_ms: at_ms,
            during: current.map(|(kind, _)| kind),
            step: current.map(|(_, step)| step),
            times_seen: 1,
        });
        Some(line)
    }

    pub(crate) fn crash(&mut self, crash: CrashRecord) {
        self.crashes.push(crash);
    }

    pub(crate) fn violations(&self) -> &[ViolationRecord] {
        &self.violations
    }

    pub(crate) fn crashes(&self) -> &[CrashRecord] {
        &self.crashes
    }

    /// No violation and no crash: the run passed.
    pub(crate) fn ok(&self) -> bool {
        self.violations.is_empty() && self.crashes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::Invariant;

    fn isolation(detail: &str) -> Violation {
        Violation::new(Invariant::Isolation, Some("node-02"), detail)
    }

    #[test]
    fn a_violation_seen_again_is_counted_not_recorded_again() {
        let mut findings = Findings::default();
        let line = findings.record(isolation("lists node-03"), 1_200, None);
        assert_eq!(
            line.as_deref(),
            Some("VIOLATION isolation on node-02: lists node-03")
        );
        assert_eq!(
            findings.record(isolation("lists node-03"), 1_400, None),
            None
        );
        assert_eq!(
            findings.record(isolation("lists node-03"), 1_600, None),
            None
        );
        let [only] = findings.violations() else {
            panic!("{:?}", findings.violations());
        };
        assert_eq!((only.first_seen_ms, only.times_seen), (1_200, 3));
        assert!(!findings.ok());
    }

    #[test]
    fn another_detail_or_node_is_another_violation() {
        let mut findings = Findings::default();
        findings.record(isolation("lists node-03"), 0, None);
        assert!(
            findings
                .record(isolation("lists node-04"), 0, None)
                .is_some()
        );
        let elsewhere = Violation::new(Invariant::Isolation, None, "lists node-03");
        assert_eq!(
            findings.record(elsewhere, 0, None).as_deref(),
            Some("VIOLATION isolation: lists node-03")
        );
        assert_eq!(findings.violations().len(), 3);
    }

    #[test]
    fn a_violation_belongs_to_the_fault_it_was_first_seen_in() {
        let mut findings = Findings::default();
        findings.record(isolation("x"), 0, Some((FaultKind::Pause, 4)));
        // Seen again after the fault: still the pause's.
        findings.record(isolation("x"), 10, None);
        let [only] = findings.violations() else {
            panic!("{:?}", findings.violations());
        };
        assert_eq!(
            (only.during, only.step, only.times_seen),
            (Some(FaultKind::Pause), Some(4), 2)
        );
    }

    #[test]
    fn a_crash_alone_fails_the_run() {
        let mut findings = Findings::default();
        assert!(findings.ok());
        findings.crash(CrashRecord {
            node: "node-01".into(),
            at_ms: 5,
            during: Some(FaultKind::NodeKill),
            log_tail: Vec::new(),
        });
        assert!(!findings.ok());
        assert!(findings.violations().is_empty());
        assert_eq!(findings.crashes().len(), 1);
    }
}
