//! Gossip traffic by clique: a transport wrapper that sees every message with its
//! sender and receiver (and an observer that sees every pulse), and counts it within the sender's clique or across cliques.
//! It lives here, not in the gossip crate, because only simulations need it: it wraps
//! whatever transport the simulation hands to gossip, outside the signed layer, so the
//! bytes counted are the bytes chitchat's messages take on the in-memory network.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chitchat::transport::{Socket, Transport};
use chitchat::{ChitchatMessage, Serializable};
use domaind_gossip::pulse::PulseObserver;

/// Messages and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Count {
    pub messages: u64,
    pub bytes: u64,
}

impl Count {
    fn add(&mut self, bytes: usize) {
        self.messages += 1;
        self.bytes += bytes as u64;
    }

    /// What was counted since `earlier`.
    pub fn since(self, earlier: Count) -> Count {
        Count {
            messages: self.messages - earlier.messages,
            bytes: self.bytes - earlier.bytes,
        }
    }
}

#[derive(Debug, Default)]
struct Tally {
    clique_of: HashMap<SocketAddr, String>,
    /// Sent and received within one clique, keyed by that clique.
    within: BTreeMap<String, Count>,
    /// Sent to a node of another clique, or to an address no node of the simulation
    /// holds (nobody's clique is everybody's foreign clique).
    across: Count,
}

/// Where each address belongs, and what was sent; clones share the same counts.
#[derive(Debug, Clone, Default)]
pub struct CliqueTraffic {
    tally: Arc<Mutex<Tally>>,
}

impl CliqueTraffic {
    fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Says which clique the node listening on `addr` belongs to. An address keeps its
    /// clique until told otherwise.
    pub fn assign(&self, addr: SocketAddr, clique: &str) {
        self.tally().clique_of.insert(addr, clique.to_owned());
    }

    /// Traffic sent between two nodes of `clique`.
    pub fn within(&self, clique: &str) -> Count {
        self.tally().within.get(clique).copied().unwrap_or_default()
    }

    /// Traffic sent from a node of one clique to a node of another.
    pub fn across(&self) -> Count {
        self.tally().across
    }

    /// Everything sent so far, within cliques and across.
    pub fn total(&self) -> Count {
        let tally = self.tally();
        let mut total = tally.across;
        for count in tally.within.values() {
            total.messages += count.messages;
            total.bytes += count.bytes;
        }
        total
    }

    /// Counts pulses as they are sent, beside chitchat's messages.
    pub fn pulse_observer(&self) -> PulseObserver {
        let traffic = self.clone();
        Arc::new(move |from, to, bytes| traffic.record(from, to, bytes))
    }

    fn record(&self, from: SocketAddr, to: SocketAddr, bytes: usize) {
        let mut tally = self.tally();
        let same = match (tally.clique_of.get(&from), tally.clique_of.get(&to)) {
            (Some(a), Some(b)) if a == b => Some(a.clone()),
            _ => None,
        };
        match same {
            Some(clique) => tally.within.entry(clique).or_default().add(bytes),
            None => tally.across.add(bytes),
        }
    }
}

/// Wraps a transport and counts what its sockets send in a [`CliqueTraffic`].
#[derive(Debug)]
pub struct CountingTransport<T> {
    inner: T,
    traffic: CliqueTraffic,
}

impl<T: Transport> CountingTransport<T> {
    pub fn new(inner: T, traffic: CliqueTraffic) -> Self {
        Self { inner, traffic }
    }
}

#[async_trait]
impl<T: Transport> Transport for CountingTransport<T> {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let inner = self.inner.open(listen_addr).await?;
        Ok(Box::new(CountingSocket {
            inner,
            listen_addr,
            traffic: self.traffic.clone(),
        }))
    }
}

struct CountingSocket {
    inner: Box<dyn Socket>,
    listen_addr: SocketAddr,
    traffic: CliqueTraffic,
}

#[async_trait]
impl Socket for CountingSocket {
    // Counted as sent, before any fault drops it: a message that leaves for another
    // clique is a cost whether or not it arrives.
    async fn send(&mut self, to: SocketAddr, message: ChitchatMessage) -> anyhow::Result<()> {
        self.traffic
            .record(self.listen_addr, to, message.serialized_len());
        self.inner.send(to, message).await
    }

    async fn recv(&mut self) -> anyhow::Result<(SocketAddr, ChitchatMessage)> {
        self.inner.recv().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(last: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, last], 7946))
    }

    #[test]
    fn counts_within_a_clique_and_across_cliques_apart() {
        let traffic = CliqueTraffic::default();
        traffic.assign(addr(1), "a");
        traffic.assign(addr(2), "a");
        traffic.assign(addr(3), "b");
        traffic.record(addr(1), addr(2), 10);
        traffic.record(addr(2), addr(1), 5);
        traffic.record(addr(1), addr(3), 7);
        traffic.record(addr(3), addr(9), 3);
        assert_eq!(
            traffic.within("a"),
            Count {
                messages: 2,
                bytes: 15
            }
        );
        assert_eq!(traffic.within("b"), Count::default());
        assert_eq!(
            traffic.across(),
            Count {
                messages: 2,
                bytes: 10
            }
        );
    }
}
