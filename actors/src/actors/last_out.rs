//! The last node to leave a domain writes its status as vacated (NotReady, no nodes):
//! while members remain, their reporter writes the status without the leaver, but
//! once none does, nobody else would, and the status would keep describing a
//! workload that is gone.
//!
//! Members leaving together each see the others still advertising when they leave,
//! so a leaver does not decide at once: it watches gossip until no other member
//! advertises the domain (it is the last out: it writes), or until `within` has
//! passed with members still there (they stay: their reporter writes). When several
//! leave at the same moment, each may find itself last and write the same vacated
//! document; the status as written is read first, so a document already vacated is
//! not written again.

use std::sync::Arc;
use std::time::Duration;

use domaind_backoff::Backoff;
use futures::StreamExt;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::model::{CliqueId, DomainRef, NodeId, Phase};
use crate::ports::{DomainEvent, EventSink, Gossip, StatusSink};
use crate::rules::membership::{domain_key, domain_members, status_key};
use crate::rules::status::{digest, stale_once_vacated, vacated_document};

/// How many times a vacated status write is tried.
const WRITE_ATTEMPTS: u32 = 5;

/// What the leaver needs; it runs detached from the domain actor, which retires.
pub struct LastOut {
    pub domain: DomainRef,
    pub me: NodeId,
    pub clique: CliqueId,
    pub gossip: Arc<dyn Gossip>,
    pub sink: Arc<dyn StatusSink>,
    pub events: Arc<dyn EventSink>,
    /// How long to watch for the other members to leave.
    pub within: Duration,
}

impl std::fmt::Debug for LastOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LastOut")
            .field("domain", &self.domain.uid)
            .field("within", &self.within)
            .finish_non_exhaustive()
    }
}

/// Whether another member of the domain is in this view.
fn others_remain(last_out: &LastOut) -> bool {
    let view = domain_members(
        &last_out.domain.uid,
        &last_out.gossip.live(),
        &last_out.clique,
    );
    view.members.keys().any(|node| *node != last_out.me)
}

impl LastOut {
    /// Returns whether this node wrote the vacated status.
    pub async fn run(self) -> bool {
        let deadline = Instant::now() + self.within;
        let mut updates = self.gossip.updates();
        while others_remain(&self) {
            match tokio::time::timeout_at(deadline, updates.next()).await {
                Ok(Some(_)) => {}
                // Members stay (or gossip stopped): not the last out.
                _ => {
                    debug!(domain = %self.domain, "members remain after this node left; their reporter writes the status");
                    return false;
                }
            }
        }
        let (stale, phase_before) = match self.sink.read(&self.domain).await {
            Ok(written) => (
                stale_once_vacated(written.as_ref()),
                written.map(|w| w.status),
            ),
            Err(error) => {
                // Writing the vacated document twice is harmless; leaving a stale
                // status is not.
                warn!(domain = %self.domain, %error, "the written status cannot be read; writing it as vacated anyway");
                (true, None)
            }
        };
        if !stale {
            debug!(domain = %self.domain, "the status already says the domain is vacated");
            return false;
        }
        let vacated = vacated_document();
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        for attempt in 1..=WRITE_ATTEMPTS {
            match self.sink.write(&self.domain, &vacated).await {
                Ok(()) => {
                    info!(domain = %self.domain, "last member out: status written as vacated");
                    self.after_write(phase_before, &vacated.message).await;
                    return true;
                }
                // A refusal (RBAC, validation) gets the same answer a moment later:
                // the attempts left would only repeat it.
                Err(error) if attempt < WRITE_ATTEMPTS && !error.is_permanent() => {
                    let delay = backoff.fail();
                    warn!(domain = %self.domain, %error, retry_in = ?delay, "vacated status not written");
                    tokio::time::sleep(delay).await;
                }
                Err(error) => {
                    warn!(domain = %self.domain, %error, kind = %error.kind(), "vacated status not written; giving up");
                    return false;
                }
            }
        }
        false
    }

    async fn after_write(&self, phase_before: Option<Phase>, message: &str) {
        if phase_before == Some(Phase::Ready) {
            let event = DomainEvent::NotReady {
                message: message.to_owned(),
            };
            if let Err(error) = self.events.emit(&self.domain, event).await {
                warn!(domain = %self.domain, %error, "event not recorded");
            }
        }
        // A member that joined meanwhile and wrote before this write landed sees a
        // digest that is not its own and writes its document again (the status
        // writer's rewrite rule). The key is withdrawn after a while, unless this node
        // serves the domain again by then (its domain actor owns the key then).
        let key = status_key(&self.domain.uid);
        self.gossip.set(&key, &digest(&vacated_document())).await;
        tokio::time::sleep(self.within).await;
        let rejoined = self
            .gossip
            .live()
            .get(&self.me)
            .is_some_and(|m| m.keys.contains_key(&domain_key(&self.domain.uid)));
        if !rejoined {
            self.gossip.delete(&key).await;
        }
    }
}
