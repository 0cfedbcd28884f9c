//! The reporter role as a state machine: when this node may report (settled after it
//! joined, or after the view last changed), its takeover of the role (the status as
//! written read once per tenure, and held while it lists members not seen here), the
//! tenure's term, and the events for what changed since the last report. The domain
//! actor feeds it and carries out what it returns: reading the written status, starting
//! and stopping the status writer, publishing documents, emitting events. The rules it
//! applies are `rules::reporter`'s, `rules::takeover`'s and `next_term`.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use crate::model::NodeId;
use crate::ports::DomainEvent;
use crate::rules::reporter::{Announced, announcements, reporter_from};
use crate::rules::status::{DomainStatus, NodeStatus};
use crate::rules::status_writes::next_term;
use crate::rules::takeover::{Takeover, takeover};

/// How soon a failed read of the written status is tried again.
pub const READ_RETRY: Duration = Duration::from_millis(500);

/// The role's times (`ActorConfig`'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReporterTiming {
    pub settle: Duration,
    pub settle_max: Duration,
    pub takeover_grace: Duration,
}

/// A tenure's start: the status as written is read once.
#[derive(Debug, Clone, Default, PartialEq)]
enum Phase {
    #[default]
    Unread,
    Reading,
    Read(Option<DomainStatus>),
    /// The writer is running.
    Writing,
}

#[derive(Debug, Clone, Default)]
pub struct ReporterRole {
    /// When this node joined the domain (its first pass).
    joined: Option<Instant>,
    phase: Phase,
    announced: Option<Announced>,
    /// The term of this node's last tenure: a new tenure's must differ from every
    /// earlier one's, across restarts of the actor.
    last_term: Option<u64>,
}

/// What one pass knows.
#[derive(Debug, Clone, Copy)]
pub struct ReporterInput<'a> {
    pub now: Instant,
    /// The wall clock, for the term.
    pub now_ms: u64,
    /// The gossip view holds this node alone, or nothing yet.
    pub alone: bool,
    /// When gossip last saw a node come or go, or the domain a member join or leave.
    pub membership_changed: Option<Instant>,
    /// The rule names this node the reporter.
    pub named: bool,
    /// Every node seen as a member since this node (re)started.
    pub witnessed: &'a BTreeSet<NodeId>,
    /// The node names gossip knows alive now.
    pub live: &'a BTreeSet<NodeId>,
    pub timing: ReporterTiming,
}

/// What a pass decided.
#[derive(Debug, Clone, PartialEq)]
pub enum ReporterStep {
    /// Too early to tell whether this node reports: pass again at `at`.
    Settling { at: Instant },
    /// Another node reports; any writer of this node's stops.
    NotReporter,
    /// Read the status as written, then [`ReporterRole::read_finished`].
    ReadWritten,
    /// The read is in flight.
    Reading,
    /// The written status lists members not seen here yet: write nothing before
    /// `until` (or the next change).
    Hold {
        until: Instant,
        unaccounted: Vec<NodeId>,
    },
    /// Report: first adopt `adopt` into the roster, and start a writer for `start`'s
    /// tenure when there is one; then publish the document.
    Report {
        adopt: Vec<NodeStatus>,
        start: Option<Tenure>,
    },
}

/// A new tenure as reporter.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenure {
    pub term: u64,
    /// The status as written when it began.
    pub written: Option<DomainStatus>,
}

/// What a finished read of the written status leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOutcome {
    /// Not wanted any more (the role was lost or reset meanwhile).
    Stale,
    /// Read: pass again now.
    Read,
    /// Failed within the grace: pass again at `at`, reading anew.
    Retry { at: Instant },
    /// Failed past the grace: pass again now, reporting without it.
    WithoutIt,
}

impl ReporterRole {
    pub fn step(&mut self, input: ReporterInput<'_>) -> ReporterStep {
        let now = input.now;
        let joined = *self.joined.get_or_insert(now);
        let from = reporter_from(
            joined,
            if input.alone {
                // Alone in gossip is a view that has not started filling up (a rack
                // starting cold), or a clique of one: nothing says it is complete yet.
                Some(now)
            } else {
                input.membership_changed
            },
            input.timing.settle,
            input.timing.settle_max,
        );
        if now < from {
            return ReporterStep::Settling { at: from };
        }
        if !input.named {
            self.phase = Phase::Unread;
            self.announced = None;
            return ReporterStep::NotReporter;
        }
        match std::mem::take(&mut self.phase) {
            Phase::Unread => {
                self.phase = Phase::Reading;
                ReporterStep::ReadWritten
            }
            Phase::Reading => {
                self.phase = Phase::Reading;
                ReporterStep::Reading
            }
            Phase::Read(written) => match takeover(
                written.as_ref(),
                input.witnessed,
                input.live,
                joined,
                input.timing.takeover_grace,
                now,
            ) {
                Takeover::Hold { until, unaccounted } => {
                    self.phase = Phase::Read(written);
                    ReporterStep::Hold { until, unaccounted }
                }
                Takeover::Write { adopt } => {
                    let term = next_term(self.last_term, input.now_ms);
                    self.last_term = Some(term);
                    self.phase = Phase::Writing;
                    ReporterStep::Report {
                        adopt,
                        start: Some(Tenure { term, written }),
                    }
                }
            },
            Phase::Writing => {
                self.phase = Phase::Writing;
                ReporterStep::Report {
                    adopt: Vec::new(),
                    start: None,
                }
            }
        }
    }

    /// The read that [`ReporterStep::ReadWritten`] asked for ended: `Err` if it failed.
    /// A failed read is tried again until the takeover grace after joining has passed;
    /// then this node reports without it (a status that cannot be read is replaced).
    pub fn read_finished<E>(
        &mut self,
        read: Result<Option<DomainStatus>, E>,
        now: Instant,
        grace: Duration,
    ) -> ReadOutcome {
        if self.phase != Phase::Reading {
            return ReadOutcome::Stale;
        }
        match read {
            Ok(written) => {
                self.phase = Phase::Read(written);
                ReadOutcome::Read
            }
            Err(_) if now >= self.joined.unwrap_or(now) + grace => {
                self.phase = Phase::Read(None);
                ReadOutcome::WithoutIt
            }
            Err(_) => {
                self.phase = Phase::Unread;
                ReadOutcome::Retry {
                    at: now + READ_RETRY,
                }
            }
        }
    }

    /// The events that say what changed since the last report: members that joined,
    /// members lost.
    pub fn announce(&mut self, now: Announced) -> Vec<DomainEvent> {
        let events = announcements(self.announced.as_ref(), &now);
        self.announced = Some(now);
        events
    }

    /// The actor restarted: a tenure starts anew (its term still after the last one).
    pub fn reset(&mut self) {
        self.phase = Phase::Unread;
        self.announced = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Phase;

    const TIMING: ReporterTiming = ReporterTiming {
        settle: Duration::from_secs(1),
        settle_max: Duration::from_secs(10),
        takeover_grace: Duration::from_secs(3),
    };

    fn names(list: &[&str]) -> BTreeSet<NodeId> {
        list.iter().map(|s| s.to_string()).collect()
    }

    struct View {
        witnessed: BTreeSet<NodeId>,
        live: BTreeSet<NodeId>,
    }

    impl View {
        fn of(list: &[&str]) -> Self {
            Self {
                witnessed: names(list),
                live: names(list),
            }
        }

        fn input(&self, now: Instant, named: bool) -> ReporterInput<'_> {
            ReporterInput {
                now,
                now_ms: 1_000,
                alone: false,
                membership_changed: None,
                named,
                witnessed: &self.witnessed,
                live: &self.live,
                timing: TIMING,
            }
        }
    }

    fn written(nodes: &[&str]) -> DomainStatus {
        DomainStatus {
            status: Phase::Ready,
            ready_nodes: nodes.len() as u32,
            total_nodes: nodes.len() as u32,
            message: String::new(),
            nodes: nodes
                .iter()
                .map(|name| NodeStatus {
                    name: name.to_string(),
                    ip_address: String::new(),
                    clique_id: String::new(),
                    index: None,
                    status: Phase::Ready,
                })
                .collect(),
            channel: None,
        }
    }

    /// Past the settle, named: read, then a tenure.
    fn take_over(role: &mut ReporterRole, view: &View, t0: Instant) -> ReporterStep {
        let now = t0 + TIMING.settle;
        assert_eq!(role.step(view.input(now, true)), ReporterStep::ReadWritten);
        assert_eq!(role.step(view.input(now, true)), ReporterStep::Reading);
        assert_eq!(
            role.read_finished::<()>(Ok(None), now, TIMING.takeover_grace),
            ReadOutcome::Read
        );
        role.step(view.input(now, true))
    }

    #[test]
    fn a_new_member_waits_for_the_settle_before_it_reports() {
        let mut role = ReporterRole::default();
        let view = View::of(&["a", "b"]);
        let t0 = Instant::now();
        assert_eq!(
            role.step(view.input(t0, true)),
            ReporterStep::Settling {
                at: t0 + TIMING.settle
            }
        );
        let step = take_over(&mut role, &view, t0);
        assert!(
            matches!(&step, ReporterStep::Report { start: Some(Tenure { term: 1_000, written: None }), adopt } if adopt.is_empty()),
            "{step:?}"
        );
        // Then the tenure goes on: no new writer.
        assert_eq!(
            role.step(view.input(t0 + TIMING.settle, true)),
            ReporterStep::Report {
                adopt: vec![],
                start: None
            }
        );
    }

    #[test]
    fn a_written_status_listing_unseen_members_holds_the_takeover_then_adopts_them() {
        let mut role = ReporterRole::default();
        let view = View::of(&["a", "b"]);
        let t0 = Instant::now();
        let now = t0 + TIMING.settle;
        role.step(view.input(t0, true));
        assert_eq!(role.step(view.input(now, true)), ReporterStep::ReadWritten);
        role.read_finished::<()>(
            Ok(Some(written(&["a", "b", "c"]))),
            now,
            TIMING.takeover_grace,
        );
        let held = role.step(view.input(now, true));
        assert!(
            matches!(&held, ReporterStep::Hold { unaccounted, .. } if unaccounted == &vec!["c".to_string()]),
            "{held:?}"
        );
        let past_grace = t0 + TIMING.takeover_grace;
        match role.step(view.input(past_grace, true)) {
            ReporterStep::Report {
                adopt,
                start: Some(tenure),
            } => {
                assert_eq!(adopt.len(), 1);
                assert_eq!(adopt[0].name, "c");
                assert!(tenure.written.is_some());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_failed_read_is_tried_again_within_the_grace_and_given_up_past_it() {
        let mut role = ReporterRole::default();
        let view = View::of(&["a"]);
        let t0 = Instant::now();
        let now = t0 + TIMING.settle;
        role.step(view.input(t0, true));
        assert_eq!(role.step(view.input(now, true)), ReporterStep::ReadWritten);
        assert_eq!(
            role.read_finished(Err("unreadable"), now, TIMING.takeover_grace),
            ReadOutcome::Retry {
                at: now + READ_RETRY
            }
        );
        assert_eq!(role.step(view.input(now, true)), ReporterStep::ReadWritten);
        let late = t0 + TIMING.takeover_grace;
        assert_eq!(
            role.read_finished(Err("unreadable"), late, TIMING.takeover_grace),
            ReadOutcome::WithoutIt
        );
        assert!(matches!(
            role.step(view.input(late, true)),
            ReporterStep::Report { start: Some(_), .. }
        ));
    }

    #[test]
    fn losing_the_role_drops_the_tenure_and_a_read_that_ends_after_is_stale() {
        let mut role = ReporterRole::default();
        let view = View::of(&["a", "b"]);
        let t0 = Instant::now();
        let now = t0 + TIMING.settle;
        role.step(view.input(t0, true));
        role.step(view.input(now, true));
        assert_eq!(role.step(view.input(now, false)), ReporterStep::NotReporter);
        assert_eq!(
            role.read_finished::<()>(Ok(None), now, TIMING.takeover_grace),
            ReadOutcome::Stale
        );
    }

    #[test]
    fn every_tenure_has_a_later_term_even_in_the_same_millisecond() {
        let mut role = ReporterRole::default();
        let view = View::of(&["a"]);
        let t0 = Instant::now();
        role.step(view.input(t0, true));
        let first = take_over(&mut role, &view, t0);
        role.reset();
        let second = take_over(&mut role, &view, t0);
        let term = |step: &ReporterStep| match step {
            ReporterStep::Report {
                start: Some(tenure),
                ..
            } => tenure.term,
            other => panic!("{other:?}"),
        };
        assert_eq!(term(&first), 1_000);
        assert_eq!(term(&second), 1_001);
    }

    /// A view of one is a view still filling up: it waits as a changing one does.
    #[test]
    fn a_view_of_one_waits_for_the_settle_after_now() {
        let mut role = ReporterRole::default();
        let view = View::of(&["a"]);
        let t0 = Instant::now();
        let mut input = view.input(t0 + Duration::from_secs(5), true);
        role.step(view.input(t0, true));
        input.alone = true;
        assert!(matches!(role.step(input), ReporterStep::Settling { .. }));
    }

    #[test]
    fn members_joining_are_announced_once() {
        let mut role = ReporterRole::default();
        let first = Announced {
            members: names(&["a"]),
            lost: names(&[]),
        };
        assert!(role.announce(first.clone()).is_empty());
        let more = Announced {
            members: names(&["a", "b"]),
            lost: names(&[]),
        };
        assert_eq!(role.announce(more.clone()).len(), 1);
        assert!(role.announce(more).is_empty());
    }
}
