//! The core's gossip and clock ports, filled by the real gossip node and the system
//! clock. They live in the wiring, not the core: the core builds without chitchat,
//! rustls and ring.

use std::sync::Arc;

use async_trait::async_trait;
use domaind_actors::model::NodeId;
use domaind_actors::ports::{Clock, Gossip};
use domaind_gossip::{GossipNode, Membership};
use futures::stream::BoxStream;

/// This node's gossip membership, as the core asks for it.
#[derive(Debug, Clone)]
pub struct GossipPort(pub Arc<GossipNode>);

#[async_trait]
impl Gossip for GossipPort {
    fn node(&self) -> NodeId {
        self.0.node().to_string()
    }
    async fn set(&self, key: &str, value: &str) {
        self.0.set(key, value).await;
    }
    async fn delete(&self, key: &str) {
        self.0.delete(key).await;
    }
    fn live(&self) -> Membership {
        self.0.live_nodes()
    }
    fn updates(&self) -> BoxStream<'static, Membership> {
        Box::pin(self.0.membership_updates())
    }
}

/// The system clock: milliseconds since the Unix epoch, for seniority.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        // The same clock as gossip's generations.
        domaind_gossip::default_generation()
    }
}
