//! The actors, each owning one thing (see docs/ARCHITECTURE.md for the whole picture):
//!
//! | actor | one per | owns |
//! |---|---|---|
//! | [`node::NodeActor`] | node | config, checkpoint, routing of prepare/unprepare, one-domain rule |
//! | [`gossip_bridge::GossipBridge`] | node | gossip's change stream, as messages |
//! | [`domain::DomainActor`] | domain on the node | advertisement, members, slots, peer set, readiness |
//! | [`channel::ChannelActor`] | prepared claim | answering the kubelet once the readiness policy holds |
//! | [`imex_peer::ImexPeerActor`] | remote member | drop and re-admit decisions |
//! | [`imex_process::ImexProcessActor`] | node | the IMEX daemon: start, apply, restart, readiness |
//! | [`status_writer::StatusWriterActor`] | domain, on its reporter | coalesced status writes |
//! //! | [`domain::DomainActor`] as the shared IMEX domain ([`sharing`]) | clique, on a node holding a domain of `isolation: Channel` | the IMEX daemon for every sharing domain, their channels |
//! | [`last_out::LastOut`] (a task) | domain, on a node its workload left | the vacated status, if this node was the last member |

pub mod channel;
pub mod domain;
pub mod gossip_bridge;
pub mod imex_peer;
pub mod imex_process;
pub mod last_out;
pub mod node;
pub mod sharing;
pub mod status_writer;
