//! When the IMEX daemon's status is asked for next.
//!
//! Each question spawns the status tool (once, twice when the daemon is not ready),
//! so asking four times a second on every idle node is most of what an idle node
//! costs. Answers matter while something changes: a domain forming waits on READY, a
//! reload or a peer joining or leaving changes the links. So the schedule is quick
//! right after a change and after any answer that differs from the one before, and
//! doubles from there: up to `unready` while the daemon is not ready (or not
//! running), up to `steady` once it is ready and answers the same every time.
//!
//! An exit is not left to this schedule: the adapter learns of it from the child
//! itself (`Imex::exited`) and the actor asks at once.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::model::Slot;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImexPollConfig {
    /// The first delay after a change; each unchanged answer doubles it.
    pub quick: Duration,
    /// The longest delay while the daemon is not ready or not running: readiness is
    /// what a forming domain waits for, and a peer coming up changes nothing we do.
    pub unready: Duration,
    /// The longest delay once the daemon is ready and its answers stay the same.
    pub steady: Duration,
}

impl Default for ImexPollConfig {
    fn default() -> Self {
        Self {
            quick: Duration::from_millis(30),
            unready: Duration::from_millis(250),
            steady: Duration::from_secs(5),
        }
    }
}

/// What one status question found, as far as the schedule cares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    pub running: bool,
    pub ready: bool,
    pub links: BTreeMap<Slot, bool>,
}

#[derive(Debug, Clone)]
pub struct PollSchedule {
    config: ImexPollConfig,
    delay: Duration,
    last: Option<Answer>,
}

impl PollSchedule {
    pub fn new(config: ImexPollConfig) -> Self {
        Self {
            config,
            delay: config.quick,
            last: None,
        }
    }

    /// The daemon was started or given a new peer set: the next answers will
    /// differ, so ask now and soon after. Returns the delay before the first question.
    pub fn changed(&mut self) -> Duration {
        self.delay = self.config.quick;
        self.last = None;
        Duration::ZERO
    }

    /// An answer came: how long until the next question.
    pub fn answered(&mut self, answer: Answer) -> Duration {
        let cap = if answer.running && answer.ready {
            self.config.steady
        } else {
            self.config.unready
        };
        let same = self.last.as_ref() == Some(&answer);
        self.delay = if same {
            self.delay.saturating_mul(2).min(cap)
        } else {
            self.config.quick.min(cap)
        };
        self.last = Some(answer);
        self.delay
    }

    /// A peer went silent: whether its link drops decides whether it stays (a node
    /// whose daemon died first and its IMEX a moment later), so the answers after the
    /// one asked now come quickly again, doubling from `quick`.
    pub fn watch(&mut self) {
        self.delay = self.config.quick;
    }

    /// The delay [`Self::answered`] returned last.
    pub fn delay(&self) -> Duration {
        self.delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready() -> Answer {
        Answer {
            running: true,
            ready: true,
            links: [(1, true), (2, true)].into(),
        }
    }

    fn link_down() -> Answer {
        Answer {
            running: true,
            ready: false,
            links: [(1, true), (2, false)].into(),
        }
    }

    fn schedule() -> PollSchedule {
        PollSchedule::new(ImexPollConfig::default())
    }

    /// The delays after `n` identical answers.
    fn delays(s: &mut PollSchedule, answer: Answer, n: usize) -> Vec<Duration> {
        (0..n).map(|_| s.answered(answer.clone())).collect()
    }

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn a_watch_asks_quickly_again_even_at_the_steady_interval() {
        let mut s = schedule();
        s.changed();
        delays(&mut s, ready(), 20);
        assert_eq!(s.delay(), ms(5_000));
        s.watch();
        assert_eq!(delays(&mut s, ready(), 3), [ms(60), ms(120), ms(240)]);
        // What it watched for: the link dropped.
        assert_eq!(s.answered(link_down()), ms(30));
    }

    #[test]
    fn a_ready_daemon_that_answers_the_same_is_asked_ever_less_often_down_to_the_steady_interval() {
        let mut s = schedule();
        assert_eq!(
            s.changed(),
            Duration::ZERO,
            "a start is asked about at once"
        );
        let got = delays(&mut s, ready(), 10);
        assert_eq!(
            got,
            [
                ms(30),
                ms(60),
                ms(120),
                ms(240),
                ms(480),
                ms(960),
                ms(1920),
                ms(3840),
                ms(5000),
                ms(5000)
            ]
        );
    }

    #[test]
    fn a_daemon_that_is_not_ready_is_asked_at_least_every_unready_interval() {
        let mut s = schedule();
        s.changed();
        let got = delays(&mut s, link_down(), 6);
        assert_eq!(got, [ms(30), ms(60), ms(120), ms(240), ms(250), ms(250)]);
        let stopped = Answer::default();
        assert_eq!(s.answered(stopped.clone()), ms(30), "a change of answer");
        assert_eq!(delays(&mut s, stopped, 4).last(), Some(&ms(250)));
    }

    #[test]
    fn any_change_of_answer_or_of_peers_brings_the_quick_polls_back() {
        let mut s = schedule();
        s.changed();
        delays(&mut s, ready(), 20);
        assert_eq!(s.delay(), ms(5000));
        // A link lost: seen at the next steady poll, then watched closely.
        assert_eq!(s.answered(link_down()), ms(30));
        assert_eq!(s.answered(link_down()), ms(60));
        // It came back: a change too.
        assert_eq!(s.answered(ready()), ms(30));
        delays(&mut s, ready(), 20);
        // A peer joining or leaving: the actor applies it and asks at once.
        assert_eq!(s.changed(), Duration::ZERO);
        assert_eq!(
            s.answered(ready()),
            ms(30),
            "the first answer after a change is never 'the same'"
        );
    }

    #[test]
    fn the_steady_interval_is_never_exceeded_whatever_the_history() {
        let answers = [ready(), link_down(), Answer::default()];
        let config = ImexPollConfig::default();
        let mut s = schedule();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..10_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            if seed.is_multiple_of(23) {
                s.changed();
                continue;
            }
            let answer = answers[(seed % 3) as usize].clone();
            let is_ready = answer.ready;
            let delay = s.answered(answer);
            assert!(delay >= config.quick && delay <= config.steady, "{delay:?}");
            if !is_ready {
                assert!(delay <= config.unready, "{delay:?} while not ready");
            }
        }
    }

    #[test]
    fn a_steady_interval_shorter_than_quick_wins() {
        let mut s = PollSchedule::new(ImexPollConfig {
            quick: ms(30),
            unready: ms(20),
            steady: ms(20),
        });
        s.changed();
        assert_eq!(s.answered(ready()), ms(20));
        assert_eq!(s.answered(ready()), ms(20));
    }
}
