//! Pulses over an in-memory network, for simulations and tests: the same faults as
//! the gossip messages beside them (`NetworkFaults`), and an observer that sees every
//! pulse sent, to count traffic.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::sync::mpsc;

use super::{PulseArrival, PulseEndpoint, PulseNetwork, PulseOut};
use crate::transport::NetworkFaults;
use crate::transport::fault::Verdict;

/// Sees every pulse sent: sender, receiver, bytes.
pub type PulseObserver = Arc<dyn Fn(SocketAddr, SocketAddr, usize) + Send + Sync>;

type Inbox = mpsc::Sender<PulseArrival>;

/// An in-memory network for pulses; clones share it.
#[derive(Clone, Default)]
pub struct MemoryPulses {
    inboxes: Arc<Mutex<HashMap<SocketAddr, Inbox>>>,
    faults: Option<NetworkFaults>,
    observer: Option<PulseObserver>,
}

impl std::fmt::Debug for MemoryPulses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryPulses")
            .field("faults", &self.faults)
            .finish_non_exhaustive()
    }
}

/// A node's inbox holds this many pulses; more are dropped, as a full queue would.
const INBOX: usize = 1024;

impl MemoryPulses {
    pub fn new() -> Self {
        Self::default()
    }

    /// Pulses meet the faults of `faults`, as gossip messages do.
    pub fn with_faults(mut self, faults: NetworkFaults) -> Self {
        self.faults = Some(faults);
        self
    }

    pub fn observed_by(mut self, observer: PulseObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The node at `addr` died on a live host: its address refuses from now on, and
    /// every node that can reach it learns so, as the TLS transport's nodes do when its
    /// connections close (`PulseArrival::Gone`).
    pub fn close(&self, addr: SocketAddr) {
        let mut inboxes = self.inboxes.lock().unwrap_or_else(|p| p.into_inner());
        inboxes.remove(&addr);
        for (to, inbox) in inboxes.iter() {
            let cut_off = self
                .faults
                .as_ref()
                .is_some_and(|faults| faults.partitioned(addr, *to));
            if !cut_off {
                let _ = inbox.try_send(PulseArrival::Gone(addr));
            }
        }
    }
}

impl PulseNetwork for MemoryPulses {
    fn open(&self, addr: SocketAddr) -> PulseEndpoint {
        let (tx, inbox) = mpsc::channel(INBOX);
        // A node started again on the same address takes the address over.
        self.inboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr, tx);
        let rng = self
            .faults
            .as_ref()
            .map_or(0, |faults| faults.socket_seed(addr) ^ 0x9e37_79b9);
        PulseEndpoint {
            out: Arc::new(MemoryOut {
                from: addr,
                network: self.clone(),
                rng: Mutex::new(SmallRng::seed_from_u64(rng)),
            }),
            inbox,
        }
    }
}

struct MemoryOut {
    from: SocketAddr,
    network: MemoryPulses,
    rng: Mutex<SmallRng>,
}

impl PulseOut for MemoryOut {
    fn send(&self, to: SocketAddr, pulse: Bytes) {
        let network = &self.network;
        if let Some(observer) = &network.observer {
            observer(self.from, to, pulse.len());
        }
        let verdict = match &network.faults {
            Some(faults) => {
                let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
                faults.verdict(self.from, to, &mut rng)
            }
            None => Verdict::Deliver(std::time::Duration::ZERO),
        };
        let Verdict::Deliver(delay) = verdict else {
            return;
        };
        let Some(inbox) = network
            .inboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&to)
            .cloned()
        else {
            return;
        };
        let message = PulseArrival::Pulse(self.from, pulse);
        if delay.is_zero() {
            let _ = inbox.try_send(message);
        } else {
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = inbox.try_send(message);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[tokio::test(start_paused = true)]
    async fn pulses_arrive_unless_a_fault_drops_them_and_the_observer_sees_each() {
        let faults = NetworkFaults::new(1);
        let sent = Arc::new(Mutex::new(0usize));
        let counter = sent.clone();
        let network = MemoryPulses::new()
            .with_faults(faults.clone())
            .observed_by(Arc::new(move |_, _, bytes| {
                *counter.lock().unwrap() += bytes
            }));
        let a = network.open(addr(1));
        let mut b = network.open(addr(2));
        a.out.send(addr(2), Bytes::from_static(b"hi"));
        assert_eq!(
            b.inbox.recv().await,
            Some(PulseArrival::Pulse(addr(1), Bytes::from_static(b"hi")))
        );
        faults.cut(addr(1), addr(2));
        a.out.send(addr(2), Bytes::from_static(b"lost"));
        assert!(b.inbox.try_recv().is_err());
        assert_eq!(*sent.lock().unwrap(), 6);
        // Nobody there: dropped, as a datagram would be.
        a.out.send(addr(3), Bytes::from_static(b"x"));
    }
}
