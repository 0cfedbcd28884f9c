//! Detection and heal, as every fault measures them: when the survivors' view first
//! showed a fault (or a liveness violation naming who still holds on), and how long
//! after the fault ended the domain was whole again (or what was still wrong). The
//! waits are made of ticks, so every invariant is checked while they last.

use std::time::Instant;

use super::{DETECT_LIMIT, HEAL_LIMIT, Harness, millis};
use crate::invariants::{Life, World, dropped_by_all, held_by_all, unsettled};
use crate::observe::Observation;
use crate::report::{FaultRecord, Outcome};

impl Harness {
    /// Whole: no prepare unanswered, and every member agrees, Ready, with the status
    /// file saying so.
    pub(super) fn settled(&self, world: &World, observation: &Observation) -> bool {
        self.prepares.is_empty() && unsettled(world, observation).is_empty()
    }

    /// The tail of every fault: waits until the domain is whole again after `after`,
    /// and the record gets the heal time from `since` (the fault's end), or the
    /// outcome that it did not heal.
    pub(super) async fn heal_fault(
        &mut self,
        mut record: FaultRecord,
        since: Instant,
        after: &str,
    ) -> FaultRecord {
        record.heal_ms = self.heal(since, after).await;
        if record.heal_ms.is_none() {
            record.outcome = Outcome::NotHealed;
        }
        record
    }

    /// Waits until the domain is whole again; how long it took from `since`. If it is
    /// not within the limit, what is still wrong becomes violations.
    pub(super) async fn heal(&mut self, since: Instant, after: &str) -> Option<u64> {
        match self.wait_until(HEAL_LIMIT, |h, w, o| h.settled(w, o)).await {
            Some(at) => Some(millis(since, at)),
            None => {
                self.record_unsettled(&format!(
                    "not whole {}s after {after}",
                    HEAL_LIMIT.as_secs()
                ));
                if !self.prepares.is_empty() {
                    let pending = self.prepares.claims();
                    self.liveness(
                        None,
                        format!("prepares still unanswered after {after}: {pending:?}"),
                    );
                }
                None
            }
        }
    }

    /// What keeps the newest observation from being whole, each a violation whose
    /// detail starts with `context`.
    pub(super) fn record_unsettled(&mut self, context: &str) {
        let reasons = self
            .last
            .as_ref()
            .map(|(w, o)| unsettled(w, o))
            .unwrap_or_default();
        for mut reason in reasons {
            reason.detail = format!("{context}: {}", reason.detail);
            self.record(reason);
        }
    }

    /// A fault's detection time from `injected`, given when a wait first saw its sign
    /// (`seen`); a sign never seen is a liveness violation on `target`, worded by
    /// `missed` from the newest observation.
    pub(super) fn detection(
        &mut self,
        target: usize,
        injected: Instant,
        seen: Option<Instant>,
        missed: impl FnOnce(&Self) -> String,
    ) -> Option<u64> {
        match seen {
            Some(at) => Some(millis(injected, at)),
            None => {
                let detail = missed(self);
                self.liveness(Some(target), detail);
                None
            }
        }
    }

    /// Waits until the survivors dropped `target`; the detection time, or a
    /// violation naming who still holds it.
    pub(super) async fn detect_drop(
        &mut self,
        target: usize,
        injected: Instant,
        what: &str,
    ) -> Option<u64> {
        let dropped = self
            .wait_until(DETECT_LIMIT, |_, w, o| dropped_by_all(w, o, target))
            .await;
        self.detection(target, injected, dropped, |h| {
            format!(
                "{what}, but {:?} still had it in their peer sets after {}s",
                h.holders_of(target),
                DETECT_LIMIT.as_secs()
            )
        })
    }

    /// Waits until every survivor holds `target` (its daemon silent, its IMEX alive);
    /// the detection time, or a violation naming who does not.
    pub(super) async fn detect_held(
        &mut self,
        target: usize,
        injected: Instant,
        what: &str,
    ) -> Option<u64> {
        let held = self
            .wait_until(DETECT_LIMIT, |_, w, o| held_by_all(w, o, target))
            .await;
        self.detection(target, injected, held, |h| {
            format!(
                "{what}, but after {}s not every survivor held it; still in their peer sets: {:?}",
                DETECT_LIMIT.as_secs(),
                h.holders_of(target)
            )
        })
    }

    /// The members whose peer set lists `target`, in the newest observation.
    pub(super) fn holders_of(&self, target: usize) -> Vec<String> {
        self.last
            .as_ref()
            .map(|(world, observation)| holders_of(world, observation, target))
            .unwrap_or_default()
    }
}

/// The running nodes other than `target` whose hosts block lists `target`'s address,
/// whether or not their IMEX daemon runs: for saying who held on, not for judging.
fn holders_of(world: &World, observation: &Observation, target: usize) -> Vec<String> {
    let ip = world.nodes[target].ip;
    world
        .nodes
        .iter()
        .zip(&observation.nodes)
        .enumerate()
        .filter(|(i, (node, seen))| {
            *i != target
                && node.life == Life::Up
                && seen
                    .hosts
                    .read()
                    .is_some_and(|b| b.slots.values().any(|a| *a == ip))
        })
        .map(|(_, (node, _))| node.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::time::Duration;

    use super::*;
    use crate::observe::{FileRead, HostsBlock, NodeObservation};

    fn ip(i: usize) -> IpAddr {
        format!("127.0.9.{}", i + 1).parse().unwrap()
    }

    fn listing(nodes: &[usize]) -> NodeObservation {
        let mut seen = NodeObservation::empty();
        seen.hosts = FileRead::Read(HostsBlock {
            slots: nodes.iter().map(|n| (*n as u16, ip(*n))).collect(),
            parked: 0,
        });
        seen
    }

    #[test]
    fn holders_are_the_other_running_nodes_that_list_the_target() {
        let now = Instant::now();
        let names = ["n0", "n1", "n2", "n3", "n4"];
        let mut world = World::new(
            "cd",
            Duration::from_secs(5),
            names
                .iter()
                .enumerate()
                .map(|(i, n)| ((*n).to_owned(), ip(i))),
            now,
        );
        for (i, life) in [Life::Up, Life::Up, Life::Up, Life::Down, Life::Paused]
            .into_iter()
            .enumerate()
        {
            world.set_life(i, life, now);
        }
        let mut unreadable = NodeObservation::empty();
        unreadable.hosts = FileRead::Bad("half written".into());
        let observation = Observation {
            at: now,
            nodes: vec![
                // The target lists itself: not a holder.
                listing(&[0, 1, 2]),
                // Holds on to it.
                listing(&[0, 1]),
                // Could not be read: nothing to say.
                unreadable,
                // Down or paused: their files are stale, not a holding.
                listing(&[0, 3]),
                listing(&[0, 4]),
            ],
            status: FileRead::Missing,
        };
        assert_eq!(holders_of(&world, &observation, 0), vec!["n1".to_owned()]);
        assert_eq!(holders_of(&world, &observation, 2), vec!["n0".to_owned()]);
        // Only the down node lists it.
        assert_eq!(holders_of(&world, &observation, 3), Vec::<String>::new());
    }
}
