//! GossipBridge: turns gossip's stream of membership and key changes into messages
//! for the node. Changes are triggers: domains recompute from the whole view, so a
//! missed or merged event loses nothing.

use std::sync::Arc;

use actix::WeakRecipient;
use actix::prelude::*;
use domaind_gossip::GossipEvent;
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
        ctx.add_stream(self.gossip.events());
    }
}

impl StreamHandler<GossipEvent> for GossipBridge {
    fn handle(&mut self, _: GossipEvent, ctx: &mut Self::Context) {
        match self.node.upgrade() {
            Some(node) => node.do_send(GossipChanged),
            None => ctx.stop(),
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        warn!("gossip event stream ended");
        ctx.stop();
    }
}
