//! domaind's gossip plane.
//!
//! Daemons of one NVLink clique learn about each other by gossip (chitchat's
//! scuttlebutt with a phi-accrual failure detector), over TCP with mutual TLS. A node's
//! certificate names it, its chitchat node id is that name, and a peer cannot gossip
//! as anyone but the node its certificate names.
//!
//! - [`GossipNode`]: start, set and delete this node's keys, watch the membership, stop.
//! - eager gossip (`eager`): news is passed on at once and seen at once, between
//!   chitchat's rounds.
//! - [`tls::NodeTls`]: certificates from files, reloaded when they change.
//! - [`transport::TlsTransport`]: chitchat's transport over mutual TLS.
//! - [`transport::FaultyTransport`]: loss, delay and partitions for simulations.
//! - [`signed`]: every value signed by its owner and checked by every receiver.
//! - [`pki`]: a development CA and node certificates.

pub mod config;
mod crypto;
mod eager;
#[cfg(feature = "forge")]
pub mod forge;
pub mod identity;
pub mod membership;
pub mod metrics;
mod node;
pub mod pki;
pub mod pulse;
pub mod signed;
pub mod tls;
pub mod transport;
pub mod version;

pub use chitchat::transport::{ChannelTransport, Socket, Transport};

/// A lone chitchat node on the in-memory transport, for unit tests of what runs beside
/// it; its rounds are an hour apart, so nothing happens that the test did not ask for.
#[cfg(test)]
pub(crate) async fn lone_chitchat_for_tests(
    node: &str,
    addr: std::net::SocketAddr,
) -> chitchat::ChitchatHandle {
    let config = chitchat::ChitchatConfig {
        chitchat_id: chitchat::ChitchatId::new(node.to_owned(), 1, addr),
        cluster_id: "c".to_owned(),
        gossip_interval: std::time::Duration::from_secs(3600),
        listen_addr: addr,
        seed_nodes: Vec::new(),
        failure_detector_config: chitchat::FailureDetectorConfig::default(),
        marked_for_deletion_grace_period: std::time::Duration::from_secs(3600),
        catchup_callback: None,
        extra_liveness_predicate: None,
    };
    chitchat::spawn_chitchat(config, Vec::new(), &ChannelTransport::with_mtu(65_507))
        .await
        .expect("the in-memory address is free")
}
pub use config::{GossipConfig, GossipTiming, cluster_id_for_clique, default_generation};
pub use eager::{EAGER_PUSHES, EagerGossip};
pub use identity::{NodeName, NodeNameError};
pub use membership::{GossipEvent, Member, Membership};
pub use node::{GossipError, GossipNode, StateSize};
pub use signed::credentials::{CredentialsError, CredentialsWatch, StateCredentials};
