//! ImexPeer: one per remote member of the local domain. Feeds the member's signals to
//! its [`PeerHealth`] and tells the domain when to drop or re-admit it.

use actix::WeakRecipient;
use actix::prelude::*;
use tokio::time::Instant;
use tracing::info;

use crate::model::NodeId;
use crate::rules::peer_health::{
    Advertised, LinkAnswer, PeerHealth, PeerHealthConfig, PeerState, Verdict,
};
use crate::rules::roster::Tenure;

/// Peers kept in their domain while their daemon was silent, because our IMEX still
/// reached theirs (`rules::peer_health`): each is a restart that no job felt.
pub const PEERS_HELD: &str = "domaind_imex_peers_held_total";

/// A decision about one peer, for its domain.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct PeerVerdict {
    pub node: NodeId,
    pub verdict: Verdict,
    /// The tenure of the ImexPeer that decided. The domain replaces a member's ImexPeer
    /// when the member leaves and comes back, and the old one lives on until its grace
    /// timer has fired: its verdicts are about a membership that is over
    /// ([`crate::rules::roster`]).
    pub tenure: Tenure,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub enum PeerSignal {
    /// The failure detector's view.
    Gossip { alive: bool },
    /// Our IMEX daemon's link to this peer.
    ImexLink(LinkAnswer),
    /// The peer's advertisement, as last seen.
    Advertised(Advertised),
}

pub struct ImexPeerActor {
    node: NodeId,
    tenure: Tenure,
    health: PeerHealth,
    domain: WeakRecipient<PeerVerdict>,
    timer: Option<SpawnHandle>,
}

impl std::fmt::Debug for ImexPeerActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImexPeerActor")
            .field("node", &self.node)
            .field("state", &self.health.state())
            .finish()
    }
}

impl ImexPeerActor {
    pub fn new(
        node: NodeId,
        tenure: Tenure,
        config: PeerHealthConfig,
        domain: WeakRecipient<PeerVerdict>,
    ) -> Self {
        Self {
            node,
            tenure,
            health: PeerHealth::new(config),
            domain,
            timer: None,
        }
    }

    fn report(&mut self, verdict: Option<Verdict>, ctx: &mut Context<Self>) {
        if let Some(verdict) = verdict {
            info!(peer = %self.node, ?verdict, "IMEX peer decision");
            if let Some(domain) = self.domain.upgrade() {
                domain.do_send(PeerVerdict {
                    node: self.node.clone(),
                    verdict,
                    tenure: self.tenure,
                });
            }
        }
        if let Some(timer) = self.timer.take() {
            ctx.cancel_future(timer);
        }
        if let Some(deadline) = self.health.deadline() {
            let wait = deadline.saturating_duration_since(Instant::now());
            self.timer = Some(ctx.run_later(wait, |act, ctx| {
                act.timer = None;
                let verdict = act.health.tick(Instant::now());
                act.report(verdict, ctx);
            }));
        }
    }
}

impl Actor for ImexPeerActor {
    type Context = Context<Self>;
}

impl Handler<PeerSignal> for ImexPeerActor {
    type Result = ();

    fn handle(&mut self, signal: PeerSignal, ctx: &mut Self::Context) {
        let now = Instant::now();
        let was_held = matches!(self.health.state(), PeerState::Held { .. });
        let verdict = match signal {
            PeerSignal::Gossip { alive } => self.health.gossip(alive, now),
            PeerSignal::ImexLink(answer) => self.health.imex_link(answer, now),
            PeerSignal::Advertised(ad) => self.health.advertisement(ad, now),
        };
        match (was_held, self.health.state()) {
            (false, PeerState::Held { .. }) => {
                metrics::counter!(PEERS_HELD).increment(1);
                info!(peer = %self.node, "peer's daemon is silent but our IMEX reaches its IMEX: kept in the domain");
            }
            (true, PeerState::Admitted) => {
                info!(peer = %self.node, "held peer's daemon speaks again");
            }
            _ => {}
        }
        self.report(verdict, ctx);
    }
}
