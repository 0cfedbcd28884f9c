//! Whether the process is still whole: the first fatal fault, once seen, fails the
//! probes and ends the process.
//!
//! Tokio catches a panicking task and lets the rest run on, and chitchat's server task
//! is one such task: without this the daemon would keep answering `/healthz` while its
//! gossip is dead and its view of the clique frozen. Two sources feed it: the gossip
//! task's end (watched, see [`watch_gossip`]) and a panic anywhere (the hook, see
//! [`install_panic_hook`]). The daemon's main loop waits on [`Vitals::failed`] next to
//! the stop signals and exits non-zero, so that Kubernetes restarts the container.

use std::sync::Arc;

use domaind_gossip::GossipNode;
use tokio::sync::watch;
use tracing::error;

#[derive(Debug)]
pub struct Vitals {
    failure: watch::Sender<Option<String>>,
}

impl Default for Vitals {
    fn default() -> Self {
        Self {
            failure: watch::Sender::new(None),
        }
    }
}

impl Vitals {
    /// Records a fatal fault; the first one is the reason reported, later ones add
    /// nothing (they are usually its consequences).
    pub fn fail(&self, reason: impl Into<String>) {
        let reason = reason.into();
        self.failure.send_if_modified(|failure| {
            if failure.is_some() {
                return false;
            }
            *failure = Some(reason);
            true
        });
    }

    /// The fatal fault, if one happened.
    pub fn failure(&self) -> Option<String> {
        self.failure.borrow().clone()
    }

    /// Resolves with the reason as soon as a fatal fault is recorded.
    pub async fn failed(&self) -> String {
        let mut watcher = self.failure.subscribe();
        // We hold the sender, so the channel stays open while we wait.
        let failure = watcher
            .wait_for(Option::is_some)
            .await
            .map(|failure| failure.clone());
        failure.ok().flatten().unwrap_or_default()
    }
}

/// Records the end of the gossip task as fatal, unless it was stopped on purpose.
pub fn watch_gossip(vitals: Arc<Vitals>, gossip: &GossipNode) -> tokio::task::JoinHandle<()> {
    let ended = gossip.ended();
    tokio::spawn(async move {
        let reason = ended.await;
        error!(%reason, "the gossip task ended; this node can no longer take part in its clique");
        vitals.fail(reason);
    })
}

/// Records every panic as fatal, after the default hook has printed it. Process-wide:
/// the daemon installs it once, in `run`, and tests do not.
pub fn install_panic_hook(vitals: Arc<Vitals>) {
    let print = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        print(info);
        vitals.fail(panic_reason(info));
    }));
}

/// What `/healthz` says about a panic: where, and the message when it is text.
pub fn panic_reason(info: &std::panic::PanicHookInfo<'_>) -> String {
    let payload = info.payload();
    let message = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)");
    let thread = std::thread::current();
    let thread = thread.name().unwrap_or("unnamed");
    match info.location() {
        Some(at) => format!("panic in thread {thread} at {at}: {message}"),
        None => format!("panic in thread {thread}: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_fault_is_the_reason() {
        let vitals = Vitals::default();
        assert_eq!(vitals.failure(), None);
        vitals.fail("gossip stopped: boom");
        vitals.fail("a consequence");
        assert_eq!(vitals.failure().as_deref(), Some("gossip stopped: boom"));
        assert_eq!(vitals.failed().await, "gossip stopped: boom");
    }

    async fn gossip_node() -> GossipNode {
        use domaind_gossip::pki::{DevCa, NodeCertRequest};
        use domaind_gossip::{ChannelTransport, GossipConfig, NodeName, cluster_id_for_clique};
        let node = NodeName::new("node-0").unwrap();
        let ca = DevCa::generate("test CA", time::Duration::hours(1)).unwrap();
        let credentials = ca
            .issue(&NodeCertRequest::new(
                node.clone(),
                time::Duration::hours(1),
            ))
            .unwrap()
            .credentials(&node)
            .unwrap()
            .fixed();
        let config = GossipConfig::new(
            node,
            "127.0.114.1:7946".parse().unwrap(),
            cluster_id_for_clique("cluster-1.0"),
        );
        GossipNode::start(
            config,
            &ChannelTransport::with_mtu(65_507),
            &domaind_gossip::pulse::MemoryPulses::new(),
            credentials,
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn a_dead_gossip_task_is_a_fault() {
        let vitals = Arc::new(Vitals::default());
        let gossip = gossip_node().await;
        let watch = watch_gossip(vitals.clone(), &gossip);
        assert_eq!(vitals.failure(), None);
        gossip.abort();
        watch.await.unwrap();
        let reason = vitals.failure().expect("the end of gossip is recorded");
        assert!(reason.starts_with("gossip stopped"), "{reason}");
    }

    #[tokio::test]
    async fn a_stopped_gossip_task_is_not_a_fault() {
        let vitals = Arc::new(Vitals::default());
        let gossip = gossip_node().await;
        let watch = watch_gossip(vitals.clone(), &gossip);
        gossip.stop().await.unwrap();
        // The watcher has seen the end (stop waited for it) and stays parked.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!watch.is_finished());
        assert_eq!(vitals.failure(), None);
        watch.abort();
    }

    #[tokio::test]
    async fn a_waiter_hears_of_a_later_fault() {
        let vitals = Arc::new(Vitals::default());
        let waiting = tokio::spawn({
            let vitals = vitals.clone();
            async move { vitals.failed().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        vitals.fail("gossip stopped on its own");
        assert_eq!(waiting.await.unwrap(), "gossip stopped on its own");
    }
}
