//! A move to another clique, carried out on the running daemon: the parts bound to the
//! clique stop and start again in the new one, in the order a graceful stop and a
//! start would take them; the rest (the kubelet plugin, the checkpoint, IMEX, the HTTP
//! servers) runs on.
//!
//! 1. The node actor leaves the old clique's domains (`LeaveClique`): advertisements
//!    retracted through the old gossip, IMEX handed over, not stopped.
//! 2. Gossip runs [`RETRACT_ROUNDS`] more pulses, so that every peer hears the
//!    retraction (a leave, not a loss), then stops; the new clique's gossip starts on
//!    the same address, in the new clique's cluster, seeded as the seed plan says.
//! 3. The Kubernetes backend republishes the node's slices in the new clique and
//!    follows the new clique's slices for seeds.
//! 4. The node actor joins the new clique (`JoinClique`): each claim rejoins its domain.
//!
//! Gossip that cannot start in the new clique leaves the node in none: that is a fatal
//! fault, and the restarted process starts in the new clique.

use std::sync::Arc;

use domaind_actors::{JoinClique, LeaveClique};
use domaind_backends::kube::SeedSink;
use tracing::{error, info, warn};

use super::{Daemon, start_gossip};
use crate::run::clique::{CLIQUE_MOVES, CliqueMove};
use crate::run::seeds::SeedPlan;
use crate::run::{GossipPort, RETRACT_ROUNDS};

impl Daemon {
    pub(super) async fn move_clique(&mut self, CliqueMove { from, to }: CliqueMove) {
        warn!(%from, %to, "this node's NVLink fabric registered in another clique: moving the node there");
        if self
            .node_actor
            .send(LeaveClique { to: to.clone() })
            .await
            .is_err()
        {
            warn!("the node actor is gone: not moving");
            return;
        }
        tokio::time::sleep(self.args.pulse_interval * RETRACT_ROUNDS).await;
        if let Some(resolving) = self.gossip.static_resolving.take() {
            resolving.stop().await;
        }
        if let Err(error) = self.gossip.node.stop().await {
            warn!(%error, "the old clique's gossip did not stop cleanly");
        }
        self.gossip.watch.abort();

        let gossip = match start_gossip(&self.args, &to, self.tls.clone(), &self.vitals).await {
            Ok(gossip) => gossip,
            Err(cause) => {
                let fault = format!("cannot gossip in the new NVLink clique {to}: {cause:#}");
                error!(%fault, "the node is in no clique now");
                self.vitals.fail(fault);
                return;
            }
        };
        if let Some(kube) = &mut self.kube {
            let seeds = (gossip.seed_plan == SeedPlan::ApiServer)
                .then(|| gossip.node.clone() as Arc<dyn SeedSink>);
            kube.move_clique(&to.0, gossip.node.gossip_addr(), seeds)
                .await;
        }
        self.state_gossip.send_replace(gossip.view());
        let port = Arc::new(GossipPort(gossip.node.clone()));
        self.gossip = gossip;
        if self
            .node_actor
            .send(JoinClique {
                clique: to.clone(),
                gossip: port,
            })
            .await
            .is_err()
        {
            warn!("the node actor is gone: the claims did not rejoin");
            return;
        }
        // The gossip address is the same unless the port was chosen by the OS.
        self.write_run_info();
        metrics::counter!(CLIQUE_MOVES).increment(1);
        info!(%from, %to, cluster = %self.gossip.cluster_id, "moved to the new clique");
    }
}
