//! When this node's channel devices carry the IMEX-failing taint (pure).
//!
//! The input is the node's [`HealthView::imex_failing`](domaind_actors::HealthView):
//! set while this node's IMEX daemon is down or not ready within a failure episode.
//! Tainting every channel device `NoSchedule` keeps the scheduler from allocating them
//! to new claims; pods already running keep theirs (a `NoSchedule` taint evicts
//! nobody).
//!
//! Both edges wait, so that a node does not flap in and out of the scheduler's choice:
//!
//! - **Taint** when the daemon is failing now and its *first failure* was at least
//!   `after` (5 s) ago. The first failure is the start of the run of failures not
//!   since followed by `clear_after` of health: a daemon that crashes, comes back ready
//!   for a moment and crashes again is one run. One crash restarted within `after`
//!   (the restart backoff starts at 200 ms) taints nothing.
//! - **Untaint** once the daemon has not been failing for `clear_after` (30 s) in a
//!   row: three times the 10 s IMEX must stay up before its supervisor calls the
//!   episode over.
//!
//! A daemon that restarts finds its slices still tainted by the process before it
//! ([`TaintRule::inherited`]) and keeps the taint until `clear_after` of health: a
//! restart is no evidence that IMEX recovered.

use std::time::Duration;

use tokio::time::Instant;

/// The taint's key under the driver's name: `<driver>/imex-failing`.
pub const TAINT_NAME: &str = "imex-failing";

/// What the scheduler does with an untolerated tainted device: allocates it to no new
/// claim. `NoExecute` would also evict the pods using it, which a failing IMEX does
/// not call for: their imports may be fine, and the pods may outlive the failure.
pub const TAINT_EFFECT: &str = "NoSchedule";

/// A label value's limit (a taint's value must be one).
const VALUE_LIMIT: usize = 63;

/// The taint's key for `driver`.
pub fn taint_key(driver: &str) -> String {
    format!("{driver}/{TAINT_NAME}")
}

/// How long each edge waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaintTiming {
    /// From the first failure of a run to the taint (0: at the first failure).
    pub after: Duration,
    /// Health in a row before the taint goes.
    pub clear_after: Duration,
}

impl Default for TaintTiming {
    fn default() -> Self {
        Self {
            after: Duration::from_secs(5),
            clear_after: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Clear,
    /// Failures seen since `since`, not for long enough yet.
    Failing {
        since: Instant,
        healthy_since: Option<Instant>,
    },
    Tainted {
        since: Instant,
        healthy_since: Option<Instant>,
    },
}

/// What changed: publish or withdraw the taint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaintChange {
    Taint {
        /// The run's first failure's reason.
        reason: String,
        /// How long since that failure.
        failing_for: Duration,
    },
    Untaint {
        /// How long the taint was on (in this process).
        tainted_for: Duration,
    },
}

/// The rule's state: feed it every change of the input, and again at its
/// [`deadline`](Self::deadline).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaintRule {
    timing: TaintTiming,
    phase: Phase,
    /// The run's first failure's reason.
    reason: Option<String>,
}

impl TaintRule {
    pub fn new(timing: TaintTiming) -> Self {
        Self {
            timing,
            phase: Phase::Clear,
            reason: None,
        }
    }

    /// A rule that starts tainted: the slices carry our taint from a process before
    /// this one, for `reason` (the taint's value).
    pub fn inherited(timing: TaintTiming, reason: impl Into<String>, now: Instant) -> Self {
        Self {
            timing,
            phase: Phase::Tainted {
                since: now,
                healthy_since: None,
            },
            reason: Some(reason.into()),
        }
    }

    pub fn is_tainted(&self) -> bool {
        matches!(self.phase, Phase::Tainted { .. })
    }

    /// Takes the input as it is at `now`: `failing` is this node's IMEX failure's
    /// reason, or none while it is not failing.
    pub fn observe(&mut self, failing: Option<&str>, now: Instant) -> Option<TaintChange> {
        match &mut self.phase {
            Phase::Clear => {
                let reason = failing?;
                self.reason = Some(reason.to_owned());
                self.phase = Phase::Failing {
                    since: now,
                    healthy_since: None,
                };
            }
            Phase::Failing { healthy_since, .. } | Phase::Tainted { healthy_since, .. } => {
                if failing.is_some() {
                    *healthy_since = None;
                } else {
                    let healthy = *healthy_since.get_or_insert(now);
                    if now.duration_since(healthy) >= self.timing.clear_after {
                        let was = std::mem::replace(&mut self.phase, Phase::Clear);
                        self.reason = None;
                        return match was {
                            Phase::Tainted { since, .. } => Some(TaintChange::Untaint {
                                tainted_for: now.duration_since(since),
                            }),
                            Phase::Clear | Phase::Failing { .. } => None,
                        };
                    }
                }
            }
        }
        match self.phase {
            Phase::Failing { since, .. }
                if failing.is_some() && now.duration_since(since) >= self.timing.after =>
            {
                self.phase = Phase::Tainted {
                    since: now,
                    healthy_since: None,
                };
                Some(TaintChange::Taint {
                    reason: self.reason.clone().unwrap_or_default(),
                    failing_for: now.duration_since(since),
                })
            }
            _ => None,
        }
    }

    /// When to observe again with an unchanged input: the moment an edge is due. None
    /// while only a change of the input can change anything.
    pub fn deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::Clear => None,
            Phase::Failing {
                healthy_since: Some(healthy),
                ..
            }
            | Phase::Tainted {
                healthy_since: Some(healthy),
                ..
            } => Some(healthy + self.timing.clear_after),
            Phase::Failing {
                since,
                healthy_since: None,
            } => Some(since + self.timing.after),
            Phase::Tainted {
                healthy_since: None,
                ..
            } => None,
        }
    }
}

/// The taint's value: a failure's reason cut to its first clause, as a label value
/// (at most 63 of `[A-Za-z0-9._-]`, alphanumeric at both ends), lower-cased. The
/// whole reason goes in the event.
pub fn short_cause(reason: &str) -> String {
    let first = reason
        .split([',', ';', '(', '\n'])
        .next()
        .unwrap_or_default();
    let first = first.split(": ").next().unwrap_or_default();
    let mut value = String::new();
    for c in first.chars() {
        let c = if c.is_ascii_alphanumeric() || matches!(c, '.' | '_') {
            c.to_ascii_lowercase()
        } else {
            '-'
        };
        if !(c == '-' && value.ends_with('-')) {
            value.push(c);
        }
    }
    let edge = |c: char| !c.is_ascii_alphanumeric();
    let mut value = value.trim_matches(edge).to_owned();
    if value.len() > VALUE_LIMIT {
        value.truncate(VALUE_LIMIT);
        value = value.trim_end_matches(edge).to_owned();
    }
    if value.is_empty() {
        "failing".into()
    } else {
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn rule() -> (TaintRule, Instant) {
        (TaintRule::new(TaintTiming::default()), Instant::now())
    }

    #[test]
    fn a_failure_that_lasts_taints_after_five_seconds_and_clears_after_thirty_healthy() {
        let (mut rule, t0) = rule();
        assert_eq!(rule.observe(Some("exited with status 1"), t0), None);
        assert_eq!(rule.deadline(), Some(t0 + 5 * S));
        assert_eq!(rule.observe(Some("exited with status 1"), t0 + 4 * S), None);
        assert_eq!(
            rule.observe(Some("exited again"), t0 + 5 * S),
            Some(TaintChange::Taint {
                reason: "exited with status 1".into(),
                failing_for: 5 * S,
            }),
            "the run's first reason"
        );
        assert!(rule.is_tainted());
        assert_eq!(rule.deadline(), None, "only the input can end a taint");
        assert_eq!(rule.observe(None, t0 + 60 * S), None);
        assert_eq!(rule.deadline(), Some(t0 + 90 * S));
        assert_eq!(rule.observe(None, t0 + 89 * S), None);
        assert_eq!(
            rule.observe(None, t0 + 90 * S),
            Some(TaintChange::Untaint {
                tainted_for: 85 * S
            })
        );
        assert_eq!((rule.is_tainted(), rule.deadline()), (false, None));
    }

    #[test]
    fn one_crash_restarted_at_once_taints_nothing() {
        let (mut rule, t0) = rule();
        rule.observe(Some("exited"), t0);
        assert_eq!(rule.observe(None, t0 + S), None);
        // Nothing is due at the taint's time any more: only the run's end.
        assert_eq!(rule.deadline(), Some(t0 + 31 * S));
        assert_eq!(rule.observe(None, t0 + 31 * S), None);
        assert_eq!((rule.is_tainted(), rule.deadline()), (false, None));
        // The next failure starts a run of its own.
        rule.observe(Some("exited"), t0 + 40 * S);
        assert_eq!(rule.deadline(), Some(t0 + 45 * S));
    }

    #[test]
    fn a_daemon_ready_between_crashes_is_one_run_and_is_tainted() {
        let (mut rule, t0) = rule();
        let mut changes = Vec::new();
        // Down 2 s, ready 1 s, again and again: never 5 s down in a row.
        for cycle in 0..4 {
            let down = t0 + 3 * cycle * S;
            changes.extend(rule.observe(Some("exited"), down));
            changes.extend(rule.observe(None, down + 2 * S));
        }
        assert_eq!(
            changes,
            vec![TaintChange::Taint {
                reason: "exited".into(),
                failing_for: 6 * S,
            }],
            "tainted at the first failure 5 s or more after the run began"
        );
    }

    #[test]
    fn flapping_health_never_untaints_before_thirty_seconds_in_a_row() {
        let (mut rule, t0) = rule();
        rule.observe(Some("down"), t0);
        rule.observe(Some("down"), t0 + 5 * S);
        assert!(rule.is_tainted());
        // Healthy 20 s, failing a moment, healthy 20 s: still tainted.
        assert_eq!(rule.observe(None, t0 + 10 * S), None);
        assert_eq!(rule.observe(Some("down"), t0 + 30 * S), None);
        assert_eq!(rule.observe(None, t0 + 31 * S), None);
        assert_eq!(rule.observe(None, t0 + 60 * S), None);
        assert!(rule.is_tainted());
        assert!(matches!(
            rule.observe(None, t0 + 61 * S),
            Some(TaintChange::Untaint { .. })
        ));
    }

    #[test]
    fn at_once_when_asked() {
        let mut rule = TaintRule::new(TaintTiming {
            after: Duration::ZERO,
            clear_after: 10 * S,
        });
        let t0 = Instant::now();
        assert!(matches!(
            rule.observe(Some("down"), t0),
            Some(TaintChange::Taint { .. })
        ));
    }

    #[test]
    fn an_inherited_taint_stays_until_the_daemon_has_been_healthy_long_enough() {
        let t0 = Instant::now();
        let mut rule = TaintRule::inherited(TaintTiming::default(), "exited", t0);
        assert!(rule.is_tainted());
        assert_eq!(rule.observe(None, t0), None);
        assert_eq!(rule.observe(None, t0 + 29 * S), None);
        assert_eq!(
            rule.observe(None, t0 + 30 * S),
            Some(TaintChange::Untaint {
                tainted_for: 30 * S
            })
        );
        // Failing again at once after the restart: it stays.
        let mut rule = TaintRule::inherited(TaintTiming::default(), "exited", t0);
        rule.observe(None, t0);
        assert_eq!(rule.observe(Some("exited"), t0 + S), None);
        assert_eq!(rule.deadline(), None);
        assert!(rule.is_tainted());
    }

    #[test]
    fn short_causes_are_label_values() {
        for (reason, want) in [
            (
                "exited with status 1, after 0.3 s up",
                "exited-with-status-1",
            ),
            (
                "IMEX cannot listen on 127.0.0.5:50000 (SERVER_PORT): in use; held by pid 7",
                "imex-cannot-listen-on-127.0.0.5-50000",
            ),
            ("no IMEX binary: /usr/bin/nvidia-imex", "no-imex-binary"),
            ("  ", "failing"),
            ("---", "failing"),
            ("exited (no reason known)", "exited"),
        ] {
            assert_eq!(short_cause(reason), want, "{reason}");
        }
        let long = short_cause(&format!("{} x", "a.".repeat(100)));
        assert!(long.len() <= VALUE_LIMIT, "{long}");
        assert!(long.ends_with('a') && long.starts_with('a'), "{long}");
    }
}
