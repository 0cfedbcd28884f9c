//! A node whose NVLink clique changed while it runs (its fabric registered again, in
//! another clique). In two steps, because the wiring swaps gossip in between (one
//! gossip cluster per clique, on the same port):
//!
//! 1. [`LeaveClique`]: every domain of the old clique is left as a departure leaves
//!    it (advertisements retracted, so that peers there see a leave, not a loss), but
//!    the IMEX daemon is handed over, not stopped: a job's local IMEX stays up, and
//!    nodes that moved together (a whole rack re-registered) may keep their links. A
//!    `CliqueMoved` event goes to every domain the node holds a claim of.
//! 2. [`JoinClique`]: the node's clique and gossip are the new ones; every claim it
//!    holds rejoins its domain there, as after a restart (the slot it held is its
//!    preference, the channel its pods hold is kept).
//!
//! Between the two, prepares are refused as retryable (there is no domain to wait
//! on), while unprepares and completions are recorded as ever.

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::prelude::*;
use tracing::{info, warn};

use super::NodeActor;
use crate::actors::domain::{AddClaim, DomainActor, Retract};
use crate::actors::gossip_bridge::{GossipBridge, Unbridge};
use crate::actors::imex_process::{Handover, ReleaseImex};
use crate::config::NodeConfig;
use crate::model::{CliqueId, DomainRef, DomainUid};
use crate::outcome::PrepareError;
use crate::ports::{CheckpointChange, ClaimRecord, DomainEvent, Gossip};
use crate::rules::channels::shared_imex_uid;

/// Leave the current clique's domains; the node moves to `to`. Resolves once every
/// domain has retracted its advertisement through the old gossip.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct LeaveClique {
    pub to: CliqueId,
}

/// Join `clique` through `gossip` (the new clique's cluster): the claims held rejoin
/// their domains there.
#[derive(Clone, Message)]
#[rtype(result = "()")]
pub struct JoinClique {
    pub clique: CliqueId,
    pub gossip: Arc<dyn Gossip>,
}

impl std::fmt::Debug for JoinClique {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinClique")
            .field("clique", &self.clique)
            .finish_non_exhaustive()
    }
}

impl NodeActor {
    /// A claim admitted while the node moves would join a domain of neither clique.
    pub(super) fn refuse_while_moving(&self) -> Result<(), PrepareError> {
        match &self.moving {
            Some(to) => Err(PrepareError::Transient(format!(
                "node {} is moving to NVLink clique {to:?} (its fabric registered again); call \
                 again in a moment",
                self.config.node
            ))),
            None => Ok(()),
        }
    }
}

impl Handler<LeaveClique> for NodeActor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, LeaveClique { to }: LeaveClique, _: &mut Self::Context) -> Self::Result {
        let from = self.config.clique.clone();
        info!(node = %self.config.node, %from, %to, domains = self.domains.len(), "the node moves to another clique: leaving this one's domains");
        self.moving = Some(to.clone());
        let mut domains: Vec<Addr<DomainActor>> =
            std::mem::take(&mut self.domains).into_values().collect();
        domains.extend(self.shared_imex.take());
        self.shared_progress = None;
        let bridge = self.bridge.take();
        let held: BTreeMap<DomainUid, DomainRef> = self
            .checkpoint
            .claims
            .values()
            .map(|r| (r.info.domain.uid.clone(), r.info.domain.clone()))
            .collect();
        // The shared IMEX domain's uid names the old clique: its slot means nothing in
        // the new one.
        let old_shared = shared_imex_uid(&from);
        let slot_gone = self
            .checkpoint
            .slots
            .contains_key(&old_shared)
            .then(|| self.record(vec![CheckpointChange::SlotGone(old_shared)]));
        let (imex, events, node) = (
            self.imex.clone(),
            self.ports.events.clone(),
            self.config.node.clone(),
        );
        Box::pin(
            async move {
                // First: a view of the old clique must not reach the new clique's
                // domains. Once the bridge has stopped, whatever it sent is ahead of
                // `JoinClique` in the mailbox.
                if let Some(bridge) = bridge {
                    let _ = bridge.send(Unbridge).await;
                }
                for domain in &domains {
                    let _ = domain.send(Retract).await;
                }
                // Only now: no domain of the old clique tells IMEX anything any more.
                if let Some(imex) = imex {
                    let _ = imex.send(Handover).await;
                }
                for domain in held.into_values() {
                    let (events, event) = (
                        events.clone(),
                        DomainEvent::CliqueMoved {
                            node: node.clone(),
                            from: from.0.clone(),
                            to: to.0.clone(),
                        },
                    );
                    // Not waited for: an API server that is slow to take events must
                    // not hold the node out of every clique.
                    actix::spawn(async move {
                        if let Err(error) = events.emit(&domain, event).await {
                            warn!(domain = %domain.uid, %error, "the clique move was not told");
                        }
                    });
                }
                if let Some(recorded) = slot_gone {
                    // Already counted and logged by record().
                    let _ = recorded.await;
                }
            }
            .into_actor(self),
        )
    }
}

impl Handler<JoinClique> for NodeActor {
    type Result = ();

    fn handle(&mut self, JoinClique { clique, gossip }: JoinClique, ctx: &mut Self::Context) {
        info!(node = %self.config.node, %clique, claims = self.checkpoint.claims.len(), "joining the new clique's domains");
        self.config = Arc::new(NodeConfig {
            clique,
            ..(*self.config).clone()
        });
        self.ports.gossip = gossip;
        self.moving = None;
        let Some(imex) = self.imex.clone() else {
            // Departed meanwhile: nothing to join.
            return;
        };
        self.bridge = Some(
            GossipBridge::new(
                self.ports.gossip.clone(),
                ctx.address().recipient().downgrade(),
            )
            .start(),
        );
        let records: Vec<ClaimRecord> = self.checkpoint.claims.values().cloned().collect();
        for record in records {
            let domain = self.domain(&record, ctx);
            domain.do_send(AddClaim(record));
        }
        // No domain will drive the daemon handed over: no claim here, or no fabric to
        // link over.
        if self.domains.is_empty() || !self.config.clique.has_fabric() {
            imex.do_send(ReleaseImex);
        }
    }
}
