//! Whether a read of the fabric moves the node to another clique: a state machine fed
//! with each read and the time, with no I/O.
//!
//! - A read that fails (NVML, an unreadable topology file, a registration under way,
//!   GPUs that disagree) changes nothing and says nothing about a candidate.
//! - A node with a clique that reads the empty clique has lost its fabric, which is not
//!   a move: in no clique its IMEX has nobody to link with, and leaving would stop the
//!   IMEX its jobs use. It keeps its clique, and the read counts as failed.
//! - Another clique becomes a candidate; it is moved to when a read at least
//!   `confirm_after` later gives it again with no other clique read in between. Any
//!   other answer (the current clique back, or a third one) drops the candidate: a
//!   clique that flaps faster than that never moves the node.

use std::time::Duration;

use domaind_actors::model::CliqueId;
use tokio::time::Instant;

/// How often the fabric is read, and how long a new clique must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CliqueTiming {
    pub interval: Duration,
    /// At least this long between a new clique's first read and the read that confirms
    /// it. Never longer than `interval`.
    pub confirm_after: Duration,
}

/// The longest a new clique waits for its confirming read.
pub const CONFIRM_AFTER: Duration = Duration::from_secs(10);

impl CliqueTiming {
    /// Reads every `interval`; a new clique is confirmed [`CONFIRM_AFTER`] later, or at
    /// the next read if that comes sooner.
    pub fn every(interval: Duration) -> Self {
        Self {
            interval,
            confirm_after: CONFIRM_AFTER.min(interval),
        }
    }
}

/// A read that said nothing usable: why, in a word (a metric's label) and in full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadFailure {
    pub kind: &'static str,
    pub message: String,
}

/// What one read means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The clique the node is in.
    Same,
    /// Another clique, not confirmed yet: it must be read again after `confirm_after`.
    Candidate(CliqueId),
    /// The candidate was dropped: the read gave `read` instead (the current clique, or
    /// a third one, now the candidate).
    Flapped { dropped: CliqueId, read: CliqueId },
    /// Confirmed: the node moves.
    Move { from: CliqueId, to: CliqueId },
    /// The read failed or is not believed; the clique is kept.
    Unreadable(ReadFailure),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Candidate {
    clique: CliqueId,
    first_read: Instant,
}

#[derive(Debug, Clone)]
pub struct CliqueTracker {
    current: CliqueId,
    candidate: Option<Candidate>,
    timing: CliqueTiming,
}

impl CliqueTracker {
    pub fn new(current: CliqueId, timing: CliqueTiming) -> Self {
        Self {
            current,
            candidate: None,
            timing,
        }
    }

    pub fn current(&self) -> &CliqueId {
        &self.current
    }

    /// How long until the next read: the interval, or less while a candidate waits
    /// for its confirming read.
    pub fn next_read(&self, now: Instant) -> Duration {
        match &self.candidate {
            Some(candidate) => {
                let due = candidate.first_read + self.timing.confirm_after;
                due.saturating_duration_since(now).min(self.timing.interval)
            }
            None => self.timing.interval,
        }
    }

    /// Takes one read, made at `now`.
    pub fn observe(&mut self, read: Result<CliqueId, ReadFailure>, now: Instant) -> Verdict {
        let read = match read {
            Ok(read) if self.current.has_fabric() && !read.has_fabric() => {
                return Verdict::Unreadable(ReadFailure {
                    kind: "fabric_lost",
                    message: format!(
                        "no GPU of this node is registered with an NVLink fabric any more; \
                         it stays in clique {} until one is",
                        self.current
                    ),
                });
            }
            Ok(read) => read,
            Err(failure) => return Verdict::Unreadable(failure),
        };
        if read == self.current {
            return match self.candidate.take() {
                Some(dropped) => Verdict::Flapped {
                    dropped: dropped.clique,
                    read,
                },
                None => Verdict::Same,
            };
        }
        match self.candidate.take() {
            Some(candidate) if candidate.clique == read => {
                if now.duration_since(candidate.first_read) >= self.timing.confirm_after {
                    let from = std::mem::replace(&mut self.current, read.clone());
                    Verdict::Move { from, to: read }
                } else {
                    self.candidate = Some(candidate);
                    Verdict::Candidate(read)
                }
            }
            other => {
                self.candidate = Some(Candidate {
                    clique: read.clone(),
                    first_read: now,
                });
                match other {
                    Some(dropped) => Verdict::Flapped {
                        dropped: dropped.clique,
                        read,
                    },
                    None => Verdict::Candidate(read),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_secs(60);

    fn clique(name: &str) -> CliqueId {
        CliqueId(name.into())
    }

    fn tracker() -> (CliqueTracker, Instant) {
        (
            CliqueTracker::new(clique("a.1"), CliqueTiming::every(INTERVAL)),
            Instant::now(),
        )
    }

    fn failure() -> ReadFailure {
        ReadFailure {
            kind: "nvml",
            message: "NVML could not tell the number of GPUs".into(),
        }
    }

    #[test]
    fn the_same_clique_changes_nothing_and_reads_at_the_interval() {
        let (mut t, at) = tracker();
        assert_eq!(t.observe(Ok(clique("a.1")), at), Verdict::Same);
        assert_eq!(t.next_read(at), INTERVAL);
        assert_eq!(t.current(), &clique("a.1"));
    }

    #[test]
    fn a_new_clique_read_twice_in_a_row_far_enough_apart_is_a_move() {
        let (mut t, at) = tracker();
        assert_eq!(
            t.observe(Ok(clique("b.2")), at),
            Verdict::Candidate(clique("b.2"))
        );
        assert_eq!(t.current(), &clique("a.1"), "not moved on one read");
        // The confirming read comes sooner than the interval.
        assert_eq!(t.next_read(at), CONFIRM_AFTER);
        assert_eq!(
            t.next_read(at + Duration::from_secs(4)),
            Duration::from_secs(6)
        );
        assert_eq!(
            t.observe(Ok(clique("b.2")), at + CONFIRM_AFTER),
            Verdict::Move {
                from: clique("a.1"),
                to: clique("b.2")
            }
        );
        assert_eq!(t.current(), &clique("b.2"));
        assert_eq!(t.next_read(at + CONFIRM_AFTER), INTERVAL);
        assert_eq!(
            t.observe(Ok(clique("b.2")), at + CONFIRM_AFTER * 2),
            Verdict::Same
        );
    }

    #[test]
    fn a_confirming_read_too_soon_waits_for_a_later_one() {
        let (mut t, at) = tracker();
        t.observe(Ok(clique("b.2")), at);
        let soon = at + Duration::from_secs(1);
        assert_eq!(
            t.observe(Ok(clique("b.2")), soon),
            Verdict::Candidate(clique("b.2"))
        );
        // Counted from the first read, not the second.
        assert_eq!(t.next_read(soon), CONFIRM_AFTER - Duration::from_secs(1));
        assert!(matches!(
            t.observe(Ok(clique("b.2")), at + CONFIRM_AFTER),
            Verdict::Move { .. }
        ));
    }

    #[test]
    fn a_flapping_clique_never_moves_the_node() {
        let (mut t, at) = tracker();
        // Back and forth at every read, whatever the spacing: never two in a row.
        let mut now = at;
        for round in 0..50 {
            let read = if round % 2 == 0 { "b.2" } else { "a.1" };
            let verdict = t.observe(Ok(clique(read)), now);
            assert!(
                !matches!(verdict, Verdict::Move { .. }),
                "round {round}: {verdict:?}"
            );
            now += CONFIRM_AFTER * 3;
        }
        assert_eq!(t.current(), &clique("a.1"));
    }

    #[test]
    fn a_third_clique_replaces_the_candidate_and_starts_its_wait_afresh() {
        let (mut t, at) = tracker();
        t.observe(Ok(clique("b.2")), at);
        let later = at + CONFIRM_AFTER;
        assert_eq!(
            t.observe(Ok(clique("c.3")), later),
            Verdict::Flapped {
                dropped: clique("b.2"),
                read: clique("c.3")
            }
        );
        assert_eq!(
            t.observe(Ok(clique("b.2")), later + CONFIRM_AFTER),
            Verdict::Flapped {
                dropped: clique("c.3"),
                read: clique("b.2")
            },
            "b.2 is not confirmed across c.3"
        );
        assert!(matches!(
            t.observe(Ok(clique("b.2")), later + CONFIRM_AFTER * 2),
            Verdict::Move { .. }
        ));
    }

    #[test]
    fn the_current_clique_read_again_drops_the_candidate() {
        let (mut t, at) = tracker();
        t.observe(Ok(clique("b.2")), at);
        assert_eq!(
            t.observe(Ok(clique("a.1")), at + Duration::from_secs(5)),
            Verdict::Flapped {
                dropped: clique("b.2"),
                read: clique("a.1")
            }
        );
        assert_eq!(t.next_read(at + Duration::from_secs(5)), INTERVAL);
        assert_eq!(
            t.observe(Ok(clique("b.2")), at + CONFIRM_AFTER * 2),
            Verdict::Candidate(clique("b.2")),
            "the wait starts again"
        );
    }

    #[test]
    fn failed_reads_keep_the_clique_and_neither_confirm_nor_drop_a_candidate() {
        let (mut t, at) = tracker();
        assert_eq!(
            t.observe(Err(failure()), at),
            Verdict::Unreadable(failure())
        );
        assert_eq!(t.current(), &clique("a.1"));

        t.observe(Ok(clique("b.2")), at);
        for i in 1..5 {
            assert_eq!(
                t.observe(Err(failure()), at + CONFIRM_AFTER * i),
                Verdict::Unreadable(failure())
            );
        }
        assert!(matches!(
            t.observe(Ok(clique("b.2")), at + CONFIRM_AFTER * 5),
            Verdict::Move { .. }
        ));
    }

    #[test]
    fn losing_the_fabric_is_not_a_move() {
        let (mut t, at) = tracker();
        for i in 0..3 {
            let verdict = t.observe(Ok(CliqueId::default()), at + CONFIRM_AFTER * i);
            assert!(
                matches!(&verdict, Verdict::Unreadable(f) if f.kind == "fabric_lost"),
                "{verdict:?}"
            );
        }
        assert_eq!(t.current(), &clique("a.1"));
    }

    #[test]
    fn a_node_without_fabric_moves_into_the_clique_it_registers_in() {
        let mut t = CliqueTracker::new(CliqueId::default(), CliqueTiming::every(INTERVAL));
        let at = Instant::now();
        assert_eq!(t.observe(Ok(CliqueId::default()), at), Verdict::Same);
        t.observe(Ok(clique("a.1")), at);
        assert_eq!(
            t.observe(Ok(clique("a.1")), at + CONFIRM_AFTER),
            Verdict::Move {
                from: CliqueId::default(),
                to: clique("a.1")
            }
        );
    }

    #[test]
    fn a_short_interval_confirms_at_the_next_read() {
        let timing = CliqueTiming::every(Duration::from_secs(2));
        assert_eq!(timing.confirm_after, Duration::from_secs(2));
        let mut t = CliqueTracker::new(clique("a.1"), timing);
        let at = Instant::now();
        t.observe(Ok(clique("b.2")), at);
        assert_eq!(t.next_read(at), Duration::from_secs(2));
        assert!(matches!(
            t.observe(Ok(clique("b.2")), at + Duration::from_secs(2)),
            Verdict::Move { .. }
        ));
    }
}
