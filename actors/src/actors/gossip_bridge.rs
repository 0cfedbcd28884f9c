//! GossipBridge: turns gossip's membership snapshots into messages for the node. A
//! snapshot is the whole view: domains recompute from it, so merged updates lose
//! nothing, and a burst of changes costs one recompute per gossip round.

use std::sync::Arc;

use actix::WeakRecipient;
use actix::prelude::*;
use domaind_membership::Membership;
use tracing::warn;

use crate::actors::domain::GossipChanged;
use crate::ports::Gossip;

pub struct GossipBridge {
    gossip: Arc<dyn Gossip>,
    node: WeakRecipient<GossipChanged>,
}

impl std::fmt::Debug for GossipBridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GossipBridge").finish_non_exhaustive()
    }
}

impl GossipBridge {
    pub fn new(gossip: Arc<dyn Gossip>, node: WeakRecipient<GossipChanged>) -> Self {
        Self { gossip, node }
    }
}

impl Actor for GossipBridge {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.add_stream(self.gossip.updates());
    }
}

/// Stop following gossip: the node moves to another clique's gossip, whose bridge is
/// a new one.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Unbridge;

impl Handler<Unbridge> for GossipBridge {
    type Result = ();
    fn handle(&mut self, _: Unbridge, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl StreamHandler<Membership> for GossipBridge {
    fn handle(&mut self, live: Membership, ctx: &mut Self::Context) {
        match self.node.upgrade() {
            Some(node) => node.do_send(GossipChanged(Arc::new(live))),
            None => ctx.stop(),
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        warn!("gossip membership stream ended");
        ctx.stop();
    }
}
