//! Domain churn (`--domains`): a sharing domain created on a few nodes, or one deleted
//! from every node, while the others go on. Detected when the new domain's prepares are
//! all answered (its channel confirmed and handed on every node), or when no node shows
//! the deleted domain any more (its channel free); healed when the run's first domain
//! is whole again.

use std::time::Instant;

use crate::harness::{DETECT_LIMIT, Harness, PREPARE_LIMIT};
use crate::invariants::{ClaimPhase, Life};
use crate::observe::Observation;
use crate::report::FaultRecord;
use crate::schedule::{DomainChurn, Step};

impl Harness {
    pub(super) async fn domain_churn(&mut self, step: &Step) -> FaultRecord {
        let live = self.live_sharing_domains();
        // Between the first domain alone and one more than --domains asked for.
        let variant = if live.is_empty() {
            DomainChurn::Create
        } else if live.len() >= self.config.domains {
            DomainChurn::Delete
        } else {
            step.domain_churn.unwrap_or(DomainChurn::Create)
        };
        match variant {
            DomainChurn::Create => self.create_domain(step).await,
            DomainChurn::Delete => {
                let pick = step.pick.unwrap_or_default() % live.len() as u64;
                self.delete_domain(step, &live[pick as usize]).await
            }
        }
    }

    /// A new domain, one claim on each target: every prepare must be answered (each
    /// waits for the domain's confirmed channel).
    async fn create_domain(&mut self, step: &Step) -> FaultRecord {
        let mut record = self.record_for(step, &step.targets);
        let injected = Instant::now();
        let uid = self.begin_domain(&step.targets);
        let answered = self
            .wait_until(PREPARE_LIMIT, |h, _, _| h.prepares.is_empty())
            .await;
        let target = step.targets[0];
        record.detect_ms = self.detection(target, injected, answered, |h| {
            format!(
                "the prepares of new domain {uid} were not all answered within {}s: {:?}",
                PREPARE_LIMIT.as_secs(),
                h.prepares.claims()
            )
        });
        self.hold(step.hold, |_, _, _| false).await;
        record.notes.push(format!(
            "created {} ({})",
            self.domain_name(&uid),
            self.channels_line()
        ));
        let ended = Instant::now();
        self.heal_fault(record, ended, "a domain was created").await
    }

    /// Every claim of `uid` unprepared and its files removed: no node may show the
    /// domain afterwards (its channel is free for another).
    async fn delete_domain(&mut self, step: &Step, uid: &str) -> FaultRecord {
        let holders: Vec<(usize, String)> = self
            .world
            .nodes
            .iter()
            .enumerate()
            .flat_map(|(i, n)| {
                n.claims
                    .iter()
                    .filter(|(c, p)| **p != ClaimPhase::Released && self.world.domain_of(c) == uid)
                    .map(move |(c, _)| (i, c.clone()))
            })
            .collect();
        let mut targets: Vec<usize> = holders.iter().map(|(i, _)| *i).collect();
        targets.dedup();
        let mut record = self.record_for(step, &targets);
        let channel = self.handed_channel(uid);
        let injected = Instant::now();
        for (node, claim) in &holders {
            self.unprepare(*node, claim).await;
        }
        let gone = self
            .wait_until(DETECT_LIMIT, |_, w, o| shown_by(w, o, uid).is_empty())
            .await;
        let target = targets.first().copied().unwrap_or_default();
        record.detect_ms = self.detection(target, injected, gone, |h| {
            let shown = h
                .last
                .as_ref()
                .map(|(w, o)| shown_by(w, o, uid))
                .unwrap_or_default();
            format!(
                "every claim of domain {uid} was unprepared, but after {}s {shown:?} still showed it",
                DETECT_LIMIT.as_secs()
            )
        });
        self.hold(step.hold, |_, _, _| false).await;
        record.notes.push(format!(
            "deleted {} (it had channel {})",
            self.domain_name(uid),
            channel.map_or_else(|| "-".to_owned(), |c| c.to_string())
        ));
        let ended = Instant::now();
        self.heal_fault(record, ended, "a domain was deleted").await
    }
}

/// The running nodes whose `/state` still shows domain `uid`, as a domain of theirs or
/// in their shared IMEX domain's assignment.
fn shown_by(world: &crate::invariants::World, obs: &Observation, uid: &str) -> Vec<String> {
    world
        .nodes
        .iter()
        .zip(&obs.nodes)
        .filter(|(record, _)| record.life == Life::Up)
        .filter(|(_, seen)| {
            seen.view.as_ref().is_some_and(|v| {
                v.domains.iter().any(|d| d.uid == uid)
                    || v.shared_imex
                        .as_ref()
                        .is_some_and(|s| s.channels.contains_key(uid))
            })
        })
        .map(|(record, _)| record.name.clone())
        .collect()
}
