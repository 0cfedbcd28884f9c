//! Pulses: who is live, at two bytes per node per exchange.
//!
//! Chitchat carries liveness in its digests: every round a node sends every other
//! node's id, generation, address, heartbeat and versions to three peers and gets as
//! much back, about 50 bytes per node. At 144 nodes and a 150 ms round that was 290 KB/s
//! per node while nothing happened. Here chitchat keeps the state (what each node
//! publishes, signed) and its rounds become a slow anti-entropy backstop; news still
//! travels at once by eager push (`eager`). Liveness travels in pulses:
//!
//! - every `interval` a node counts one up and pushes every count it has heard to one
//!   live peer (and now and then to a node it thinks dead), which replies with the
//!   counts it holds newer: a push-pull exchange;
//! - counts travel as 16 bits each, by position in a table of the nodes both sides hold
//!   state for, identified by its hash (`wire`), or keyed by node when the tables
//!   differ;
//! - a node whose count has not gone up, and of which chitchat brought no news, for
//!   `dead_after` is dead (`table`): it leaves the live view that membership, slots and
//!   IMEX peers are computed from.
//!
//! The table and its rules are pure (`table`); this module is the task around them.
//! Pulses travel on the gossip connections (a frame kind of their own, the same sender
//! checks) or, in simulations, on [`MemoryPulses`].

pub mod memory;
pub mod table;
pub mod wire;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chitchat::{Chitchat, ChitchatHandle, ChitchatId};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand::seq::IteratorRandom;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{debug, info, warn};

pub use memory::{MemoryPulses, PulseObserver};
use table::{Mark, PulseTable};
use wire::Pulse;

use crate::signed::CERT_KEY;
use crate::transport::episodes::Episodes;
use crate::version::{NewerVersions, WireVersion};

/// Pulses received and dropped because they are malformed or too large.
pub const PULSES_REFUSED: &str = "domaind_gossip_pulses_refused_total";
/// Exchanges started because a pulse showed a peer holding other state.
pub const MENDS: &str = "domaind_gossip_mends_total";
/// Nodes this node stopped counting as live because their pulse stopped.
pub const NODES_SILENT: &str = "domaind_gossip_nodes_silent_total";
/// Peers found gone: their connection closed and nothing listened at their address.
pub const PEERS_GONE: &str = "domaind_gossip_peers_gone_total";

/// How often pulses go out and how long a silent node stays live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PulseTiming {
    pub interval: Duration,
    /// A node with no evidence of life for this long is dead.
    pub dead_after: Duration,
}

impl Default for PulseTiming {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(150),
            dead_after: Duration::from_secs(2),
        }
    }
}

/// Sends one node's pulses; never waits on the network (a full queue drops).
pub trait PulseOut: Send + Sync {
    fn send(&self, to: SocketAddr, pulse: Bytes);
}

/// What reaches a node's pulse task from its network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PulseArrival {
    /// A pulse, with its sender's gossip address.
    Pulse(SocketAddr, Bytes),
    /// Nothing listens at this gossip address any more: a connection from it closed and
    /// one to it was refused. Its daemon is gone (crashed, killed, stopped), which a
    /// silence would show only after the dead-after time.
    Gone(SocketAddr),
}

/// One node's end of a pulse network.
pub struct PulseEndpoint {
    pub(crate) out: Arc<dyn PulseOut>,
    pub(crate) inbox: mpsc::Receiver<PulseArrival>,
}

impl std::fmt::Debug for PulseEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PulseEndpoint").finish_non_exhaustive()
    }
}

/// A network pulses travel on.
pub trait PulseNetwork: Send + Sync {
    fn open(&self, addr: SocketAddr) -> PulseEndpoint;
}

/// The ids pulses say are live, this node's included.
pub(crate) type LiveIds = BTreeSet<ChitchatId>;

/// Where to turn while no peer is live: the seeds, as discovery or configuration
/// gives them.
pub(crate) type Seeds = watch::Receiver<Vec<SocketAddr>>;

/// The pulse table, shared by the pulse task (which counts and exchanges) and the
/// eager task (which reads who is live whenever chitchat brings news).
pub(crate) struct Liveness {
    table: Mutex<PulseTable>,
    dead_after: Duration,
    live: watch::Sender<LiveIds>,
}

impl Liveness {
    fn table(&self) -> std::sync::MutexGuard<'_, PulseTable> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Who is live now, after taking in what chitchat holds (a node chitchat just
    /// brought is live at once). Call it under chitchat's lock.
    pub(crate) fn live_now(&self, chitchat: &Chitchat) -> LiveIds {
        let now = Instant::now();
        let live: LiveIds = {
            let mut table = self.table();
            table.sync(known(chitchat), now);
            table.live(now, self.dead_after).into_iter().collect()
        };
        self.publish(&live);
        live
    }

    /// Changes of who is live, as pulses and chitchat's news show them.
    pub(crate) fn subscribe(&self) -> watch::Receiver<LiveIds> {
        self.live.subscribe()
    }

    fn publish(&self, now_live: &LiveIds) {
        self.live.send_if_modified(|current| {
            if current == now_live {
                return false;
            }
            let silent: Vec<_> = current.difference(now_live).collect();
            if !silent.is_empty() {
                metrics::counter!(NODES_SILENT).increment(silent.len() as u64);
                for id in silent {
                    info!(node = %id.node_id, generation = id.generation_id, "gossip peer silent: no pulse and no news of it for the dead-after time");
                }
            }
            *current = now_live.clone();
            true
        });
    }
}

/// The running pulse task; aborted when dropped.
pub(crate) struct PulseTask {
    task: tokio::task::AbortHandle,
    /// Why the task ended, once it has: it returned, panicked or was aborted.
    ended: watch::Receiver<Option<String>>,
}

impl Drop for PulseTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PulseTask {
    pub(crate) fn abort(&self) {
        self.task.abort();
    }

    /// Resolves with the reason once the task has ended, however it ended.
    pub(crate) fn ended(&self) -> impl Future<Output = String> + Send + 'static + use<> {
        let mut ended = self.ended.clone();
        async move {
            match ended.wait_for(Option::is_some).await {
                Ok(reason) => reason.clone().unwrap_or_default(),
                Err(_) => "gossip stopped: its pulses ended".to_string(),
            }
        }
    }

    pub(crate) fn spawn(
        handle: Arc<ChitchatHandle>,
        endpoint: PulseEndpoint,
        timing: PulseTiming,
        seeds: Seeds,
        wire: WireVersion,
    ) -> (Self, Arc<Liveness>) {
        let me = handle.chitchat_id().clone();
        let (live, _) = watch::channel(LiveIds::from([me.clone()]));
        let liveness = Arc::new(Liveness {
            table: Mutex::new(PulseTable::new(me)),
            dead_after: timing.dead_after,
            live,
        });
        let task = tokio::spawn(run(handle, liveness.clone(), endpoint, timing, seeds, wire));
        let abort = task.abort_handle();
        let (ended_tx, ended) = watch::channel(None);
        // Liveness stops with this task: whoever watches the node's health must hear
        // of it, a panic included.
        tokio::spawn(async move {
            let reason = match task.await {
                Ok(()) => "gossip stopped: its pulses ended on their own".to_string(),
                Err(error) if error.is_panic() => {
                    format!("gossip stopped: its pulse task panicked: {error}")
                }
                Err(_) => "gossip stopped: its pulse task was aborted".to_string(),
            };
            ended_tx.send_replace(Some(reason));
        });
        (Self { task: abort, ended }, liveness)
    }
}

/// The nodes chitchat holds signed state for, with what would show their news.
fn known(chitchat: &Chitchat) -> Vec<(ChitchatId, Mark)> {
    chitchat
        .node_states()
        .iter()
        .filter(|(_, state)| state.get_versioned(CERT_KEY).is_some())
        .map(|(id, state)| {
            (
                id.clone(),
                Mark {
                    heartbeat: u64::from(state.heartbeat()),
                    max_version: state.max_version(),
                },
            )
        })
        .collect()
}

async fn run(
    handle: Arc<ChitchatHandle>,
    liveness: Arc<Liveness>,
    endpoint: PulseEndpoint,
    timing: PulseTiming,
    seeds: Seeds,
    wire: WireVersion,
) {
    let PulseEndpoint { out, mut inbox } = endpoint;
    let newer = NewerVersions::default();
    let mut rng = SmallRng::from_rng(&mut rand::rng());
    let mut ticks = tokio::time::interval(timing.interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut refusals = Episodes::default();
    let mut last_mend: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = ticks.tick() => {
                let live = handle.with_chitchat(|chitchat| liveness.live_now(chitchat)).await;
                let (push, targets) = {
                    let mut table = liveness.table();
                    table.beat();
                    let targets = table.targets(Instant::now(), timing.dead_after, &mut rng);
                    (Bytes::from(table.push().encode_as(wire)), targets)
                };
                for target in targets {
                    out.send(target, push.clone());
                }
                if live.len() <= 1 {
                    reach_for_seeds(&handle, &seeds, &mut rng);
                }
            }
            received = inbox.recv() => {
                let (from, bytes) = match received {
                    Some(PulseArrival::Pulse(from, bytes)) => (from, bytes),
                    Some(PulseArrival::Gone(addr)) => {
                        let now = Instant::now();
                        let live = {
                            let mut table = liveness.table();
                            table.gone(addr, now, timing.dead_after)
                                .then(|| table.live(now, timing.dead_after).into_iter().collect::<LiveIds>())
                        };
                        if let Some(live) = live {
                            metrics::counter!(PEERS_GONE).increment(1);
                            info!(peer = %addr, "gossip peer gone: its connection closed and nothing listens at its address; dead now");
                            liveness.publish(&live);
                        }
                        continue;
                    }
                    None => {
                        debug!("pulse inbox closed; pulses stop");
                        return;
                    }
                };
                let pulse = match Pulse::read(&bytes) {
                    Ok(read) => {
                        if read.version > wire::PULSE_VERSION {
                            newer.note("pulse", &from.to_string(), u64::from(read.version), u64::from(wire::PULSE_VERSION), 1);
                        }
                        match read.pulse {
                            Some(pulse) => pulse,
                            None => continue,
                        }
                    }
                    Err(error) => {
                        metrics::counter!(PULSES_REFUSED, "reason" => error.reason()).increment(1);
                        if refusals.note(&from.to_string(), error.reason(), Instant::now()) {
                            warn!(peer = %from, %error, "pulse refused (further refusals from this peer are counted, not logged, until it stops for a minute)");
                        }
                        continue;
                    }
                };
                let now = Instant::now();
                let (received, live) = {
                    let mut table = liveness.table();
                    let received = table.receive(&pulse, now);
                    let back = table.heard_directly(from, now);
                    let live: Option<LiveIds> = (received.advanced > 0 || back)
                        .then(|| table.live(now, timing.dead_after).into_iter().collect());
                    (received, live)
                };
                if let Some(reply) = received.reply {
                    out.send(from, Bytes::from(reply.encode_as(wire)));
                }
                let differ = received.tables_differ || received.states_differ;
                if differ && last_mend.is_none_or(|at| now.saturating_duration_since(at) >= MEND_EVERY) {
                    last_mend = Some(now);
                    metrics::counter!(MENDS).increment(1);
                    debug!(peer = %from, tables = received.tables_differ, "a peer holds other gossip state; exchanging now");
                    let _ = handle.gossip(from);
                }
                if let Some(live) = live {
                    liveness.publish(&live);
                }
            }
        }
    }
}

/// A node told by a pulse that its peer holds other state (another table: a node
/// joined or came back; other versions: news a push missed) exchanges state with that
/// peer at once rather than at chitchat's next round, at most once per `MEND_EVERY`:
/// while news spreads, states differ everywhere for a moment, and at steady state they
/// are the same and nothing is exchanged.
const MEND_EVERY: Duration = Duration::from_millis(500);

/// A node that knows no live peer asks a random seed for a chitchat exchange, one per
/// round: that is how it joins, and how it finds its way back after its peers all
/// restarted.
fn reach_for_seeds(handle: &ChitchatHandle, seeds: &Seeds, rng: &mut SmallRng) {
    let me = handle.chitchat_id().gossip_advertise_addr;
    let seed = seeds
        .borrow()
        .iter()
        .filter(|addr| **addr != me)
        .choose(rng)
        .copied();
    if let Some(seed) = seed {
        debug!(%seed, "no live gossip peer; asking a seed");
        let _ = handle.gossip(seed);
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_end_of_the_pulse_task_is_told_however_it_ends() {
        let addr = SocketAddr::from(([127, 0, 0, 1], 7001));
        let handle = crate::lone_chitchat_for_tests("a", addr).await;
        let (_, seeds) = watch::channel(Vec::new());
        let (pulse, _) = PulseTask::spawn(
            Arc::new(handle),
            MemoryPulses::new().open(addr),
            PulseTiming::default(),
            seeds,
            WireVersion::Current,
        );
        let ended = pulse.ended();
        tokio::time::sleep(Duration::from_secs(1)).await;
        pulse.abort();
        assert_eq!(ended.await, "gossip stopped: its pulse task was aborted");
    }
}
