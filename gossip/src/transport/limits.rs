//! Bounds of the TLS transport. Reconnects back off with `domaind_backoff::Backoff`,
//! exact (no jitter): every node dials a peer over its own connection, so there is no
//! herd to spread.

use std::time::Duration;

use super::frame::DEFAULT_MAX_FRAME_BYTES;
use super::violation::MAX_INFLATED_BYTES;

/// Every queue, timeout and count the TLS transport holds to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportLimits {
    /// Frames above this size are refused, inbound and outbound.
    pub max_frame_bytes: usize,
    /// Frames waiting for one peer's writer; beyond it new frames are dropped, as a
    /// datagram would be, so that `send` never blocks the gossip loop.
    pub outbound_queue: usize,
    /// Frames received and not yet taken by the gossip loop...
    pub inbound_queue: usize,
    /// ...and the bytes they may hold: wire forms, and the keys and values of their
    /// deltas (one message alone always passes). Beyond either, frames are dropped.
    pub inbound_queue_bytes: usize,
    /// TCP connect plus TLS handshake, outbound.
    pub connect_timeout: Duration,
    /// TLS handshake, inbound: a peer that connects and never speaks is cut here.
    pub handshake_timeout: Duration,
    pub write_timeout: Duration,
    /// An outbound connection with nothing to send for this long is closed.
    pub outbound_idle_timeout: Duration,
    /// An inbound connection that sends nothing for this long is closed. Longer than
    /// the outbound one, so the sender closes first and never writes into a dead socket.
    pub inbound_idle_timeout: Duration,
    pub reconnect_backoff_min: Duration,
    pub reconnect_backoff_max: Duration,
    /// Concurrent inbound connections from one IP address.
    pub max_connections_per_ip: usize,
    /// Concurrent inbound connections in all.
    pub max_connections: usize,
    /// Ports an outbound connection must not take as its source port: another daemon
    /// on the node's address listens there (IMEX), and a connection that took one
    /// while that daemon was down would keep it from listening for as long as it
    /// lived. The kernel picks source ports from the same range (IMEX's default
    /// ports lie inside Linux's default ephemeral range).
    pub avoid_source_ports: Vec<u16>,
}

impl Default for TransportLimits {
    fn default() -> Self {
        Self {
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            outbound_queue: 64,
            inbound_queue: 1024,
            // Sixteen of the largest deltas a frame may carry.
            inbound_queue_bytes: 16 * MAX_INFLATED_BYTES,
            connect_timeout: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(3),
            write_timeout: Duration::from_secs(2),
            outbound_idle_timeout: Duration::from_secs(30),
            inbound_idle_timeout: Duration::from_secs(60),
            reconnect_backoff_min: Duration::from_millis(100),
            reconnect_backoff_max: Duration::from_secs(5),
            max_connections_per_ip: 16,
            max_connections: 1024,
            avoid_source_ports: Vec::new(),
        }
    }
}
