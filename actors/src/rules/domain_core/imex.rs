//! This node's IMEX and its peers: the IMEX process's reports, what each ImexPeer hears
//! of its link and of its daemon's silence, a restarted daemon's adoption wait, and
//! the events they make.

use std::collections::BTreeMap;

use domaind_membership::Membership;
use tokio::time::Instant;

use super::{DomainCore, DomainEffect};
use crate::actors::imex_peer::PeerSignal;
use crate::actors::imex_process::ImexReport;
use crate::actors::sharing::Role;
use crate::model::{NodeId, Slot};
use crate::rules::peer_health::LinkAnswer;

impl DomainCore {
    /// The IMEX process reported.
    pub fn imex_reported(&mut self, report: ImexReport, now: Instant) -> Vec<DomainEffect> {
        let mut effects = Vec::new();
        if let Some(asked_at) = report.asked_at {
            self.tell_links(&report.links, asked_at, &mut effects);
        }
        let adopted = report.adopted;
        if report.kept.is_some() && report.kept != self.imex_kept_told {
            self.imex_kept_told = report.kept.clone();
            if let Some(reason) = report.kept.clone() {
                effects.push(DomainEffect::ImexKept(reason));
            }
        }
        if let Some(failure) = &report.failure
            && failure.episode > self.imex_episode_told
            && self.role() == Role::Exclusive
        {
            self.imex_episode_told = failure.episode;
            effects.push(DomainEffect::ImexFailing(failure.reason.clone()));
        }
        if self.imex_report.as_ref() != Some(&report) {
            self.imex_report = Some(report);
            effects.push(DomainEffect::Pass);
        }
        if self.awaiting_adoption {
            if adopted {
                effects.extend(self.end_adoption_wait(now));
            } else {
                // A new daemon: no job uses it yet, nothing to keep steady.
                self.awaiting_adoption = false;
                effects.push(DomainEffect::AdoptionEnded { anew: true });
            }
        }
        effects
    }

    /// Ends the wait of a restarted daemon whose IMEX was adopted once that IMEX is
    /// ready for the peer set of the moment and serves no peer beyond it (the view has
    /// caught up with what IMEX serves), and the set has not changed for the
    /// reporter's settle: the view fills in over the first gossip rounds, and each new
    /// set is a new version the daemon is not ready for until its next answer. An
    /// advertisement published before would say not ready a moment later.
    pub fn end_adoption_wait(&mut self, now: Instant) -> Option<DomainEffect> {
        if !self.awaiting_adoption {
            return None;
        }
        let ready = self
            .imex_report
            .as_ref()
            .is_some_and(|r| r.ready && !r.catching_up && r.version == Some(self.peer_version));
        if !ready {
            return None;
        }
        let due = self.peer_set_changed + self.config.reporter_settle;
        if now >= due {
            self.awaiting_adoption = false;
            Some(DomainEffect::AdoptionEnded { anew: false })
        } else {
            Some(DomainEffect::CheckAdoptionAt(due))
        }
    }

    /// Tells each lost member's ImexPeer whether its daemon is silent: no generation
    /// of it live in gossip. A restarted daemon that has not advertised yet is a lost
    /// member, but not a silent one: it is reloading the IMEX it adopted, and a link
    /// down for that moment is no sign that the node is gone. A daemon going silent
    /// makes our IMEX answer now: whether its IMEX still runs decides if it stays.
    pub(super) fn tell_lost_daemons(&mut self, live: &Membership, effects: &mut Vec<DomainEffect>) {
        self.lost_daemon_alive
            .retain(|node, _| self.roster.lost().contains_key(node));
        let lost: Vec<NodeId> = self.roster.lost().keys().cloned().collect();
        for node in lost {
            let alive = live.contains_key(&node);
            if self.lost_daemon_alive.insert(node.clone(), alive) == Some(alive) {
                continue;
            }
            let tenure = self.roster.peer(&node);
            effects.push(DomainEffect::Signal {
                node,
                tenure,
                signal: PeerSignal::Gossip { alive },
            });
            if !alive && self.drives_imex() {
                effects.push(DomainEffect::QueryImex);
            }
        }
    }

    /// Tells each peer's ImexPeer what our IMEX found of its link. A live peer hears
    /// of changes only. A silent one (lost) hears every answer, a link missing from it
    /// as down: whether it stays depends on our IMEX reaching its IMEX now.
    fn tell_links(
        &mut self,
        links: &BTreeMap<Slot, bool>,
        asked_at: Instant,
        effects: &mut Vec<DomainEffect>,
    ) {
        let peers: Vec<(Slot, NodeId)> = self
            .peer_set
            .peers
            .iter()
            .filter(|(_, peer)| peer.node != self.me())
            .map(|(slot, peer)| (*slot, peer.node.clone()))
            .collect();
        for (slot, node) in peers {
            let silent = self.roster.lost().contains_key(&node);
            let (up, listed) = match links.get(&slot) {
                Some(up) => (*up, true),
                None if silent => (false, false),
                None => continue,
            };
            if silent || self.links.get(&node) != Some(&up) {
                self.links.insert(node.clone(), up);
                let tenure = self.roster.peer(&node);
                effects.push(DomainEffect::Signal {
                    node,
                    tenure,
                    signal: PeerSignal::ImexLink(LinkAnswer {
                        up,
                        listed,
                        asked_at,
                    }),
                });
            }
        }
    }
}
