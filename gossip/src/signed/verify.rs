//! Checking one node's part of an incoming delta before chitchat applies it.
//!
//! A part is taken whole or refused whole: chitchat records the highest version it
//! applied, so taking some values and not others would make it believe it holds what
//! it dropped. A refused part is simply not there; honest peers send it again next
//! round. What a part must satisfy:
//!
//! - every value is signed by its owner's certificate, which travels in the owner's
//!   state ([`CERT_KEY`]), chains to our CA, names the owner, and is valid now;
//! - no chitchat tombstone (its value is emptied, so it cannot carry a signature: our
//!   nodes delete by writing a signed deletion) and no bare `SetMaxVersion` (a
//!   version claim no signature covers: it could make a receiver skip real updates);
//! - a part that starts a node's state from nothing (from version 0: a first contact,
//!   or chitchat's reset after garbage collection) opens with the owner's certificate,
//!   which a node always keeps as its oldest value;
//! - a reset may not take back what this node holds: every value held that the part
//!   omits must be older than the part's garbage-collection mark, and that mark no
//!   newer than the part's own signed values; no value in it older than the one held.
//!
//! Values older than what is held, in a part that is not a reset, are counted as
//! `stale` and left to chitchat, which ignores them.

use std::collections::{BTreeMap, HashMap};

use chitchat::{ChitchatId, NodeState};
use rustls::SignatureScheme;
use rustls_pki_types::{CertificateDer, UnixTime};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::credentials::StateCredentials;
use super::envelope::{self, CERT_KEY, Subject};
use crate::identity::node_name_of;
use crate::transport::wire::{
    KeyValue, NodeOp, NodePart, STATUS_DELETE_AFTER_TTL, STATUS_DELETED, STATUS_SET,
};

/// Why one node's part of a delta was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("value {key:?} carries no signature")]
    Unsigned { key: String },
    #[error("value {key:?} at version {version} is not signed by the owner's certificate")]
    BadSignature { key: String, version: u64 },
    #[error("the certificate in the state names {named:?}, not the owner")]
    WrongSigner { named: String },
    #[error("the owner's certificate is not one we trust: {0}")]
    UntrustedCertificate(String),
    #[error("no certificate is known for the owner, and the part carries none")]
    UnknownSigner,
    #[error("a tombstone for {key:?} (chitchat deletions carry no signature)")]
    UnsignedTombstone { key: String },
    #[error("a bare max-version claim ({max_version}) that no signature covers")]
    UnsignedMaxVersion { max_version: u64 },
    #[error("a state from version 0 that does not open with the owner's certificate")]
    ResetWithoutCertificate,
    #[error("a reset that would take back {key:?} (held at version {held})")]
    Rollback { key: String, held: u64 },
}

impl Refusal {
    /// The `reason` label of `domaind_gossip_state_refused_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Unsigned { .. } => "unsigned",
            Self::BadSignature { .. } => "bad_signature",
            Self::WrongSigner { .. } => "wrong_signer",
            Self::UntrustedCertificate(_) => "untrusted_certificate",
            Self::UnknownSigner => "unknown_signer",
            Self::UnsignedTombstone { .. } => "unsigned_tombstone",
            Self::UnsignedMaxVersion { .. } => "unsigned_max_version",
            Self::ResetWithoutCertificate => "reset_without_certificate",
            Self::Rollback { .. } => "rollback",
        }
    }
}

/// What this node holds of another node's state, as far as a check needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Held {
    /// The stored (signed) value of the owner's certificate.
    pub cert: Option<String>,
    /// Every key held, deletions included, with its version.
    pub versions: BTreeMap<String, u64>,
}

impl Held {
    pub(crate) fn of(state: &NodeState) -> Self {
        let mut held = Self::default();
        for (key, value) in state.key_values_including_deleted() {
            held.versions.insert(key.to_owned(), value.version);
            if key == CERT_KEY {
                held.cert = Some(value.value.clone());
            }
        }
        held
    }
}

/// What a part that passed brought along.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Passed {
    /// Values older than those held (ignored by chitchat).
    pub stale: usize,
}

/// Certificates already checked against the CA, so that each value's check is one
/// signature, not a chain. Cleared when the trust anchors change.
#[derive(Debug, Default)]
pub(crate) struct CertCache {
    checked: HashMap<Vec<u8>, CheckedCert>,
}

#[derive(Debug, Clone)]
struct CheckedCert {
    node: String,
    not_after: u64,
}

/// Distinct certificates remembered at most: about one per node of a clique, a few
/// more across rotations. Past it the cache starts over.
const MAX_CACHED_CERTS: usize = 4096;

impl CertCache {
    pub(crate) fn clear(&mut self) {
        self.checked.clear();
    }

    /// Checks `der` as `owner`'s certificate: our CA, the owner's name, valid now.
    fn check(
        &mut self,
        der: &[u8],
        owner: &ChitchatId,
        credentials: &StateCredentials,
        now: UnixTime,
    ) -> Result<(), Refusal> {
        let checked = match self.checked.get(der) {
            Some(checked) => checked.clone(),
            None => {
                let cert = CertificateDer::from(der);
                let node = node_name_of(&cert)
                    .map_err(|e| Refusal::UntrustedCertificate(e.to_string()))?
                    .to_string();
                credentials
                    .trusts(&cert, now)
                    .map_err(Refusal::UntrustedCertificate)?;
                let (_, parsed) = X509Certificate::from_der(der)
                    .map_err(|e| Refusal::UntrustedCertificate(e.to_string()))?;
                let checked = CheckedCert {
                    node,
                    not_after: parsed.validity().not_after.timestamp().max(0) as u64,
                };
                if self.checked.len() >= MAX_CACHED_CERTS {
                    self.checked.clear();
                }
                self.checked.insert(der.to_vec(), checked.clone());
                checked
            }
        };
        if checked.node != *owner.node_id {
            return Err(Refusal::WrongSigner {
                named: checked.node,
            });
        }
        if checked.not_after < now.as_secs() {
            return Err(Refusal::UntrustedCertificate(
                "the certificate has expired".into(),
            ));
        }
        Ok(())
    }
}

/// Everything a check needs besides the part and what is held.
pub(crate) struct Checker<'a> {
    pub cluster: &'a str,
    pub credentials: &'a StateCredentials,
    pub certs: &'a mut CertCache,
    pub now: UnixTime,
}

impl Checker<'_> {
    /// Checks one node's part of a delta against what this node holds of that node.
    pub(crate) fn check(
        &mut self,
        part: &NodePart,
        held: Option<&Held>,
    ) -> Result<Passed, Refusal> {
        if let Some(max_version) = part.ops.iter().find_map(|op| match op {
            NodeOp::SetMaxVersion(max) => Some(*max),
            NodeOp::KeyValue(_) => None,
        }) {
            return Err(Refusal::UnsignedMaxVersion { max_version });
        }
        let reset = part.from_version_excluded == 0;
        if reset && part.key_values().next().is_none_or(|kv| kv.key != CERT_KEY) {
            return Err(Refusal::ResetWithoutCertificate);
        }
        let mut signer: Option<Vec<u8>> = match held.and_then(|held| held.cert.as_deref()) {
            Some(value) => Some(
                envelope::payload(value)
                    .and_then(envelope::cert_from_payload)
                    .ok_or(Refusal::UnknownSigner)?,
            ),
            None => None,
        };
        let mut passed = Passed::default();
        for kv in part.key_values() {
            if kv.status == STATUS_DELETED {
                return Err(Refusal::UnsignedTombstone {
                    key: kv.key.clone(),
                });
            }
            let sealed = envelope::open(&kv.value).map_err(|_| Refusal::Unsigned {
                key: kv.key.clone(),
            })?;
            let cert = if kv.key == CERT_KEY {
                let der = envelope::cert_from_payload(sealed.payload)
                    .filter(|_| kv.status == STATUS_SET)
                    .ok_or_else(|| {
                        Refusal::UntrustedCertificate("the certificate value is not one".into())
                    })?;
                self.certs
                    .check(&der, &part.id, self.credentials, self.now)?;
                signer.insert(der).clone()
            } else {
                let der = signer.as_deref().ok_or(Refusal::UnknownSigner)?;
                self.certs
                    .check(der, &part.id, self.credentials, self.now)?;
                der.to_vec()
            };
            verify(
                &cert,
                &part.id,
                self.cluster,
                kv,
                sealed.scheme,
                &sealed.signature,
                sealed.payload,
            )?;
            if let Some(&held_version) = held.and_then(|held| held.versions.get(&kv.key))
                && held_version > kv.version
            {
                if reset {
                    return Err(Refusal::Rollback {
                        key: kv.key.clone(),
                        held: held_version,
                    });
                }
                passed.stale += 1;
            }
        }
        if reset && let Some(held) = held {
            check_reset_keeps(part, held)?;
        }
        Ok(passed)
    }
}

/// A reset replaces what is held: whatever it leaves out must be what the sender has
/// garbage-collected, and the sender cannot claim to have collected past the newest
/// value it signs for.
fn check_reset_keeps(part: &NodePart, held: &Held) -> Result<(), Refusal> {
    let newest_signed = part.key_values().map(|kv| kv.version).max().unwrap_or(0);
    let collected = part.last_gc_version.min(newest_signed);
    for (key, &held_version) in &held.versions {
        let kept = part.key_values().any(|kv| &kv.key == key);
        if !kept && held_version > collected {
            return Err(Refusal::Rollback {
                key: key.clone(),
                held: held_version,
            });
        }
    }
    Ok(())
}

fn verify(
    cert: &[u8],
    owner: &ChitchatId,
    cluster: &str,
    kv: &KeyValue,
    scheme: SignatureScheme,
    signature: &[u8],
    payload: &str,
) -> Result<(), Refusal> {
    let bad = || Refusal::BadSignature {
        key: kv.key.clone(),
        version: kv.version,
    };
    let message = Subject {
        cluster,
        owner,
        key: &kv.key,
        deleted: kv.status == STATUS_DELETE_AFTER_TTL,
        version: kv.version,
        payload,
    }
    .message();
    let der = CertificateDer::from(cert);
    let end_entity = webpki::EndEntityCert::try_from(&der).map_err(|_| bad())?;
    let algorithms = crate::tls::crypto_provider()
        .signature_verification_algorithms
        .mapping
        .iter()
        .find(|(known, _)| *known == scheme)
        .map(|(_, algorithms)| *algorithms)
        .ok_or_else(bad)?;
    algorithms
        .iter()
        .any(|algorithm| {
            end_entity
                .verify_signature(*algorithm, &message, signature)
                .is_ok()
        })
        .then_some(())
        .ok_or_else(bad)
}
