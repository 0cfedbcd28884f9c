//! Transports for chitchat: mutual TLS over TCP for real nodes, and fault injection
//! over any transport (chitchat's in-memory `ChannelTransport` in simulations).

mod admission;
pub mod fault;
pub mod frame;
mod limits;
mod tls;

pub use admission::{Admission, Admitted, Refusal};
pub use fault::{FaultStats, FaultyTransport, NetworkFaults};
pub use limits::TransportLimits;
pub use tls::TlsTransport;
