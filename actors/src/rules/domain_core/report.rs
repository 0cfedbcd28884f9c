//! The reporter's side of a pass: the reporter role (`rules::reporter_role`) fed from
//! the roster and the gossip view, and what it decided turned into effects: reading
//! the written status, starting or stopping the status writer, the document to
//! publish and the events to emit.

use tokio::time::Instant;

use super::{DomainCore, DomainEffect, RoleState};
use crate::actors::sharing::Role;
use crate::ports::DomainEvent;
use crate::rules::readiness::Readiness;
use crate::rules::reporter::{Announced, reporter};
use crate::rules::reporter_role::{ReadOutcome, ReporterInput, ReporterStep, ReporterTiming};
use crate::rules::status::DomainStatus;

impl DomainCore {
    /// The reporter's part of a pass. `writing`: the actor runs a status writer.
    pub(super) fn report(
        &mut self,
        readiness: &Readiness,
        now: Instant,
        now_ms: u64,
        writing: bool,
    ) -> Vec<DomainEffect> {
        if self.role() == Role::SharedImex {
            // Not a ComputeDomain: its faults are reported on the sharing domains.
            return Vec::new();
        }
        let live = self.live_names.clone().unwrap_or_default();
        let step = self.reporter.step(ReporterInput {
            now,
            now_ms,
            alone: self
                .live_names
                .as_ref()
                .is_none_or(|names| names.len() <= 1),
            membership_changed: self.membership_changed,
            named: reporter(self.roster.members()) == Some(self.me()),
            witnessed: self.roster.witnessed(),
            live: &live,
            timing: ReporterTiming {
                settle: self.config.reporter_settle,
                settle_max: self.config.reporter_settle_max,
                takeover_grace: self.config.status_takeover_grace,
            },
        });
        let mut effects = Vec::new();
        match step {
            ReporterStep::Settling { at } => return vec![DomainEffect::PassAt(at)],
            ReporterStep::NotReporter => return vec![DomainEffect::StopWriter],
            ReporterStep::ReadWritten => return vec![DomainEffect::ReadWritten],
            ReporterStep::Reading => return effects,
            ReporterStep::Hold { until, unaccounted } => {
                return vec![
                    DomainEffect::ReportHeld { unaccounted },
                    DomainEffect::PassAt(until),
                ];
            }
            ReporterStep::Report { adopt, start } => match start {
                Some(tenure) => {
                    let adopted = adopt.iter().map(|row| row.name.clone()).collect();
                    self.roster.adopt(adopt, now);
                    effects.push(DomainEffect::StartWriter {
                        term: tenure.term,
                        written: tenure.written,
                        adopted,
                        members: self.roster.members().len(),
                    });
                    if !self.roster.adopted().is_empty() {
                        // Their retention is timed from now.
                        effects.push(DomainEffect::Pass);
                    }
                }
                None if !writing => return effects,
                None => {}
            },
        }
        effects.push(DomainEffect::PublishStatus(self.status_document(readiness)));
        if self.role() == Role::Sharing {
            let faults: Vec<DomainEvent> = self
                .shared_faults()
                .into_iter()
                .map(|(node, fault)| DomainEvent::SharedImexFault {
                    node,
                    fault: fault.to_string(),
                    clique: self.config.clique.to_string(),
                })
                .collect();
            if !faults.is_empty() {
                effects.push(DomainEffect::Events(faults));
            }
        }
        // A held member is not announced lost: no job of it felt anything.
        let events = self.reporter.announce(Announced {
            // A held member never left, so its return is no join either.
            members: self
                .roster
                .members()
                .keys()
                .chain(self.roster.held())
                .cloned()
                .collect(),
            lost: self.roster.unheld_lost().cloned().collect(),
        });
        if !events.is_empty() {
            effects.push(DomainEffect::Events(events));
        }
        effects
    }

    /// The read [`DomainEffect::ReadWritten`] asked for ended: `Err` if it failed.
    pub fn read_finished<E>(
        &mut self,
        read: Result<Option<DomainStatus>, E>,
        now: Instant,
    ) -> ReadOutcome {
        self.reporter
            .read_finished(read, now, self.config.status_takeover_grace)
    }

    /// The status document, as the reporter writes it: `readiness` is the pass's.
    fn status_document(&self, readiness: &Readiness) -> DomainStatus {
        let mut document =
            self.roster
                .status_document(&self.assignment, readiness, self.domain.num_nodes);
        if let RoleState::Sharing(role) = &self.role {
            document.channel = role.status_channel(&self.domain.uid);
        }
        document
    }
}
