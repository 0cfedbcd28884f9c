//! A node's IMEX port taken by another socket: its daemon killed and the port held by
//! the harness for the hold, as a process (or an outgoing connection given the port as
//! its source) would take it. The node must back off, and say so: the domain's status
//! names it while the port is held; once freed, the domain must form again within a
//! bound set by the restart backoff's cap.

use std::time::{Duration, Instant};

use crate::harness::{DETECT_LIMIT, Harness};
use crate::invariants::{Invariant, Violation, names_imex_failing};
use crate::report::{FaultRecord, Outcome};
use crate::schedule::Step;

/// The port freed → the domain whole again: the restart that waits longest (the 30 s
/// cap of the backoff) and then a formation, with room for a loaded machine.
pub(crate) const IMEX_PORT_HEAL_BOUND: Duration = Duration::from_secs(45);

impl Harness {
    /// Detected when the status names the node's failing IMEX; checked to go on naming
    /// it while the port is held.
    pub(super) async fn imex_port(&mut self, step: &Step) -> FaultRecord {
        let target = step.targets[0];
        let name = self.name(target);
        let mut record = self.record_for(step, &step.targets);
        let injected = Instant::now();
        let mut killed = 0;
        let taken = tokio::task::block_in_place(|| self.rack.take_imex_port(target, &mut killed));
        self.world.nodes[target].imex_crashes += killed;
        let held = match taken {
            Ok(listener) => listener,
            Err(error) => {
                self.liveness(
                    Some(target),
                    format!("cannot take its IMEX port: {error:#}"),
                );
                record.outcome = Outcome::NotHealed;
                return record;
            }
        };
        let named = self
            .wait_until(DETECT_LIMIT, |_, _, o| names_imex_failing(&o.status, &name))
            .await;
        record.detect_ms = self.detection(target, injected, named, |_| {
            format!(
                "its IMEX port was taken, and the status did not name it within {}s",
                DETECT_LIMIT.as_secs()
            )
        });
        if named.is_some() {
            self.note_why(target, "when named", &mut record);
        }

        // Held for the rest of the hold: the status must go on naming it.
        let rest = step.hold.saturating_sub(injected.elapsed());
        let forgotten = self
            .hold(rest, |_, _, o| !names_imex_failing(&o.status, &name))
            .await
            .filter(|_| named.is_some());
        if forgotten.is_some() {
            self.record(Violation::new(
                Invariant::Status,
                Some(&name),
                "the status stopped naming it while its IMEX port was still taken",
            ));
        }
        if named.is_some() {
            self.note_why(target, "as the port was freed", &mut record);
        }
        drop(held);
        let ended = Instant::now();
        let record = self
            .heal_fault(record, ended, "its IMEX port was freed")
            .await;
        if let Some(heal) = record.heal_ms
            && heal > IMEX_PORT_HEAL_BOUND.as_millis() as u64
        {
            self.liveness(
                Some(target),
                format!(
                    "whole {heal} ms after its IMEX port was freed, over the {}s bound",
                    IMEX_PORT_HEAL_BOUND.as_secs()
                ),
            );
        }
        record
    }

    /// What the node itself said (`/state`) `when`: failing, and why (the newest
    /// failure: at first the kill, once it tried again the port). A node named failing
    /// whose `/state` does not say so breaks the status invariant.
    fn note_why(&mut self, target: usize, when: &str, record: &mut FaultRecord) {
        let imex = self
            .last
            .as_ref()
            .and_then(|(_, o)| o.nodes[target].view.as_ref())
            .map(|v| v.imex.clone());
        let name = self.name(target);
        match imex {
            Some(imex) if imex.failing && imex.last_failure.is_some() => {
                let why = imex.last_failure.unwrap_or_default();
                // Said once: the same reason again adds nothing.
                if !record.notes.iter().any(|n| n.ends_with(&why)) {
                    record.notes.push(format!("{when}, {name} said: {why}"));
                }
            }
            Some(imex) => self.record(Violation::new(
                Invariant::Status,
                Some(&name),
                format!(
                    "{when}, its /state does not say its IMEX is failing: failing {}, last \
                     failure {:?}",
                    imex.failing, imex.last_failure
                ),
            )),
            None => {}
        }
    }
}
