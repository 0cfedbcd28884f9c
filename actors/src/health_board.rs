//! The node's prepared devices and how each one's domain is, as the kubelet's health
//! stream, the claims' `status.devices` and the ResourceSlice's taints read it. The
//! node actor publishes a whole view on every change; readers take the latest, so a
//! slow reader skips views rather than queueing them.

use std::sync::Arc;

use tokio::sync::watch;

use crate::model::{AllocatedDevice, ClaimRef, DomainRef};
use crate::rules::channel_health::{ChannelHealth, DomainHealth, HealthReason};

/// One device of one claim prepared (or being prepared) on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    pub claim: ClaimRef,
    pub device: AllocatedDevice,
    pub domain: DomainRef,
    /// None until the domain has judged its health here.
    pub status: Option<DomainHealth>,
}

impl PreparedDevice {
    pub fn health(&self) -> &ChannelHealth {
        static UNKNOWN: ChannelHealth = ChannelHealth::Unknown;
        self.status
            .as_ref()
            .map_or(&UNKNOWN, |status| &status.health)
    }

    /// Why, as a machine reads it: `Pending` until the domain has judged.
    pub fn reason(&self) -> HealthReason {
        self.status
            .as_ref()
            .map_or(HealthReason::Pending, |status| status.reason)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HealthView {
    /// Claim by claim, in the checkpoint's order (by claim UID).
    pub devices: Vec<PreparedDevice>,
    /// This node's IMEX failure episode under way, and its first failure's reason.
    pub imex_failing: Option<String>,
}

#[derive(Debug, Clone)]
pub struct HealthBoard {
    tx: Arc<watch::Sender<Arc<HealthView>>>,
}

impl Default for HealthBoard {
    fn default() -> Self {
        Self {
            tx: Arc::new(watch::Sender::new(Arc::default())),
        }
    }
}

impl HealthBoard {
    pub fn subscribe(&self) -> watch::Receiver<Arc<HealthView>> {
        self.tx.subscribe()
    }

    /// The latest view.
    pub fn view(&self) -> Arc<HealthView> {
        self.tx.borrow().clone()
    }

    /// Publishes `view`; readers wake only if it differs from the last one.
    pub fn publish(&self, view: HealthView) {
        self.tx.send_if_modified(|current| {
            if **current == view {
                return false;
            }
            *current = Arc::new(view);
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readers_wake_only_on_a_change() {
        let board = HealthBoard::default();
        let mut reader = board.subscribe();
        reader.borrow_and_update();
        board.publish(HealthView::default());
        assert!(!reader.has_changed().unwrap());
        board.publish(HealthView {
            imex_failing: Some("exited".into()),
            ..HealthView::default()
        });
        assert!(reader.has_changed().unwrap());
        assert_eq!(
            reader.borrow_and_update().imex_failing.as_deref(),
            Some("exited")
        );
    }
}
