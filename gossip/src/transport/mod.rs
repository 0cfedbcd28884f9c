//! Transports for chitchat: mutual TLS over TCP for real nodes, and fault injection
//! over any transport (chitchat's in-memory `ChannelTransport` in simulations).

mod admission;
pub(crate) mod episodes;
pub mod fault;
pub mod frame;
pub mod guard;
mod limits;
mod tls;
mod violation;
pub mod wire;

pub use admission::{Admission, Admitted, Refusal};
pub use fault::{FaultStats, FaultyTransport, NetworkFaults};
pub use limits::TransportLimits;
pub use tls::{Judged, TlsTransport, judge_frame};
