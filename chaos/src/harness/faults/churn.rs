//! Claim churn: a node leaves the domain and rejoins, or keeps its membership through
//! an extra claim while its own claim goes out and back.

use std::time::Instant;

use crate::harness::{DETECT_LIMIT, Harness, PREPARE_LIMIT};
use crate::invariants::{dropped_by_all, missing_members};
use crate::report::FaultRecord;
use crate::schedule::{Churn, Step};

impl Harness {
    pub(super) async fn churn(&mut self, step: &Step) -> FaultRecord {
        let record = self.record_for(step, &step.targets);
        match step.churn.unwrap_or(Churn::LeaveAndRejoin) {
            Churn::LeaveAndRejoin => self.leave_and_rejoin(step, record).await,
            Churn::ExtraClaim => self.extra_claim(step, record).await,
        }
    }

    /// Unprepares every claim of the target (of every domain, with `--domains`): it
    /// must leave every peer set and stop its IMEX daemon (the detection); after the
    /// hold its claims are prepared again.
    async fn leave_and_rejoin(&mut self, step: &Step, mut record: FaultRecord) -> FaultRecord {
        let target = step.targets[0];
        let held = self.held_claims(target);
        let injected = Instant::now();
        for claim in &held {
            self.unprepare(target, claim).await;
        }
        let left = self
            .wait_until(DETECT_LIMIT, |_, w, o| {
                dropped_by_all(w, o, target) && !o.nodes[target].imex_running()
            })
            .await;
        record.detect_ms = self.detection(target, injected, left, |h| {
            format!(
                "unprepared its last claim, but after {}s {:?} still had it in their peer sets or it still ran IMEX",
                DETECT_LIMIT.as_secs(),
                h.holders_of(target)
            )
        });
        self.hold(step.hold, |_, _, _| false).await;
        let ended = Instant::now();
        for claim in &held {
            self.begin_prepare(target, claim);
        }
        record.notes.push("left and rejoined".into());
        self.heal_fault(record, ended, "its claim was prepared again")
            .await
    }

    /// Prepares an extra claim, then unprepares the target's own: the extra keeps it
    /// a member (being dropped meanwhile is noted); after the hold its own claim comes
    /// back and the extra goes. No membership changes: nothing to detect.
    async fn extra_claim(&mut self, step: &Step, mut record: FaultRecord) -> FaultRecord {
        let target = step.targets[0];
        let own = self.own_claim(target);
        let extra = format!("extra-{}-{}", step.index, self.name(target));
        self.begin_prepare(target, &extra);
        self.wait_until(PREPARE_LIMIT, |h, _, _| h.prepares.is_empty())
            .await;
        self.unprepare(target, &own).await;
        let mut dropped = false;
        self.hold(step.hold, |_, w, o| {
            dropped |= missing_members(w, o)
                .iter()
                .any(|(_, gone)| *gone == w.nodes[target].name);
            false
        })
        .await;
        if dropped {
            record.notes.push(format!(
                "dropped from a peer set while it still held {extra}"
            ));
        }
        let ended = Instant::now();
        self.begin_prepare(target, &own);
        self.wait_until(PREPARE_LIMIT, |h, _, _| h.prepares.is_empty())
            .await;
        self.unprepare(target, &extra).await;
        record
            .notes
            .push(format!("extra claim {extra}; own claim out and back"));
        self.heal_fault(record, ended, "its claim was prepared again")
            .await
    }
}
