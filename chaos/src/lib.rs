//! domaind's chaos harness.
//!
//! Two harnesses share this crate:
//!
//! - [`sim`]: a simulated rack in one process. N nodes, each the real node actors over
//!   real gossip (chitchat) on an in-memory network with injected faults, with fakes
//!   for IMEX, status, claims and checkpoints, in paused time. A [`script`] of
//!   operations (add, prepare, kill, partition, assert...) drives it, in the manner of
//!   chitchat's own cluster tests; [`checks`] are the invariants asserted from outside.
//!   One simulation can hold many cliques, each its own gossip cluster; [`traffic`]
//!   counts gossip within each clique and across cliques.
//! - [`harness`] (`domaind-chaos run`): a rack of real `domaind run` processes on
//!   loopback, IMEX under a runner, under faults from a seeded [`schedule`] (SIGKILL of
//!   a daemon or a whole node, SIGSTOP, IMEX crashes, graceful restarts, a rolling
//!   upgrade, iptables partitions and loss, claim churn, certificate
//!   rotation, a state directory filled up on a tmpfs of [`statedir`]), [`observe`]d from outside through the files a node writes and its
//!   `/state`, checked against the [`invariants`] on every observation, and
//!   [`report`]ed as a table and JSON. With `--cliques K` the rack holds K cliques:
//!   faults hit the first, the others form their own domains beside it, and the
//!   [`cliques`] invariant watches every node for peers across cliques. With
//!   `--domains N` the rack's domains share its nodes with `isolation: Channel`, and the
//!   [`channels`] invariant watches that no pod holds another domain's channel.

pub mod channels;
pub mod checks;
pub mod cli;
pub mod cliques;
pub mod cluster;
pub mod forge;
pub mod harness;
pub mod invariants;
pub mod netfault;
pub mod observe;
pub mod report;
pub mod schedule;
pub mod script;
pub mod sighting;
pub mod sim;
pub mod soak;
pub mod statedir;
pub mod traffic;

pub use script::Operation;
pub use sim::{ClusterView, SimCluster, SimConfig};
