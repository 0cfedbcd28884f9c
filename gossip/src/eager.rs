//! Eager gossip: news travels now, not at the next round.
//!
//! Chitchat gossips with three random peers per round and publishes its live view
//! once per round, at the round's end. A domain forming is a chain of steps
//! (advertise, take a slot, configure IMEX, advertise readiness), and each step paid
//! for up to two rounds: one until the news was sent on, one until the receiver
//! looked at what it had been sent.
//!
//! Here a node that learns something refreshes the view domaind reads at once, and
//! starts gossip exchanges with random live peers, at most once per `interval` (a
//! burst of news becomes one push):
//!
//! - news of its own (a key it set or deleted) goes to `origin_fanout` peers: all of
//!   an 18-node rack, so that a domain's members hear in one round trip;
//! - news of others (a key arriving in a delta) goes on to `relay_fanout` peers, so
//!   that larger clusters hear in a few round trips. A relay alone would be a rumour
//!   that can die out before reaching everyone; the regular rounds still repeat
//!   everything to everyone.
//!
//! Heartbeats are not news, so an idle cluster sends nothing extra. A deletion is a
//! signed value (see `signed`), so it raises chitchat's key event like any news.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chitchat::{Chitchat, ChitchatHandle, ChitchatId, NodeState};
use rand::seq::IteratorRandom;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tracing::debug;

use crate::pulse::Liveness;

/// Gossip exchanges started to pass news on, outside the regular rounds.
pub const EAGER_PUSHES: &str = "domaind_gossip_eager_pushes_total";

pub(crate) type LiveNodes = BTreeMap<ChitchatId, NodeState>;

/// How news is passed on between rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EagerGossip {
    /// Random live peers told at once of this node's own news; 0 waits for the
    /// regular rounds.
    pub origin_fanout: usize,
    /// Random live peers news of other nodes is passed on to.
    pub relay_fanout: usize,
    /// At most one push per interval: a burst of news becomes one push.
    pub interval: Duration,
}

impl EagerGossip {
    /// Only the regular rounds.
    pub const OFF: Self = Self {
        origin_fanout: 0,
        relay_fanout: 0,
        interval: Duration::from_millis(20),
    };
}

impl Default for EagerGossip {
    fn default() -> Self {
        Self {
            // An NVL72 rack's other 17 nodes.
            origin_fanout: 17,
            relay_fanout: 3,
            interval: Duration::from_millis(20),
        }
    }
}

/// Whose news is waiting to be pushed; own news goes further.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Pending {
    Nothing,
    Relayed,
    Own,
}

/// The live nodes with their state, as of now (not of the last round's end): those
/// pulses say are live (`pulse`), not chitchat's failure detector, which hears
/// heartbeats only in its slow rounds.
pub(crate) fn live_nodes(chitchat: &Chitchat, liveness: &Liveness) -> LiveNodes {
    liveness
        .live_now(chitchat)
        .into_iter()
        .filter_map(|id| {
            let state = chitchat.node_state(&id)?.clone();
            Some((id, state))
        })
        .collect()
}

/// Whether two views differ in who is live or in any node's state version.
fn same_view(a: &LiveNodes, b: &LiveNodes) -> bool {
    let versions = |view: &LiveNodes| -> HashMap<ChitchatId, u64> {
        view.iter()
            .map(|(id, state)| (id.clone(), state.max_version()))
            .collect()
    };
    a.len() == b.len() && versions(a) == versions(b)
}

/// Up to `fanout` live peers other than `me`, at random.
pub(crate) fn push_targets(view: &LiveNodes, me: &ChitchatId, fanout: usize) -> Vec<SocketAddr> {
    view.keys()
        .filter(|id| *id != me)
        .map(|id| id.gossip_advertise_addr)
        .choose_multiple(&mut rand::rng(), fanout)
}

/// The task that keeps the view fresh and passes news on. It ends when chitchat's
/// own view closes (chitchat stopped) or when aborted.
pub(crate) struct EagerTask {
    /// This node changed one of its keys.
    pub own_news: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Drop for EagerTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EagerTask {
    pub async fn spawn(
        handle: Arc<ChitchatHandle>,
        config: EagerGossip,
        liveness: Arc<Liveness>,
    ) -> (Self, watch::Receiver<LiveNodes>) {
        let own_news = Arc::new(Notify::new());
        let relayed = Arc::new(Notify::new());
        let (rounds, initial, listener) = handle
            .with_chitchat(|chitchat| {
                let on_key = relayed.clone();
                let listener = chitchat.subscribe_event("", move |_| on_key.notify_one());
                (
                    chitchat.live_nodes_watcher(),
                    live_nodes(chitchat, &liveness),
                    listener,
                )
            })
            .await;
        let (view, reader) = watch::channel(initial);
        let task = tokio::spawn({
            let news = News {
                own: own_news.clone(),
                relayed,
            };
            async move {
                // Unsubscribes when the task ends.
                let _listener = listener;
                run(handle, rounds, view, news, config, liveness).await;
            }
        });
        (Self { own_news, task }, reader)
    }
}

struct News {
    own: Arc<Notify>,
    relayed: Arc<Notify>,
}

async fn run(
    handle: Arc<ChitchatHandle>,
    mut rounds: watch::Receiver<LiveNodes>,
    view: watch::Sender<LiveNodes>,
    news: News,
    config: EagerGossip,
    liveness: Arc<Liveness>,
) {
    let me = handle.chitchat_id().clone();
    let mut pulses = liveness.subscribe();
    let mut last_push: Option<Instant> = None;
    let mut pending = Pending::Nothing;
    // A node that knew nobody and now knows its clique (it joined, or came back from
    // a partition) tells them all of itself at once, as it would of a change: relays
    // alone can leave a clique-mate waiting for an anti-entropy round.
    let mut alone = view.borrow().len() <= 1;
    loop {
        let push_at = (pending != Pending::Nothing)
            .then(|| last_push.map(|at| at + config.interval))
            .flatten();
        tokio::select! {
            changed = rounds.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            changed = pulses.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = news.own.notified() => pending = Pending::Own,
            () = news.relayed.notified() => pending = pending.max(Pending::Relayed),
            () = sleep_until(push_at.unwrap_or_else(Instant::now)), if push_at.is_some() => {}
        }
        // Read the state under the lock rather than take the round's snapshot: that may
        // be older than a view already published from a delta.
        let now_live = handle
            .with_chitchat(|chitchat| live_nodes(chitchat, &liveness))
            .await;
        if alone && now_live.len() > 1 {
            pending = Pending::Own;
        }
        alone = now_live.len() <= 1;
        view.send_if_modified(|current| {
            let changed = !same_view(current, &now_live);
            if changed {
                *current = now_live.clone();
            }
            changed
        });
        let due = last_push.is_none_or(|at| Instant::now() >= at + config.interval);
        let fanout = match pending {
            Pending::Nothing => 0,
            Pending::Relayed => config.relay_fanout,
            Pending::Own => config.origin_fanout,
        };
        if pending != Pending::Nothing && due {
            pending = Pending::Nothing;
            last_push = Some(Instant::now());
            for addr in push_targets(&now_live, &me, fanout) {
                metrics::counter!(EAGER_PUSHES).increment(1);
                if let Err(error) = handle.gossip(addr) {
                    debug!(%error, "gossip stopped; no more pushes");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str, port: u16) -> ChitchatId {
        ChitchatId::new(name.to_owned(), 1, SocketAddr::from(([127, 0, 0, 1], port)))
    }

    #[test]
    fn pushes_go_to_at_most_fanout_peers_never_to_itself() {
        let me = id("a", 1);
        let view: LiveNodes = [id("a", 1), id("b", 2), id("c", 3), id("d", 4), id("e", 5)]
            .into_iter()
            .map(|id| (id, NodeState::for_test()))
            .collect();
        for _ in 0..50 {
            let targets = push_targets(&view, &me, 3);
            assert_eq!(targets.len(), 3);
            assert!(!targets.contains(&me.gossip_advertise_addr));
            let unique: std::collections::HashSet<_> = targets.iter().collect();
            assert_eq!(unique.len(), 3);
        }
        assert_eq!(push_targets(&view, &me, 10).len(), 4);
        assert!(push_targets(&view, &me, 0).is_empty());
    }
}
