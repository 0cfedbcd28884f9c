//! The domain's pass: the gossip view turned into members, slots, the IMEX peer set,
//! this node's advertisement, readiness and the claims' progress.

use std::collections::BTreeMap;

use domaind_membership::Membership;
use tokio::time::Instant;

use super::{DomainCore, DomainEffect, RoleState};
use crate::actors::channel::Progress;
use crate::actors::imex_peer::PeerSignal;
use crate::actors::sharing::{ChannelState, Role};
use crate::config::NodeConfig;
use crate::model::{Advertisement, ChannelId, DomainMember, DomainUid, NodeId};
use crate::rules::channel_health::{HealthInput, LocalImex, domain_health};
use crate::rules::channel_roles::{AssignInput, FollowInput, SharedImexRole};
use crate::rules::channels::sharing_domains;
use crate::rules::local_imex::{DaemonReport, Reconfigure, desired_peers, imex_ready, reconfigure};
use crate::rules::membership::domain_members;
use crate::rules::peer_health::Advertised;
use crate::rules::readiness::node_ready;
use crate::rules::roster::{Change, Roster, slot_candidates};
use crate::rules::slots::assign_slots;

/// What one pass knows.
#[derive(Debug, Clone, Copy)]
pub struct PassInput<'a> {
    /// The newest gossip view.
    pub live: &'a Membership,
    /// Whether this node holds claims of the domain.
    pub holds_claims: bool,
    /// Whether the actor runs a status writer (this node reports).
    pub writing: bool,
    pub now: Instant,
    /// The wall clock, for a reporter tenure's term.
    pub now_ms: u64,
}

/// What one pass decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Pass {
    /// Advertisements that could not be read, and why: ignored.
    pub malformed: Vec<(NodeId, String)>,
    /// What changed in the roster, in the order found.
    pub changes: Vec<Change>,
    pub effects: Vec<DomainEffect>,
    /// When the next lost or adopted member is due to expire: a pass is wanted then
    /// (replacing the one asked by the pass before).
    pub expiry: Option<Instant>,
    /// The reporter's part, carried out once the advertisement is published.
    pub report: Vec<DomainEffect>,
}

impl DomainCore {
    /// One pass over the gossip view; none before [`DomainCore::restore`].
    pub fn pass(&mut self, input: PassInput<'_>) -> Option<Pass> {
        let my_ad = self.my_ad.clone()?;
        let PassInput {
            live,
            holds_claims,
            writing,
            now,
            now_ms,
        } = input;
        let mut effects = Vec::new();
        let view = domain_members(&self.domain.uid, live, &self.config.clique);
        let own = DomainMember {
            node: self.me().to_owned(),
            generation: live.get(self.me()).map_or(0, |m| m.generation),
            ad: my_ad.clone(),
        };
        let graces = self.graces();
        let observation = self.roster.observe(
            own,
            view.members,
            |node: &str| live.get(node).map(|member| member.generation),
            now,
            graces,
        );
        for change in &observation.changes {
            match change {
                Change::Left(node) => {
                    effects.push(DomainEffect::RetirePeer(node.clone()));
                    self.links.remove(node);
                }
                Change::Lost { node, .. } => {
                    self.lost_daemon_alive.insert(node.clone(), true);
                }
                Change::Forgotten(node) => effects.push(DomainEffect::RetirePeer(node.clone())),
                Change::Back(_) | Change::AdoptionEnded(_) => {}
            }
        }
        self.tell_lost_daemons(live, &mut effects);
        self.tell_advertised(&mut effects);
        let expiry = self.roster.next_expiry(graces);

        let imex_members = self.roster.imex_members();
        let assignment = assign_slots(&slot_candidates(&imex_members), self.config.max_slots);
        let my_slot = assignment.slot_of(self.me());
        let peers = desired_peers(
            &imex_members,
            &assignment,
            |node: &str| self.roster.admitted(node),
            my_slot,
            self.has_fabric(),
        );
        match reconfigure(&self.peer_set, &peers, self.peer_version) {
            _ if !self.drives_imex() => {}
            Reconfigure::Unchanged => {}
            Reconfigure::Release => {
                self.peer_set = peers;
                effects.push(DomainEffect::ReleaseImex);
            }
            Reconfigure::Apply { version } => {
                self.peer_set = peers.clone();
                self.peer_version = version;
                self.peer_set_changed = now;
                effects.push(DomainEffect::ApplyPeers {
                    version,
                    peers,
                    claims_in_use: self.resumed,
                });
            }
        }

        let report = self.imex_report.as_ref().map(|r| DaemonReport {
            version: r.version,
            running: r.running,
            ready: r.ready,
        });
        let mut new_ad = my_ad.clone();
        new_ad.slot = my_slot;
        new_ad.imex_ready =
            imex_ready(self.has_fabric(), report, self.peer_version, &self.peer_set);
        // Failing while the daemon is down and being restarted: once one runs again
        // it is forming, not failing, even inside its episode. That change is what
        // lets peers that dropped this node past their link grace take it back
        // (`rules::peer_health`): not ready until they list it, it could not say so
        // through its readiness.
        new_ad.imex_failing = !new_ad.imex_ready
            && self
                .imex_report
                .as_ref()
                .is_some_and(|r| r.failure.is_some() && !r.running);
        let channel = match &mut self.role {
            RoleState::Exclusive => ChannelState::Unassigned,
            RoleState::SharedImex(role) => {
                let failure = self
                    .imex_report
                    .as_ref()
                    .and_then(|r| r.failure.as_ref())
                    .map(|f| (f.episode, f.reason.clone()));
                effects.extend(assign_channels(
                    role,
                    &self.roster,
                    &self.config,
                    live,
                    &mut new_ad,
                    failure,
                    now,
                ));
                ChannelState::Unassigned
            }
            RoleState::Sharing(role) => {
                let followed = role.follow(FollowInput {
                    domain: &self.domain.uid,
                    has_fabric: self.config.clique.has_fabric(),
                    holds_claims,
                    advertised: new_ad.sharing.as_ref().and_then(|s| s.channel),
                });
                new_ad.imex_failing = followed.imex_failing;
                new_ad.imex_ready = followed.imex_ready;
                new_ad.sharing = Some(followed.sharing);
                effects.extend(followed.effects.into_iter().map(DomainEffect::Sharing));
                followed.state
            }
        };
        if new_ad.slot != my_ad.slot {
            effects.push(DomainEffect::SlotChanged(my_slot));
        }
        if new_ad != my_ad {
            self.my_ad = Some(new_ad.clone());
            let me = self.me().to_owned();
            self.roster.update_own(&me, new_ad);
        }

        let readiness = self.roster.readiness(&assignment, self.domain.num_nodes);
        // A sharing domain's pods wait for its channel too: handed out only once every
        // node of the shared IMEX domain agrees on it.
        let channel_waits = match self.role() {
            Role::Sharing => channel.waiting(self.config.channels),
            _ => None,
        };
        let local_ready = channel_waits.is_none()
            && self
                .roster
                .members()
                .get(self.me())
                .is_some_and(|me| node_ready(me, &assignment, true));
        let summary = match &channel_waits {
            Some(why) => format!("domain {}: {readiness}; {why}", self.domain),
            None => format!("domain {}: {readiness}", self.domain),
        };
        let progress = Progress {
            local_ready,
            domain_ready: readiness.is_ready() && channel_waits.is_none(),
            slot: my_slot,
            channel: channel.confirmed(),
            summary,
        };
        if self.progress.as_ref() != Some(&progress) {
            effects.push(DomainEffect::Progress(progress.clone()));
            self.progress = Some(progress);
        }

        if observation.members_changed {
            self.membership_changed = Some(now);
        }
        self.assignment = assignment;
        let report = self.report(&readiness, now, now_ms, writing);
        self.readiness = Some(readiness);
        effects.extend(self.health_changed(my_slot, channel.confirmed()));
        Some(Pass {
            malformed: view.malformed,
            changes: observation.changes,
            effects,
            expiry,
            report,
        })
    }

    /// How the channel now is for this node's pods, if that changed.
    fn health_changed(
        &mut self,
        index: Option<crate::model::Slot>,
        channel: Option<ChannelId>,
    ) -> Option<DomainEffect> {
        let no_links = BTreeMap::new();
        let imex = match (&self.role, &self.shared_imex) {
            (RoleState::Sharing(_), Some(shared)) => Some(LocalImex {
                running: !shared.failing,
                ready: shared.ready,
                failure: shared.failure.as_deref(),
                links: &no_links,
            }),
            (RoleState::Sharing(_), None) => None,
            _ => self.imex_report.as_ref().map(|r| LocalImex {
                running: r.running,
                // Ready for an older peer set still serves the links it has: a
                // member joining is not a fault of the running pods.
                ready: r.ready,
                failure: r.failure.as_ref().map(|f| f.reason.as_str()),
                links: &r.links,
            }),
        };
        let health = domain_health(HealthInput {
            me: self.me(),
            clique: &self.config.clique,
            has_fabric: self.has_fabric(),
            imex,
            // A sharing domain runs no peer set of its own: it follows the daemon.
            peer_set: &self.peer_set,
            readiness: self.readiness.as_ref(),
            index,
            channel,
        });
        if self.health.as_ref() == Some(&health) {
            return None;
        }
        self.health = Some(health.clone());
        Some(DomainEffect::Health(health))
    }

    /// Every remote member's ImexPeer hears that gossip knows it alive, and what it
    /// advertises.
    fn tell_advertised(&mut self, effects: &mut Vec<DomainEffect>) {
        let remote: Vec<(NodeId, Advertised)> = self
            .roster
            .members()
            .values()
            .filter(|member| member.node != self.me())
            .map(|member| {
                (
                    member.node.clone(),
                    Advertised {
                        generation: member.generation,
                        imex_ready: member.ad.imex_ready,
                        imex_failing: member.ad.imex_failing,
                        imex_outlives_daemon: member.ad.imex_outlives_daemon,
                    },
                )
            })
            .collect();
        for (node, advertised) in remote {
            let tenure = self.roster.peer(&node);
            for signal in [
                PeerSignal::Gossip { alive: true },
                PeerSignal::Advertised(advertised),
            ] {
                effects.push(DomainEffect::Signal {
                    node: node.clone(),
                    tenure,
                    signal,
                });
            }
        }
    }
}

/// The shared IMEX domain: assigns every sharing domain of the clique its channel, to
/// advertise in `ad`, and tells the node what is confirmed. `ad`'s IMEX readiness is
/// this pass's judgement of this node's IMEX; `failure`, its failure episode under way.
fn assign_channels(
    role: &mut SharedImexRole,
    roster: &Roster,
    config: &NodeConfig,
    live: &Membership,
    ad: &mut Advertisement,
    failure: Option<(u64, String)>,
    now: Instant,
) -> Vec<DomainEffect> {
    let away = roster
        .lost()
        .iter()
        .map(|(node, lost)| (node, &lost.member.ad));
    let candidates = sharing_domains(live, &config.clique, away);
    let me = &config.node;
    let others: Vec<BTreeMap<DomainUid, ChannelId>> = roster
        .members()
        .values()
        .filter(|member| member.node != *me)
        .map(|member| {
            member
                .ad
                .sharing
                .as_ref()
                .map(|s| s.channels.clone())
                .unwrap_or_default()
        })
        .collect();
    let assigned = role.assign(AssignInput {
        candidates: &candidates,
        capacity: config.channels,
        others: &others,
        lost: roster.lost().keys().cloned().collect(),
        failing: roster
            .members()
            .values()
            .filter(|member| member.node != *me && member.ad.imex_failing)
            .map(|member| member.node.clone())
            .collect(),
        local_ready: ad.imex_ready,
        imex_failing: ad.imex_failing,
        failure,
        settle: config.channel_settle,
        now,
    });
    ad.sharing = Some(assigned.sharing);
    let mut effects = Vec::new();
    if let Some(at) = assigned.settles_at {
        effects.push(DomainEffect::PassAt(at));
    }
    if let Some(progress) = assigned.tell {
        effects.push(DomainEffect::TellNode(progress));
    }
    effects
}
