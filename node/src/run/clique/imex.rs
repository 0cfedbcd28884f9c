//! The IMEX port as the actors see it, with the start of each failure episode passed
//! on to the clique watch: a fabric that registered again in another clique breaks
//! IMEX's links, so a failing IMEX is a reason to read the fabric now rather than at
//! the next tick.

use std::sync::Arc;

use async_trait::async_trait;
use domaind_actors::ports::{Imex, ImexStatus, PortError};
use domaind_actors::rules::peers::PeerSet;
use tokio::sync::Notify;

pub struct ObservedImex {
    inner: Arc<dyn Imex>,
    failing: Arc<Notify>,
}

impl std::fmt::Debug for ObservedImex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObservedImex").finish_non_exhaustive()
    }
}

impl ObservedImex {
    pub fn new(inner: Arc<dyn Imex>, failing: Arc<Notify>) -> Self {
        Self { inner, failing }
    }
}

#[async_trait]
impl Imex for ObservedImex {
    async fn start(&self, peers: &PeerSet) -> Result<(), PortError> {
        self.inner.start(peers).await
    }
    async fn apply(&self, peers: &PeerSet) -> Result<(), PortError> {
        self.inner.apply(peers).await
    }
    async fn reload(&self) -> Result<(), PortError> {
        self.inner.reload().await
    }
    async fn status(&self) -> Result<ImexStatus, PortError> {
        self.inner.status().await
    }
    async fn stop(&self) -> Result<(), PortError> {
        self.inner.stop().await
    }
    async fn exited(&self) {
        self.inner.exited().await
    }
    fn outlives_node_daemon(&self) -> bool {
        self.inner.outlives_node_daemon()
    }
    fn claims_in_use(&self, in_use: bool) {
        self.inner.claims_in_use(in_use)
    }
    fn failing(&self, episode: u64) {
        self.inner.failing(episode);
        // Kept if nobody waits yet: the watch reads once when it next looks.
        self.failing.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use domaind_actors::testing::FakeImexFabric;

    use super::*;

    #[tokio::test]
    async fn the_start_of_a_failure_episode_is_passed_on_and_the_rest_delegated() {
        let fabric = FakeImexFabric::default();
        let daemon = fabric.daemon("node-a");
        let failing = Arc::new(Notify::new());
        let observed = ObservedImex::new(Arc::new(daemon.clone()), failing.clone());
        observed.start(&PeerSet::default()).await.unwrap();
        assert!(observed.status().await.unwrap().running);
        assert_eq!(daemon.calls().len(), 2, "{:?}", daemon.calls());

        observed.failing(1);
        // The permit was kept for a watch not yet waiting.
        tokio::time::timeout(std::time::Duration::from_secs(1), failing.notified())
            .await
            .expect("told");
    }
}
