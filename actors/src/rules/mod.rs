//! The rules, as pure functions and state machines: given what gossip says, every node
//! computes the same answer, so nodes agree without negotiating.

pub mod channel_health;
pub mod channel_roles;
pub mod channels;
pub mod domain_core;
pub mod imex_poll;
pub mod local_imex;
pub mod membership;
pub mod peer_health;
pub mod peers;
pub mod readiness;
pub mod reporter;
pub mod reporter_role;
pub mod roster;
pub mod slots;
pub mod status;
pub mod status_cliques;
pub mod status_writes;
pub mod takeover;

#[cfg(test)]
mod fixtures;
