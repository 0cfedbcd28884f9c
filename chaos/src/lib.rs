//! domaind's chaos harness.
//!
//! [`sim`]: a simulated rack in one process. N nodes, each the real node actors over
//! real gossip (chitchat) on an in-memory network with injected faults, with fakes for
//! IMEX, status, claims and checkpoints, in paused time. A [`script`] of operations
//! (add, prepare, kill, partition, assert...) drives it, in the manner of chitchat's
//! own cluster tests; [`checks`] are the invariants asserted from outside.
//!
//! The process-level harness (a rack of `domaind run` processes) comes later.

pub mod checks;
pub mod script;
pub mod sim;

pub use script::Operation;
pub use sim::{ClusterView, SimCluster, SimConfig};
