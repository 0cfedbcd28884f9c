//! Network faults for simulations: loss, delay and partitions, applied where messages
//! arrive so that they wrap any transport (chitchat's in-memory `ChannelTransport`
//! included) without reaching into it. Decisions come from a seeded RNG per socket;
//! chitchat's own choice of gossip peers is not seeded, so simulations assert
//! outcomes, not schedules.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chitchat::ChitchatMessage;
use chitchat::transport::{Socket, Transport};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio_util::time::DelayQueue;

/// Counters of what the faults did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub delivered: u64,
    pub lost: u64,
    pub partitioned: u64,
}

#[derive(Debug, Default)]
struct FaultState {
    loss: f64,
    delay: Option<(Duration, Duration)>,
    /// Cut links, each stored with the lower address first.
    cut: HashSet<(SocketAddr, SocketAddr)>,
    isolated: HashSet<SocketAddr>,
    stats: FaultStats,
}

/// A handle on the faults of a simulated network; clones share the same faults.
#[derive(Debug, Clone)]
pub struct NetworkFaults {
    seed: u64,
    state: Arc<Mutex<FaultState>>,
}

pub(crate) enum Verdict {
    Deliver(Duration),
    Drop,
}

fn link(a: SocketAddr, b: SocketAddr) -> (SocketAddr, SocketAddr) {
    if a <= b { (a, b) } else { (b, a) }
}

impl NetworkFaults {
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            state: Arc::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FaultState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops each message with probability `probability` (clamped to 0..=1).
    pub fn set_loss(&self, probability: f64) {
        self.state().loss = probability.clamp(0.0, 1.0);
    }

    /// Delays each message by a duration drawn uniformly from `min..=max`.
    pub fn set_delay(&self, min: Duration, max: Duration) {
        self.state().delay = (max > Duration::ZERO).then_some((min.min(max), max));
    }

    /// Cuts the link between two nodes, both ways.
    pub fn cut(&self, a: SocketAddr, b: SocketAddr) {
        self.state().cut.insert(link(a, b));
    }

    /// Cuts a node off from every other.
    pub fn isolate(&self, node: SocketAddr) {
        self.state().isolated.insert(node);
    }

    /// Whether a partition lies between `a` and `b` (loss aside).
    pub fn partitioned(&self, a: SocketAddr, b: SocketAddr) -> bool {
        let state = self.state();
        state.isolated.contains(&a)
            || state.isolated.contains(&b)
            || state.cut.contains(&link(a, b))
    }

    /// Restores every cut link and isolated node; loss and delay stay.
    pub fn heal(&self) {
        let mut state = self.state();
        state.cut.clear();
        state.isolated.clear();
    }

    pub fn stats(&self) -> FaultStats {
        self.state().stats
    }

    pub(crate) fn verdict(&self, from: SocketAddr, to: SocketAddr, rng: &mut SmallRng) -> Verdict {
        if self.partitioned(from, to) {
            let mut state = self.state();
            state.stats.partitioned += 1;
            return Verdict::Drop;
        }
        let mut state = self.state();
        if state.loss > 0.0 && rng.random_bool(state.loss) {
            state.stats.lost += 1;
            return Verdict::Drop;
        }
        state.stats.delivered += 1;
        let delay = match state.delay {
            Some((min, max)) => rng.random_range(min..=max),
            None => Duration::ZERO,
        };
        Verdict::Deliver(delay)
    }

    pub(crate) fn socket_seed(&self, addr: SocketAddr) -> u64 {
        let ip_bits = match addr.ip() {
            std::net::IpAddr::V4(v4) => u64::from(u32::from(v4)),
            std::net::IpAddr::V6(v6) => {
                let bits = u128::from(v6);
                (bits as u64) ^ ((bits >> 64) as u64)
            }
        };
        self.seed ^ (ip_bits << 16) ^ u64::from(addr.port())
    }
}

/// Wraps a transport with the faults of `faults`.
#[derive(Debug)]
pub struct FaultyTransport<T> {
    inner: T,
    faults: NetworkFaults,
}

impl<T: Transport> FaultyTransport<T> {
    pub fn new(inner: T, faults: NetworkFaults) -> Self {
        Self { inner, faults }
    }
}

#[async_trait]
impl<T: Transport> Transport for FaultyTransport<T> {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let inner = self.inner.open(listen_addr).await?;
        Ok(Box::new(FaultySocket {
            inner,
            listen_addr,
            rng: SmallRng::seed_from_u64(self.faults.socket_seed(listen_addr)),
            faults: self.faults.clone(),
            delayed: DelayQueue::new(),
        }))
    }
}

struct FaultySocket {
    inner: Box<dyn Socket>,
    listen_addr: SocketAddr,
    faults: NetworkFaults,
    rng: SmallRng,
    delayed: DelayQueue<(SocketAddr, ChitchatMessage)>,
}

#[async_trait]
impl Socket for FaultySocket {
    async fn send(&mut self, to: SocketAddr, message: ChitchatMessage) -> anyhow::Result<()> {
        self.inner.send(to, message).await
    }

    // Cancel-safe, as chitchat needs: a message taken from the inner socket is either
    // returned, dropped by a fault, or parked in `delayed` before the next await.
    async fn recv(&mut self) -> anyhow::Result<(SocketAddr, ChitchatMessage)> {
        loop {
            tokio::select! {
                biased;
                Some(due) = futures::future::poll_fn(|cx| self.delayed.poll_expired(cx)) => {
                    return Ok(due.into_inner());
                }
                received = self.inner.recv() => {
                    let (from, message) = received?;
                    match self.faults.verdict(from, self.listen_addr, &mut self.rng) {
                        Verdict::Drop => continue,
                        Verdict::Deliver(delay) if delay.is_zero() => return Ok((from, message)),
                        Verdict::Deliver(delay) => {
                            self.delayed.insert((from, message), delay);
                        }
                    }
                }
            }
        }
    }
}
