//! When the reporter writes a domain's status, as a state machine: fed what happens to
//! the StatusWriter (a document published, its flush timer, a write that landed or
//! failed, retirement), it answers with what to do ([`Effect`]).
//!
//! - A document is written once changes have been quiet for `quiet`, and never later
//!   than `max_delay` after the oldest unwritten change while they keep coming: a burst
//!   becomes one write, always of the newest document.
//! - The domain turning Ready is written at once: users and Domain-policy prepares wait
//!   for it.
//! - A Ready domain that degrades is held for `degradation_hold` (at least `quiet`;
//!   the daemon's is `ActorConfig::status_degradation_hold`, 1.5 s): a node loss shows
//!   as the node lost, then dropped from the IMEX peer set, then the survivors' IMEX
//!   daemons ready again without it. Waiting makes the whole change one write (or
//!   none, when the domain comes back as it was).
//! - A document already written is not written again: written by this writer, or, for
//!   a writer that has written nothing yet, by a predecessor that published its digest.
//! - Another node's write can land after ours: a former reporter's, in flight when the
//!   role changed hands (writes are last-writer-wins), or a successor's, written while
//!   this node was paused or cut off and so declared dead. Every writer publishes a
//!   [`Stamp`] of what it wrote: the document's digest and the writer's term. Another
//!   member's stamp changing to one whose digest is not ours means ours may have been
//!   overwritten: the current document is written again, once, even if we wrote it
//!   before. The term is what makes a successor that writes the same document as last
//!   time (the same node lost, again) visible: a digest alone would not change.
//!   Within a term a document written again keeps its stamp, so two nodes that both
//!   believe they report for a moment answer each other once, not without end.
//! - One write at a time; a failed write is retried, after the writer's backoff, with
//!   the newest document.
//! - Retired (the domain left the node), nothing more is written, and the writer ends
//!   once no write is in flight.
//! - The phase events follow the writes: one is due after a write that changes the
//!   phase as written. A phase held back that recovered was never shown to users, and a
//!   new reporter whose first document keeps the phase its predecessor wrote has no news.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::model::{NodeId, Phase};
use crate::rules::status::{DomainStatus, digest};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// (Re)arm the flush timer for `at` (at once if that has passed: a change waited
    /// its longest while a write was in flight), replacing the one armed; when it fires,
    /// call [`StatusWrites::flush`].
    Arm(Instant),
    /// Write this document, then publish its stamp and report with
    /// [`StatusWrites::finished`].
    Write { status: DomainStatus, stamp: Stamp },
    /// The first document was written by the previous reporter already: not written.
    AlreadyWritten,
    /// Another member wrote after this writer did: the current document is written
    /// even if it is the one written before.
    Rewrite,
    /// The phase as written changed: tell users.
    Announce(DomainStatus),
    /// The write failed; it is retried at the [`Effect::Arm`] that follows.
    Retry { retry_in: Duration },
    /// Retired, with no write in flight: the writer ends.
    Stop,
}

/// What a writer publishes in gossip (`status/<uid>`) once its write has landed:
/// which document, and in which term. A term is one node's tenure as reporter, named
/// by the wall-clock millisecond it began ([`next_term`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    pub digest: String,
    /// `None` for a bare digest: the last member out publishes one, and so did the
    /// versions before terms.
    pub term: Option<u64>,
}

impl Stamp {
    /// The gossip value: `<digest>.<term>`, or the bare digest.
    pub fn encode(&self) -> String {
        match self.term {
            Some(term) => format!("{}.{term}", self.digest),
            None => self.digest.clone(),
        }
    }

    /// Any value decodes: one without a well-formed term is a bare digest. Such a
    /// stamp is only ever compared, never trusted, so an odd one costs at most a
    /// write: that of a digest that is not ours.
    pub fn decode(value: &str) -> Self {
        match value
            .rsplit_once('.')
            .and_then(|(digest, term)| Some((digest, term.parse().ok()?)))
        {
            Some((digest, term)) => Self {
                digest: digest.to_owned(),
                term: Some(term),
            },
            None => Self {
                digest: value.to_owned(),
                term: None,
            },
        }
    }
}

/// The term of a node's next tenure as reporter: the wall clock, and never one it
/// used before (two tenures in one millisecond, or a clock set back).
pub fn next_term(previous: Option<u64>, now_ms: u64) -> u64 {
    previous.map_or(now_ms, |previous| now_ms.max(previous + 1))
}

/// How a write ended; a failure comes with the backoff's delay before the retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    Written,
    Failed { retry_in: Duration },
}

/// When a retiring writer ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retirement {
    /// Nothing in flight: now.
    Now,
    /// Once the write in flight has ended ([`StatusWrites::finished`] says
    /// [`Effect::Stop`]).
    AfterWrite,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusWrites {
    quiet: Duration,
    max_delay: Duration,
    degradation_hold: Duration,
    pending: Option<DomainStatus>,
    /// When the oldest unwritten change arrived.
    pending_since: Option<Instant>,
    /// The flush timer, when armed.
    due: Option<Instant>,
    /// The digest of the document last written (by whoever, for the first).
    written: Option<String>,
    /// The phase of the document last written.
    written_phase: Option<Phase>,
    writing: bool,
    /// This writer's term: in every stamp it publishes.
    term: u64,
    /// Other members' published stamps as last seen; `None` before the first look.
    others_seen: Option<BTreeMap<NodeId, Stamp>>,
    overwritten: bool,
    retired: bool,
}

impl StatusWrites {
    /// `written`: the status as last written, by whoever, when this node took the
    /// reporter role: the same document is not written again, and the phase events
    /// follow on from its phase. `term`: this tenure's, from [`next_term`].
    pub fn new(
        quiet: Duration,
        max_delay: Duration,
        written: Option<&DomainStatus>,
        term: u64,
    ) -> Self {
        Self {
            quiet,
            max_delay,
            degradation_hold: max_delay,
            pending: None,
            pending_since: None,
            due: None,
            written: written.map(digest),
            written_phase: written.map(|w| w.status),
            writing: false,
            term,
            others_seen: None,
            overwritten: false,
            retired: false,
        }
    }

    /// Holds a Ready domain's degradation this long (at least `quiet`): long enough
    /// for a dead node's IMEX peers to recover without it.
    pub fn holding_degradation(mut self, hold: Duration) -> Self {
        self.degradation_hold = hold.max(self.quiet);
        self
    }

    /// The current document (new, or the same again: it is handed over whenever the
    /// view changes). `others`: the stamps other live members publish.
    pub fn publish(
        &mut self,
        status: DomainStatus,
        others: BTreeMap<NodeId, Stamp>,
        now: Instant,
    ) -> Vec<Effect> {
        if self.retired {
            return Vec::new();
        }
        let mut effects = Vec::new();
        if self.overwritten_since_last_look(others) {
            self.overwritten = true;
            effects.push(Effect::Rewrite);
        }
        let now_ready = status.status == Phase::Ready && self.written_phase != Some(Phase::Ready);
        let degrading = status.status != Phase::Ready && self.written_phase == Some(Phase::Ready);
        self.pending = Some(status);
        let delay = if now_ready {
            Duration::ZERO
        } else if degrading {
            self.degradation_hold
        } else {
            self.quiet
        };
        effects.push(Effect::Arm(self.arm(delay, now, degrading)));
        effects
    }

    /// The flush timer fired. `written_by_someone`: whether a live member published a
    /// stamp of this digest; asked only of a writer that has written nothing yet.
    pub fn flush(&mut self, written_by_someone: impl FnOnce(&str) -> bool) -> Vec<Effect> {
        self.due = None;
        if self.writing || self.retired {
            // A write in flight re-arms the timer when it ends.
            return Vec::new();
        }
        let Some(status) = self.pending.take() else {
            return Vec::new();
        };
        self.pending_since = None;
        let fingerprint = digest(&status);
        if !self.overwritten && self.written.as_deref() == Some(fingerprint.as_str()) {
            return Vec::new();
        }
        if !self.overwritten && self.written.is_none() && written_by_someone(&fingerprint) {
            self.written = Some(fingerprint);
            self.written_phase = Some(status.status);
            return vec![Effect::AlreadyWritten];
        }
        self.writing = true;
        vec![Effect::Write {
            status,
            stamp: Stamp {
                digest: fingerprint,
                term: Some(self.term),
            },
        }]
    }

    /// The write of `status` (stamped `stamp`) ended.
    pub fn finished(
        &mut self,
        status: DomainStatus,
        stamp: Stamp,
        outcome: WriteOutcome,
        now: Instant,
    ) -> Vec<Effect> {
        self.writing = false;
        if self.retired {
            return vec![Effect::Stop];
        }
        let mut effects = Vec::new();
        match outcome {
            WriteOutcome::Written => {
                self.overwritten = false;
                self.written = Some(stamp.digest);
                if self.written_phase != Some(status.status) {
                    self.written_phase = Some(status.status);
                    effects.push(Effect::Announce(status));
                }
                if self.pending.is_some() {
                    effects.push(Effect::Arm(self.arm(self.quiet, now, false)));
                }
            }
            WriteOutcome::Failed { retry_in } => {
                effects.push(Effect::Retry { retry_in });
                // Retry with the newest document, whichever that is.
                self.pending.get_or_insert(status);
                effects.push(Effect::Arm(self.arm(retry_in, now, false)));
            }
        }
        effects
    }

    /// The domain left this node: what is not written yet is dropped.
    pub fn retire(&mut self) -> Retirement {
        self.retired = true;
        self.pending = None;
        self.pending_since = None;
        self.due = None;
        if self.writing {
            Retirement::AfterWrite
        } else {
            Retirement::Now
        }
    }

    /// When the flush timer is due, if armed.
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// `delay` from now, but never later than `max_delay` (for a degradation held,
    /// `degradation_hold`) after the oldest unwritten change.
    fn arm(&mut self, delay: Duration, now: Instant, held: bool) -> Instant {
        let since = *self.pending_since.get_or_insert(now);
        let cap = if held {
            self.degradation_hold
        } else {
            self.max_delay
        };
        let at = (now + delay).min(since + cap);
        self.due = Some(at);
        at
    }

    /// Whether another member published a stamp, since we last looked, of a document
    /// that is not the one we wrote: its write may have landed after ours.
    fn overwritten_since_last_look(&mut self, others: BTreeMap<NodeId, Stamp>) -> bool {
        let overwritten = match (&self.others_seen, &self.written) {
            (Some(seen), Some(written)) => others
                .iter()
                .any(|(node, stamp)| seen.get(node) != Some(stamp) && stamp.digest != *written),
            _ => false,
        };
        self.others_seen = Some(others);
        overwritten
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    const QUIET: Duration = Duration::from_millis(400);
    const MAX_DELAY: Duration = Duration::from_secs(3);
    const TERM: u64 = 1_700_000_000_000;

    /// Another member's stamp of `status`, written in `term`.
    fn stamp(status: &DomainStatus, term: u64) -> Stamp {
        Stamp {
            digest: digest(status),
            term: Some(term),
        }
    }

    /// A document: `ready` of `total` ready, the others lost.
    fn doc(ready: u32, total: u32) -> DomainStatus {
        DomainStatus {
            status: if ready == total {
                Phase::Ready
            } else {
                Phase::NotReady
            },
            ready_nodes: ready,
            total_nodes: total,
            message: format!("{ready}/{total} nodes ready"),
            nodes: Vec::new(),
            channel: None,
        }
    }

    /// The writer with a status sink and gossip around it, in simulated time.
    struct Sim {
        writes: StatusWrites,
        now: Instant,
        in_flight: Option<(DomainStatus, Stamp)>,
        /// Documents written, with when their write started.
        landed: Vec<(Instant, DomainStatus)>,
        announced: Vec<Phase>,
        /// The phase of the status as written, as users see it.
        phase_written: Option<Phase>,
        /// The newest document published.
        newest: Option<DomainStatus>,
        /// The digest of the status as written, as far as this writer knows.
        written_digest: Option<String>,
        /// Other members' stamps when this writer last looked (published).
        others_looked: Option<BTreeMap<NodeId, Stamp>>,
        rewrites_since_landed: bool,
        last_landed: Option<String>,
        /// Digests published in gossip, by this writer and by others.
        published: BTreeSet<String>,
        others: BTreeMap<NodeId, Stamp>,
        started_at: Option<Instant>,
        retired: bool,
        stopped: bool,
    }

    impl Sim {
        fn new(written: Option<&DomainStatus>) -> Self {
            Self {
                writes: StatusWrites::new(QUIET, MAX_DELAY, written, TERM),
                now: Instant::now(),
                in_flight: None,
                landed: Vec::new(),
                announced: Vec::new(),
                phase_written: written.map(|w| w.status),
                newest: None,
                written_digest: written.map(digest),
                others_looked: None,
                rewrites_since_landed: false,
                last_landed: None,
                published: written.map(digest).into_iter().collect(),
                others: BTreeMap::new(),
                started_at: None,
                retired: false,
                stopped: false,
            }
        }

        fn apply(&mut self, effects: Vec<Effect>) {
            for effect in effects {
                assert!(!self.stopped, "{effect:?} after the writer stopped");
                match effect {
                    Effect::Arm(at) => assert_eq!(self.writes.due(), Some(at)),
                    Effect::Write { status, stamp } => {
                        assert!(!self.retired, "a write after retiring");
                        assert!(self.in_flight.is_none(), "two writes in flight");
                        assert_eq!(
                            stamp,
                            Stamp {
                                digest: digest(&status),
                                term: Some(TERM)
                            }
                        );
                        assert!(
                            self.last_landed.as_ref() != Some(&stamp.digest)
                                || self.rewrites_since_landed,
                            "the same document written twice with nobody writing in between"
                        );
                        self.in_flight = Some((status, stamp));
                        self.started_at = Some(self.now);
                    }
                    Effect::Rewrite => self.rewrites_since_landed = true,
                    Effect::Announce(status) => {
                        assert_ne!(self.announced.last(), Some(&status.status));
                        self.announced.push(status.status);
                    }
                    Effect::AlreadyWritten => {
                        self.phase_written = self.newest.as_ref().map(|n| n.status);
                        self.written_digest = self.newest.as_ref().map(digest);
                    }
                    Effect::Stop => {
                        assert!(self.retired && self.in_flight.is_none());
                        self.stopped = true;
                    }
                    Effect::Retry { .. } => {}
                }
            }
            // A document waiting is never stranded without a timer.
            let w = &self.writes;
            if w.pending.is_some() && !w.writing && !w.retired {
                assert!(w.due.is_some(), "a pending document with no timer armed");
            }
            if let (Some(due), Some(since)) = (w.due, w.pending_since) {
                assert!(due <= since + MAX_DELAY, "held past the maximum delay");
            }
        }

        fn publish(&mut self, status: DomainStatus) -> Vec<Effect> {
            let effects = self
                .writes
                .publish(status.clone(), self.others.clone(), self.now);
            if !self.retired {
                self.newest = Some(status);
                // Rewritten exactly when another member's stamp changed since the last
                // look to one of a document that is not ours.
                let overwritten = match (&self.others_looked, &self.written_digest) {
                    (Some(looked), Some(ours)) => self
                        .others
                        .iter()
                        .any(|(node, s)| looked.get(node) != Some(s) && s.digest != *ours),
                    _ => false,
                };
                assert_eq!(effects.contains(&Effect::Rewrite), overwritten);
                self.others_looked = Some(self.others.clone());
            }
            self.apply(effects.clone());
            effects
        }

        /// Lets time pass until `until`, firing the flush timer when it is due.
        fn advance(&mut self, until: Instant) {
            while let Some(due) = self.writes.due()
                && due <= until
            {
                self.now = self.now.max(due);
                let published = &self.published;
                let effects = self.writes.flush(|d| published.contains(d));
                self.apply(effects);
            }
            self.now = self.now.max(until);
        }

        fn land(&mut self, ok: bool) {
            let Some((status, stamp)) = self.in_flight.take() else {
                return;
            };
            let phase = status.status;
            let outcome = if ok {
                self.landed.push((self.started_at.unwrap(), status.clone()));
                self.last_landed = Some(stamp.digest.clone());
                self.written_digest = Some(stamp.digest.clone());
                self.rewrites_since_landed = false;
                self.published.insert(stamp.digest.clone());
                WriteOutcome::Written
            } else {
                WriteOutcome::Failed {
                    retry_in: Duration::from_millis(200),
                }
            };
            let effects = self.writes.finished(status, stamp, outcome, self.now);
            if ok && !self.retired {
                let announced = effects.iter().any(|e| matches!(e, Effect::Announce(_)));
                assert_eq!(
                    announced,
                    self.phase_written != Some(phase),
                    "a phase event is due exactly when the phase as written changes"
                );
                self.phase_written = Some(phase);
            }
            self.apply(effects);
        }

        /// Writes land as soon as they start, until nothing is left to do.
        fn settle(&mut self) {
            loop {
                self.land(true);
                match self.writes.due() {
                    Some(due) => self.advance(due),
                    None if self.in_flight.is_none() => return,
                    None => {}
                }
            }
        }
    }

    #[test]
    fn ready_is_written_at_once_and_a_burst_once_quiet() {
        let mut sim = Sim::new(None);
        let t0 = sim.now;
        assert_eq!(sim.publish(doc(1, 3)), vec![Effect::Arm(t0 + QUIET)]);
        sim.advance(t0 + Duration::from_millis(300));
        assert_eq!(
            sim.publish(doc(2, 3)),
            vec![Effect::Arm(t0 + Duration::from_millis(700))]
        );
        sim.settle();
        assert_eq!(
            sim.landed,
            vec![(t0 + Duration::from_millis(700), doc(2, 3))]
        );
        let t1 = sim.now;
        assert_eq!(sim.publish(doc(3, 3)), vec![Effect::Arm(t1)]);
        sim.settle();
        assert_eq!(sim.landed.last(), Some(&(t1, doc(3, 3))));
        assert_eq!(sim.announced, vec![Phase::NotReady, Phase::Ready]);
    }

    #[test]
    fn changes_that_keep_coming_are_written_every_max_delay() {
        let mut sim = Sim::new(None);
        let t0 = sim.now;
        for i in 0..10u32 {
            sim.advance(t0 + Duration::from_millis(300) * i);
            sim.publish(doc(i % 3, 3));
            sim.land(true);
        }
        sim.settle();
        assert_eq!(sim.landed, vec![(t0 + MAX_DELAY, doc(0, 3))]);
    }

    #[test]
    fn a_degradation_is_held_for_the_hold_even_past_the_maximum_delay() {
        let t0 = Instant::now();
        let hold = MAX_DELAY + Duration::from_secs(2);
        let mut writes =
            StatusWrites::new(QUIET, MAX_DELAY, Some(&doc(3, 3)), TERM).holding_degradation(hold);
        // Links drop: held for the whole hold, not cut at the maximum delay.
        assert_eq!(
            writes.publish(doc(2, 3), BTreeMap::new(), t0),
            vec![Effect::Arm(t0 + hold)]
        );
        // Gossip's verdict and the recovery come within it: still due at the same time.
        assert_eq!(
            writes.publish(doc(2, 3), BTreeMap::new(), t0 + MAX_DELAY),
            vec![Effect::Arm(t0 + hold)]
        );
        // Changes that are no degradation keep the maximum delay.
        let mut writes =
            StatusWrites::new(QUIET, MAX_DELAY, Some(&doc(2, 3)), TERM).holding_degradation(hold);
        assert_eq!(
            writes.publish(doc(1, 3), BTreeMap::new(), t0),
            vec![Effect::Arm(t0 + QUIET)]
        );
        // A hold shorter than the quiet time is the quiet time.
        let writes = StatusWrites::new(QUIET, MAX_DELAY, None, TERM)
            .holding_degradation(Duration::from_millis(100));
        assert_eq!(writes.degradation_hold, QUIET);
    }

    #[test]
    fn a_document_written_by_the_previous_reporter_is_not_written_again() {
        let written = doc(3, 3);
        // Taking over with the status as written.
        let mut sim = Sim::new(Some(&written));
        sim.publish(written.clone());
        sim.settle();
        assert!(sim.landed.is_empty() && sim.announced.is_empty());

        // Not read at the takeover, but published as written in gossip.
        let mut sim = Sim::new(None);
        sim.published.insert(digest(&written));
        sim.publish(written.clone());
        sim.advance(sim.now + MAX_DELAY);
        assert!(sim.landed.is_empty() && sim.in_flight.is_none());
        // Its phase is the one written: nothing to announce.
        sim.publish(doc(3, 3));
        sim.settle();
        assert!(sim.announced.is_empty());
    }

    #[test]
    fn a_former_reporters_late_write_is_written_over() {
        let mut sim = Sim::new(None);
        sim.publish(doc(3, 3));
        sim.settle();
        assert_eq!(sim.landed.len(), 1);
        // The former reporter's write lands after ours, and it publishes its digest.
        sim.others.insert("former".into(), stamp(&doc(2, 3), 1));
        assert_eq!(sim.publish(doc(3, 3))[0], Effect::Rewrite);
        sim.settle();
        assert_eq!(sim.landed.len(), 2);
        assert_eq!(sim.landed[1].1, doc(3, 3));
        // Seen once, it is no news the next time.
        assert!(!sim.publish(doc(3, 3)).contains(&Effect::Rewrite));
        sim.settle();
        assert_eq!(sim.landed.len(), 2);
        // Another member publishing what we wrote is no late write.
        sim.others.insert("former".into(), stamp(&doc(3, 3), 1));
        assert!(!sim.publish(doc(3, 3)).contains(&Effect::Rewrite));
        sim.settle();
        assert_eq!(sim.landed.len(), 2);
    }

    #[test]
    fn a_failed_write_is_retried_with_the_newest_document() {
        let mut sim = Sim::new(None);
        let t0 = sim.now;
        sim.publish(doc(1, 3));
        sim.advance(t0 + QUIET);
        sim.publish(doc(2, 3));
        sim.land(false);
        assert_eq!(
            sim.writes.due(),
            Some(t0 + QUIET + Duration::from_millis(200))
        );
        sim.settle();
        assert_eq!(
            sim.landed,
            vec![(t0 + QUIET + Duration::from_millis(200), doc(2, 3))]
        );
    }

    #[test]
    fn a_retired_writer_writes_nothing_more() {
        let mut sim = Sim::new(None);
        sim.publish(doc(1, 1));
        sim.retired = true;
        assert_eq!(sim.writes.retire(), Retirement::Now);
        assert!(sim.publish(doc(1, 1)).is_empty());
        sim.advance(sim.now + MAX_DELAY * 2);
        assert!(sim.landed.is_empty());

        // With a write in flight, it ends once the write has.
        let mut sim = Sim::new(None);
        sim.publish(doc(1, 1));
        sim.advance(sim.now);
        assert!(sim.in_flight.is_some());
        sim.retired = true;
        assert_eq!(sim.writes.retire(), Retirement::AfterWrite);
        sim.land(false);
        assert!(sim.stopped);
    }

    #[test]
    fn stamps_round_trip_and_any_value_decodes() {
        let stamped = stamp(&doc(2, 3), TERM);
        assert_eq!(Stamp::decode(&stamped.encode()), stamped);
        let bare = Stamp {
            digest: digest(&doc(2, 3)),
            term: None,
        };
        assert_eq!(bare.encode(), digest(&doc(2, 3)));
        assert_eq!(Stamp::decode(&bare.encode()), bare);
        for odd in ["", ".", "abc.", "abc.x1", "a.b.c"] {
            assert_eq!(Stamp::decode(odd).term, None, "{odd:?}");
            assert_eq!(Stamp::decode(odd).digest, odd);
        }
        assert_eq!(Stamp::decode("a.b.7").digest, "a.b");
    }

    #[test]
    fn every_term_is_new() {
        assert_eq!(next_term(None, 5), 5);
        assert_eq!(next_term(Some(3), 5), 5);
        assert_eq!(next_term(Some(5), 5), 6);
        // The clock set back.
        assert_eq!(next_term(Some(9), 5), 10);
    }

    /// Reporters over one status store and one gossip view, in simulated time: writes
    /// land at once and publish their stamp, as the actor does.
    struct World {
        now: Instant,
        writers: BTreeMap<NodeId, StatusWrites>,
        store: Vec<(NodeId, DomainStatus)>,
        /// Each node's `status/<uid>` value.
        gossip: BTreeMap<NodeId, String>,
    }

    impl World {
        fn new() -> Self {
            Self {
                now: Instant::now(),
                writers: BTreeMap::new(),
                store: Vec::new(),
                gossip: BTreeMap::new(),
            }
        }

        /// `node` takes the reporter role in `term`, with the status as written.
        fn take_over(&mut self, node: &str, term: u64) {
            let written = self.store.last().map(|(_, status)| status.clone());
            let writes = StatusWrites::new(QUIET, MAX_DELAY, written.as_ref(), term);
            self.writers.insert(node.to_owned(), writes);
        }

        /// `node` hands its writer the current document, as on every change of its
        /// view, and lets time pass until its writer has nothing left to do. Returns
        /// how many writes it made.
        fn report(&mut self, node: &str, status: DomainStatus) -> usize {
            let Self {
                now,
                writers,
                store,
                gossip,
            } = self;
            let others = gossip
                .iter()
                .filter(|(other, _)| *other != node)
                .map(|(other, value)| (other.clone(), Stamp::decode(value)))
                .collect();
            let writer = writers.get_mut(node).expect("a reporter");
            let mut effects = writer.publish(status, others, *now);
            let mut writes = 0;
            loop {
                let mut next = Vec::new();
                for effect in effects {
                    if let Effect::Write { status, stamp } = effect {
                        store.push((node.to_owned(), status.clone()));
                        gossip.insert(node.to_owned(), stamp.encode());
                        writes += 1;
                        next.extend(writer.finished(status, stamp, WriteOutcome::Written, *now));
                    }
                }
                if next.is_empty() {
                    let Some(due) = writer.due() else {
                        return writes;
                    };
                    *now = (*now).max(due);
                    next = writer.flush(|d| gossip.values().any(|v| Stamp::decode(v).digest == d));
                }
                effects = next;
            }
        }
    }

    /// Found by the chaos harness: the reporter paused, its successor wrote it lost,
    /// the reporter resumed with a view that had not changed. The successor writes the
    /// same document every time: a digest alone looked the same after the second
    /// pause, and the stale NotReady stayed until something else changed.
    #[test]
    fn a_successor_writing_the_same_document_again_is_written_over_each_time() {
        let (truth, lost) = (doc(3, 3), doc(2, 3));
        let mut world = World::new();
        world.take_over("node-a", TERM);
        assert_eq!(world.report("node-a", truth.clone()), 1);
        for pause in 1..=3u64 {
            world.take_over("node-b", TERM + 10_000 * pause);
            assert_eq!(world.report("node-b", lost.clone()), 1);
            // node-a is back: node-b steps down.
            world.writers.remove("node-b");
            assert_eq!(world.report("node-a", truth.clone()), 1, "pause {pause}");
            assert_eq!(world.store.last(), Some(&("node-a".into(), truth.clone())));
            // Answered once.
            assert_eq!(world.report("node-a", truth.clone()), 0);
        }
    }

    /// A partition healing: both sides reported, and each sees the other's write
    /// before one of them steps down. One answer, not a write storm.
    #[test]
    fn two_nodes_that_both_report_answer_each_other_once() {
        let mut world = World::new();
        world.take_over("node-a", TERM);
        world.take_over("node-b", TERM + 1);
        assert_eq!(world.report("node-a", doc(3, 3)), 1);
        assert_eq!(world.report("node-b", doc(1, 3)), 1);
        let mut writes = Vec::new();
        for _ in 0..5 {
            writes.push((
                world.report("node-a", doc(3, 3)),
                world.report("node-b", doc(1, 3)),
            ));
        }
        assert_eq!(writes, [(1, 0), (0, 0), (0, 0), (0, 0), (0, 0)]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// (c) A Ready domain that degrades (links drop, then gossip's verdict, then the
        /// peer set without the node: any number of documents within the hold) is one
        /// write, of the last document, `max_delay` after the first; and none when it
        /// comes back as it was.
        #[test]
        fn a_ready_domains_degradation_is_one_write(
            mut offsets in proptest::collection::vec(0u64..3_000, 1..8),
            ready in proptest::collection::vec(0u32..17, 8),
            heals in any::<bool>(),
        ) {
            let mut sim = Sim::new(None);
            sim.publish(doc(18, 18));
            sim.settle();
            let t0 = sim.now;
            offsets.sort_unstable();
            let mut last = doc(18, 18);
            for (i, offset) in offsets.iter().enumerate() {
                sim.advance(t0 + Duration::from_millis(*offset));
                last = if heals && i + 1 == offsets.len() {
                    doc(18, 18)
                } else {
                    doc(ready[i], 18 - u32::from(i % 2 == 1))
                };
                sim.publish(last.clone());
                // Nothing is written during the hold.
                prop_assert!(sim.in_flight.is_none());
            }
            sim.settle();
            let after: Vec<_> = sim.landed[1..].to_vec();
            if heals {
                prop_assert!(after.is_empty(), "{:?}", after);
                prop_assert_eq!(&sim.announced, &vec![Phase::Ready]);
            } else {
                prop_assert_eq!(after, vec![(t0 + Duration::from_millis(offsets[0]) + MAX_DELAY, last)]);
                prop_assert_eq!(&sim.announced, &vec![Phase::Ready, Phase::NotReady]);
            }
        }

        /// A reporter whose successors come and go (each in a term of its own, writing
        /// whatever it sees, maybe what was written already) has the last word once it
        /// looks again, with one write per document or foreign write to answer, and
        /// none when neither came.
        #[test]
        fn the_reporter_has_the_last_word(
            ops in proptest::collection::vec((0u8..3, 0u32..4), 1..40),
        ) {
            let mut world = World::new();
            world.take_over("node-a", TERM);
            let mut current = doc(3, 3);
            prop_assert_eq!(world.report("node-a", current.clone()), 1);
            let mut term = TERM;
            for (kind, n) in ops {
                let before = world.store.len();
                match kind {
                    0 => {
                        current = doc(n, 3);
                        let writes = world.report("node-a", current.clone());
                        prop_assert!(writes <= 1);
                    }
                    1 => {
                        term += 1_000;
                        world.take_over("node-b", term);
                        prop_assert!(world.report("node-b", doc(n, 3)) <= 1);
                        world.writers.remove("node-b");
                    }
                    _ => {
                        let written = world.store.last().map(|(_, s)| s.clone());
                        let writes = world.report("node-a", current.clone());
                        prop_assert_eq!(writes, usize::from(written.as_ref() != Some(&current)));
                    }
                }
                prop_assert!(world.store.len() <= before + 1);
            }
            world.report("node-a", current.clone());
            prop_assert_eq!(world.store.last().map(|(_, s)| s), Some(&current));
        }


        /// writers and retirement: the checks in `Sim::apply` hold throughout (one
        /// write at a time, nothing after retiring, no stranded document, nothing held
        /// past the maximum delay, no document written twice in a row unless someone
        /// wrote in between, phase events only on a change), and once writes land, the
        /// newest document is the one written.
        #[test]
        fn writer_histories_keep_their_invariants(
            written in proptest::option::of(0u32..4),
            ops in proptest::collection::vec((0u8..6, 0u32..4, 0u64..4_000), 1..60),
        ) {
            let written = written.map(|r| doc(r, 3));
            let mut sim = Sim::new(written.as_ref());
            let mut newest = written.clone();
            for (kind, n, ms) in ops {
                match kind {
                    0 | 1 => {
                        let status = doc(n, 3);
                        let phase_written = sim.phase_written;
                        let effects = sim.publish(status.clone());
                        if !sim.retired {
                            newest = Some(status.clone());
                            if status.status == Phase::Ready && phase_written != Some(Phase::Ready) {
                                let at_once = effects.iter().any(|e| matches!(e, Effect::Arm(at) if *at <= sim.now));
                                prop_assert!(at_once, "Ready not written at once: {:?}", effects);
                            }
                        }
                    }
                    2 => sim.advance(sim.now + Duration::from_millis(ms)),
                    3 => sim.land(ms % 4 != 0),
                    4 => {
                        let written = doc(n, 3);
                        sim.published.insert(digest(&written));
                        sim.others.insert(format!("other-{}", ms % 2), stamp(&written, ms % 3));
                    }
                    _ => {
                        if ms % 8 == 0 && !sim.retired {
                            sim.retired = true;
                            match sim.writes.retire() {
                                Retirement::Now => {
                                    prop_assert!(sim.in_flight.is_none());
                                    sim.stopped = true;
                                }
                                Retirement::AfterWrite => prop_assert!(sim.in_flight.is_some()),
                            }
                        }
                    }
                }
            }
            if sim.retired {
                sim.land(true);
                prop_assert!(sim.stopped);
            } else {
                sim.settle();
                prop_assert!(sim.writes.pending.is_none() && !sim.writes.writing);
                prop_assert_eq!(sim.writes.written.clone(), newest.as_ref().map(digest));
            }
        }
    }
}
