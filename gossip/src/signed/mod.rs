//! Owner-signed gossip state.
//!
//! Scuttlebutt relays every node's state through every other node, and chitchat does
//! not check who wrote what it relays. Here every value a node publishes is signed by
//! that node's TLS key, its certificate travels in its own state, and a receiver
//! checks each node's part of a delta against the owner's certificate before chitchat
//! applies it. Anyone may pass on anyone's state; nobody can alter it, invent a node,
//! move a node to another address, delete its values, or roll them back.
//!
//! - [`credentials`]: the certificate, key and CA a node signs and checks with.
//! - [`envelope`]: a signed value's form, and what the signature covers.
//! - `owner`: this node's writes, signed at the version chitchat gives them.
//! - [`verify`]: the checks on one node's part of a delta (pure).
//! - `check`: the transport that runs them on every message before chitchat.
//! - [`foreign`]: Syns of another cluster, dropped unanswered.

mod check;
pub mod credentials;
pub mod envelope;
pub mod foreign;
pub(crate) mod owner;
pub mod verify;

use std::collections::BTreeMap;

use chitchat::{DeletionStatus, NodeState};

pub(crate) use check::{SignedTransport, StateCheck, Verdict};
pub use envelope::CERT_KEY;
pub use verify::Refusal;

/// The values of a node's state as domaind sees them: the payloads of values set,
/// without deletions or the certificate. `None` for a node whose state carries no
/// certificate: chitchat learns of nodes from digests alone, and such a node (a ghost,
/// or a forged generation of a real one) has nothing signed to speak for it.
pub(crate) fn visible(state: &NodeState) -> Option<BTreeMap<String, String>> {
    state.get_versioned(CERT_KEY)?;
    Some(
        state
            .key_values_including_deleted()
            .filter(|(key, value)| *key != CERT_KEY && matches!(value.status, DeletionStatus::Set))
            .filter_map(|(key, value)| {
                Some((key.to_owned(), envelope::payload(&value.value)?.to_owned()))
            })
            .collect(),
    )
}
