//! This node's own writes: every value signed as it is set, at the version chitchat is
//! about to give it.
//!
//! Chitchat gives a new value the node's max version plus one; the signature covers
//! that version, so a value is signed and set under one hold of chitchat's lock.
//!
//! The certificate is always the node's oldest value: a receiver that starts this
//! node's state from nothing meets it first, and checks the rest against it. So when
//! the certificate changes, every other value is signed again after it.

use chitchat::{Chitchat, DeletionStatus};

use super::credentials::{SignError, StateCredentials};
use super::envelope::{self, CERT_KEY, Subject};
use crate::version::WireVersion;

/// Why a value of this node was not written. Either is a bug (the key was checked when
/// loaded; chitchat's lock is held from signing to setting), so it is logged, not
/// retried.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    #[error(transparent)]
    Sign(#[from] SignError),
    #[error("chitchat gave {key:?} version {written:?}, the signature covers {version}")]
    VersionMoved {
        key: String,
        written: Option<u64>,
        version: u64,
    },
}

/// Sets `key` to `payload`, signed. False when it already held that payload.
pub(crate) fn publish(
    chitchat: &mut Chitchat,
    credentials: &StateCredentials,
    key: &str,
    payload: &str,
    wire: WireVersion,
) -> Result<bool, WriteError> {
    let state = chitchat.self_node_state();
    let unchanged = state.get_versioned(key).is_some_and(|current| {
        matches!(current.status, DeletionStatus::Set)
            && envelope::payload(&current.value) == Some(payload)
    });
    if unchanged {
        return Ok(false);
    }
    write(chitchat, credentials, key, payload, false, wire)?;
    Ok(true)
}

/// Deletes `key` with a signed deletion, which chitchat forgets after its grace
/// period like a tombstone. False when there was nothing to delete.
pub(crate) fn retract(
    chitchat: &mut Chitchat,
    credentials: &StateCredentials,
    key: &str,
    wire: WireVersion,
) -> Result<bool, WriteError> {
    let present = chitchat
        .self_node_state()
        .get_versioned(key)
        .is_some_and(|current| matches!(current.status, DeletionStatus::Set));
    if !present {
        return Ok(false);
    }
    write(chitchat, credentials, key, "", true, wire)?;
    Ok(true)
}

/// Publishes the certificate of `credentials` if it is not the one published, then
/// signs every other value again, oldest first. Returns how many values were written.
pub(crate) fn publish_certificate(
    chitchat: &mut Chitchat,
    credentials: &StateCredentials,
    wire: WireVersion,
) -> Result<usize, WriteError> {
    let cert = envelope::cert_payload(credentials.cert());
    let state = chitchat.self_node_state();
    let published = state
        .get_versioned(CERT_KEY)
        .and_then(|current| envelope::payload(&current.value))
        == Some(cert.as_str());
    if published {
        return Ok(0);
    }
    let mut others: Vec<(u64, String, String, bool)> = state
        .key_values_including_deleted()
        .filter(|(key, _)| *key != CERT_KEY)
        .filter_map(|(key, value)| {
            let deleted = match value.status {
                DeletionStatus::Set => false,
                DeletionStatus::DeleteAfterTtl(_) => true,
                // Never written by us: chitchat's own tombstones carry no signature.
                DeletionStatus::Deleted(_) => return None,
            };
            let payload = envelope::payload(&value.value)?.to_owned();
            Some((value.version, key.to_owned(), payload, deleted))
        })
        .collect();
    others.sort();
    write(chitchat, credentials, CERT_KEY, &cert, false, wire)?;
    for (_, key, payload, deleted) in &others {
        write(chitchat, credentials, key, payload, *deleted, wire)?;
    }
    Ok(1 + others.len())
}

fn write(
    chitchat: &mut Chitchat,
    credentials: &StateCredentials,
    key: &str,
    payload: &str,
    deleted: bool,
    wire: WireVersion,
) -> Result<(), WriteError> {
    let cluster = chitchat.cluster_id().to_owned();
    let owner = chitchat.self_chitchat_id().clone();
    let state = chitchat.self_node_state();
    let version = state.max_version() + 1;
    let subject = Subject {
        cluster: &cluster,
        owner: &owner,
        key,
        deleted,
        version,
        payload,
    };
    let (envelope_version, extensions) = (wire.version(), wire.extension());
    let (scheme, signature) =
        credentials.sign(&subject.message_as(envelope_version, extensions))?;
    let value = envelope::seal_as(envelope_version, extensions, scheme, &signature, payload);
    if deleted {
        state.set_with_ttl(key, value);
    } else {
        state.set(key, value);
    }
    let written = state.get_versioned(key).map(|value| value.version);
    if written != Some(version) {
        return Err(WriteError::VersionMoved {
            key: key.to_owned(),
            written,
            version,
        });
    }
    Ok(())
}
