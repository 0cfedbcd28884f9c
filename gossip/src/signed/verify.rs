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
//! - a part that starts a node's state from nothing (a first contact, or chitchat's
//!   reset after garbage collection) opens with the owner's certificate, which a node
//!   always keeps as its oldest value;
//! - a reset may not take back what this node holds: every value held that the part
//!   omits must be older than the part's garbage-collection mark, and that mark no
//!   newer than the part's own signed values; no value in it older than the one held.
//!
//! Only what chitchat would apply is checked (`chitchat_applies` mirrors its
//! `check_delta_status`): a part it ignores, and values not newer than the state held,
//! never reach the state, so they cost no signature check. Values older than the one
//! held are counted as `stale`: with eager gossip, exchanges cross all the time.

use std::collections::{BTreeMap, HashMap};

use chitchat::{ChitchatId, NodeState};
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
pub struct Held {
    /// The stored (signed) value of the owner's certificate.
    pub cert: Option<String>,
    /// Every key held, deletions included, with its version.
    pub versions: BTreeMap<String, u64>,
    pub max_version: u64,
    pub last_gc_version: u64,
}

impl Held {
    pub fn of(state: &NodeState) -> Self {
        let mut held = Self {
            max_version: state.max_version(),
            last_gc_version: state.last_gc_version(),
            ..Self::default()
        };
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
pub struct Passed {
    /// Values older than those held (ignored by chitchat).
    pub stale: usize,
    /// Values checked that were signed in a newer envelope version than this node's,
    /// and the newest such version.
    pub newer: usize,
    pub newest: u8,
}

/// Certificates already checked against the CA, so that each value's check is one
/// signature, not a chain. Cleared when the trust anchors change.
#[derive(Debug, Default)]
pub struct CertCache {
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
    pub fn clear(&mut self) {
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
                    .map_err(|e| Refusal::UntrustedCertificate(e.to_string()))?;
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
#[derive(Debug)]
pub struct Checker<'a> {
    pub cluster: &'a str,
    pub credentials: &'a StateCredentials,
    pub certs: &'a mut CertCache,
    pub now: UnixTime,
}

impl Checker<'_> {
    /// Checks one node's part of a delta against what this node holds of that node.
    pub fn check(&mut self, part: &NodePart, held: Option<&Held>) -> Result<Passed, Refusal> {
        if let Some(max_version) = part.ops.iter().find_map(|op| match op {
            NodeOp::SetMaxVersion(max) => Some(*max),
            NodeOp::KeyValue(_) => None,
        }) {
            return Err(Refusal::UnsignedMaxVersion { max_version });
        }
        let empty = Held::default();
        let held = held.unwrap_or(&empty);
        let older_than_held = part
            .key_values()
            .filter(|kv| held.versions.get(&kv.key).is_some_and(|v| *v > kv.version))
            .count();
        let Some(applied) = chitchat_applies(part, held) else {
            // Chitchat ignores the whole part: nothing in it reaches the state.
            return Ok(Passed {
                stale: older_than_held,
                ..Passed::default()
            });
        };
        let reset = applied == Applies::AfterReset;
        let from_nothing = reset || held.versions.is_empty();
        if from_nothing && part.key_values().next().is_none_or(|kv| kv.key != CERT_KEY) {
            return Err(Refusal::ResetWithoutCertificate);
        }
        let mut passed = Passed {
            stale: older_than_held,
            ..Passed::default()
        };
        let mut signer: Option<Vec<u8>> = match held.cert.as_deref().filter(|_| !reset) {
            Some(value) => Some(
                envelope::payload(value)
                    .and_then(envelope::cert_from_payload)
                    .ok_or(Refusal::UnknownSigner)?,
            ),
            None => None,
        };
        for kv in part.key_values() {
            if kv.status == STATUS_DELETED {
                return Err(Refusal::UnsignedTombstone {
                    key: kv.key.clone(),
                });
            }
            let held_version = held.versions.get(&kv.key).copied();
            if !reset && kv.version <= held.max_version {
                // Chitchat skips what is not newer than the state: nothing to check.
                continue;
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
            verify(&cert, &part.id, self.cluster, kv, &sealed)?;
            if sealed.version > envelope::ENVELOPE_VERSION {
                passed.newer += 1;
                passed.newest = passed.newest.max(sealed.version);
            }
            if reset
                && let Some(held_version) = held_version
                && held_version > kv.version
            {
                return Err(Refusal::Rollback {
                    key: kv.key.clone(),
                    held: held_version,
                });
            }
        }
        if reset {
            check_reset_keeps(part, held)?;
        }
        Ok(passed)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Applies {
    OnTop,
    AfterReset,
}

/// Whether chitchat 0.11.2 applies a node's part to the state held, and how: the
/// same decision as its `NodeState::check_delta_status`, so that exactly what chitchat
/// would apply is checked, and nothing it ignores costs a signature check.
fn chitchat_applies(part: &NodePart, held: &Held) -> Option<Applies> {
    if part.from_version_excluded > held.max_version {
        return None;
    }
    let compatible =
        part.last_gc_version <= held.last_gc_version || part.last_gc_version <= held.max_version;
    if !compatible {
        return (part.from_version_excluded == 0).then_some(Applies::AfterReset);
    }
    let part_max = part.key_values().map(|kv| kv.version).max().unwrap_or(0);
    (held.max_version < part_max).then_some(Applies::OnTop)
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
    sealed: &envelope::Sealed<'_>,
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
        payload: sealed.payload,
    }
    .message_as(sealed.version, &sealed.extensions);
    let der = CertificateDer::from(cert);
    let end_entity = webpki::EndEntityCert::try_from(&der).map_err(|_| bad())?;
    let algorithms = crate::tls::crypto_provider()
        .signature_verification_algorithms
        .mapping
        .iter()
        .find(|(known, _)| *known == sealed.scheme)
        .map(|(_, algorithms)| *algorithms)
        .ok_or_else(bad)?;
    algorithms
        .iter()
        .any(|algorithm| {
            end_entity
                .verify_signature(*algorithm, &message, &sealed.signature)
                .is_ok()
        })
        .then_some(())
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::NodeName;
    use crate::pki::{DevCa, NodeCertRequest};
    use crate::signed::envelope::{cert_payload, seal};

    const CLUSTER: &str = "domaind/clique/c1";

    struct Fixture {
        ca: DevCa,
        owner: StateCredentials,
        receiver: StateCredentials,
        evil: StateCredentials,
        foreign: StateCredentials,
        expired: StateCredentials,
        certs: CertCache,
    }

    fn credentials(
        ca: &DevCa,
        node: &str,
        valid: (time::Duration, time::Duration),
    ) -> StateCredentials {
        let node = NodeName::new(node).unwrap();
        let now = time::OffsetDateTime::now_utc();
        ca.issue(&NodeCertRequest {
            node: node.clone(),
            ips: Vec::new(),
            imex_shared_name: true,
            not_before: now + valid.0,
            not_after: now + valid.1,
        })
        .unwrap()
        .credentials(&node)
        .unwrap()
    }

    fn fixture() -> Fixture {
        let ca = DevCa::generate("ours", time::Duration::days(1)).unwrap();
        let theirs = DevCa::generate("theirs", time::Duration::days(1)).unwrap();
        let day = (time::Duration::hours(-1), time::Duration::days(1));
        Fixture {
            owner: credentials(&ca, "node-a", day),
            receiver: credentials(&ca, "node-b", day),
            evil: credentials(&ca, "node-evil", day),
            foreign: credentials(&theirs, "node-a", day),
            expired: credentials(
                &ca,
                "node-a",
                (time::Duration::days(-2), time::Duration::days(-1)),
            ),
            certs: CertCache::default(),
            ca,
        }
    }

    fn owner_id() -> ChitchatId {
        ChitchatId::new("node-a", 5, "127.0.0.2:7946".parse().unwrap())
    }

    /// A value as `signer` would sign it for `owner`.
    fn kv(
        signer: &StateCredentials,
        owner: &ChitchatId,
        key: &str,
        payload: &str,
        version: u64,
    ) -> KeyValue {
        envelope::signed_key_value(signer, CLUSTER, owner, key, payload, version)
    }

    fn cert_kv(signer: &StateCredentials, owner: &ChitchatId, version: u64) -> KeyValue {
        kv(
            signer,
            owner,
            CERT_KEY,
            &cert_payload(signer.cert()),
            version,
        )
    }

    fn part(owner: ChitchatId, from: u64, kvs: Vec<KeyValue>) -> NodePart {
        NodePart {
            id: owner,
            last_gc_version: 0,
            from_version_excluded: from,
            ops: kvs.into_iter().map(NodeOp::KeyValue).collect(),
        }
    }

    fn check(f: &mut Fixture, part: &NodePart, held: Option<&Held>) -> Result<Passed, Refusal> {
        Checker {
            cluster: CLUSTER,
            credentials: &f.receiver,
            certs: &mut f.certs,
            now: UnixTime::now(),
        }
        .check(part, held)
    }

    /// What a receiver holds after applying `kvs`.
    fn held(kvs: &[KeyValue]) -> Held {
        let mut held = Held {
            max_version: kvs.iter().map(|kv| kv.version).max().unwrap_or(0),
            ..Held::default()
        };
        for kv in kvs {
            held.versions.insert(kv.key.clone(), kv.version);
            if kv.key == CERT_KEY {
                held.cert = Some(kv.value.clone());
            }
        }
        held
    }

    fn honest_state(f: &Fixture) -> Vec<KeyValue> {
        let id = owner_id();
        vec![
            cert_kv(&f.owner, &id, 1),
            kv(&f.owner, &id, "domain/d1", "advertisement", 2),
            kv(&f.owner, &id, "status/d1", "digest", 3),
        ]
    }

    #[test]
    fn an_honest_first_contact_and_its_next_news_pass() {
        let mut f = fixture();
        let state = honest_state(&f);
        assert_eq!(
            check(&mut f, &part(owner_id(), 0, state.clone()), None),
            Ok(Passed::default())
        );
        let news = kv(&f.owner, &owner_id(), "domain/d1", "moved", 4);
        assert_eq!(
            check(
                &mut f,
                &part(owner_id(), 3, vec![news]),
                Some(&held(&state))
            ),
            Ok(Passed::default())
        );
    }

    /// A value as a node of the next version signs it: a newer envelope, with
    /// extensions its signature covers.
    fn next_version_kv(f: &Fixture, key: &str, payload: &str, version: u64) -> KeyValue {
        let wire = crate::version::WireVersion::Next;
        let owner = owner_id();
        let message = Subject {
            cluster: CLUSTER,
            owner: &owner,
            key,
            deleted: false,
            version,
            payload,
        }
        .message_as(wire.version(), wire.extension());
        let (scheme, signature) = f.owner.sign(&message).unwrap();
        KeyValue {
            key: key.into(),
            value: envelope::seal_as(
                wire.version(),
                wire.extension(),
                scheme,
                &signature,
                payload,
            ),
            version,
            status: STATUS_SET,
        }
    }

    #[test]
    fn a_value_of_a_newer_envelope_version_passes_and_is_counted_once() {
        let mut f = fixture();
        let state = honest_state(&f);
        let news = next_version_kv(&f, "domain/d1", "moved", 4);
        let passed = check(
            &mut f,
            &part(owner_id(), 3, vec![news.clone()]),
            Some(&held(&state)),
        )
        .unwrap();
        assert_eq!(
            passed,
            Passed {
                stale: 0,
                newer: 1,
                newest: envelope::ENVELOPE_VERSION + 1
            }
        );
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            crate::version::NewerVersions::default().note(
                "envelope",
                "node-a",
                u64::from(passed.newest),
                u64::from(envelope::ENVELOPE_VERSION),
                passed.newer,
            )
        });
        assert_eq!(
            crate::metrics::counted(&snapshotter, crate::metrics::NEWER_VERSION, "envelope"),
            1
        );
        // The signature covers the extensions: a relay cannot change them.
        let mut altered = news;
        let sealed = envelope::open(&altered.value).unwrap();
        altered.value = envelope::seal_as(
            sealed.version,
            b"another extension",
            sealed.scheme,
            &sealed.signature,
            sealed.payload,
        );
        let refusal = check(
            &mut f,
            &part(owner_id(), 3, vec![altered]),
            Some(&held(&state)),
        )
        .unwrap_err();
        assert_eq!(refusal.reason(), "bad_signature");
    }

    #[test]
    fn an_unsigned_value_is_refused() {
        let mut f = fixture();
        let mut state = honest_state(&f);
        state[1].value = "plain advertisement".into();
        let refusal = check(&mut f, &part(owner_id(), 0, state), None).unwrap_err();
        assert_eq!(refusal.reason(), "unsigned");
    }

    #[test]
    fn an_altered_value_is_refused() {
        let mut f = fixture();
        let mut state = honest_state(&f);
        let sealed = envelope::open(&state[1].value).unwrap();
        state[1].value = seal(sealed.scheme, &sealed.signature, "slot 0 is mine");
        let refusal = check(&mut f, &part(owner_id(), 0, state), None).unwrap_err();
        assert_eq!(refusal.reason(), "bad_signature");
    }

    #[test]
    fn a_value_relabelled_with_another_version_key_or_deletion_is_refused() {
        let mut f = fixture();
        let state = honest_state(&f);
        let base = held(&state);
        let news = kv(&f.owner, &owner_id(), "domain/d1", "moved", 4);
        let mut later = news.clone();
        later.version = 9;
        let mut other_key = news.clone();
        other_key.key = "domain/d2".into();
        let mut as_deletion = news.clone();
        as_deletion.status = STATUS_DELETE_AFTER_TTL;
        for forged in [later, other_key, as_deletion] {
            let refusal =
                check(&mut f, &part(owner_id(), 3, vec![forged]), Some(&base)).unwrap_err();
            assert_eq!(refusal.reason(), "bad_signature");
        }
    }

    #[test]
    fn a_node_moved_to_the_attackers_address_has_no_valid_value() {
        let mut f = fixture();
        let state = honest_state(&f);
        let moved = ChitchatId::new("node-a", 5, "127.0.0.66:7946".parse().unwrap());
        let refusal = check(&mut f, &part(moved, 0, state), None).unwrap_err();
        assert_eq!(refusal.reason(), "bad_signature");
    }

    #[test]
    fn a_ghost_or_a_forged_generation_cannot_be_signed_by_anyone_else() {
        let mut f = fixture();
        // The attacker signs state for a node that does not exist, and for a later
        // generation of a real one, with its own (valid) certificate.
        for id in [
            ChitchatId::new("node-ghost", 1, "127.0.0.66:7946".parse().unwrap()),
            ChitchatId::new("node-a", 6, "127.0.0.2:7946".parse().unwrap()),
        ] {
            let kvs = vec![
                cert_kv(&f.evil, &id, 1),
                kv(&f.evil, &id, "domain/d1", "joined_at_ms=1", 2),
            ];
            let refusal = check(&mut f, &part(id, 0, kvs), None).unwrap_err();
            assert_eq!(refusal.reason(), "wrong_signer");
        }
    }

    #[test]
    fn a_certificate_of_another_ca_or_an_expired_one_is_refused() {
        let mut f = fixture();
        let id = owner_id();
        let forged: Vec<Vec<KeyValue>> = [&f.foreign, &f.expired]
            .into_iter()
            .map(|signer| {
                vec![
                    cert_kv(signer, &id, 1),
                    kv(signer, &id, "domain/d1", "ad", 2),
                ]
            })
            .collect();
        for kvs in forged {
            let refusal = check(&mut f, &part(id.clone(), 0, kvs), None).unwrap_err();
            assert_eq!(refusal.reason(), "untrusted_certificate");
        }
    }

    #[test]
    fn news_of_a_node_whose_certificate_is_unknown_is_refused() {
        let mut f = fixture();
        // A state held without its certificate (which honest nodes never send).
        let mut uncertified = held(&honest_state(&f));
        uncertified.cert = None;
        let news = kv(&f.owner, &owner_id(), "domain/d1", "ad", 4);
        let refusal =
            check(&mut f, &part(owner_id(), 3, vec![news]), Some(&uncertified)).unwrap_err();
        assert_eq!(refusal, Refusal::UnknownSigner);
    }

    #[test]
    fn what_chitchat_would_ignore_costs_no_check() {
        let mut f = fixture();
        let state = honest_state(&f);
        let base = held(&state);
        let mut garbage = kv(&f.owner, &owner_id(), "domain/d1", "ad", 9);
        garbage.value = "not even signed".into();
        // From the future (past what is held): chitchat drops the part.
        assert_eq!(
            check(
                &mut f,
                &part(owner_id(), 5, vec![garbage.clone()]),
                Some(&base)
            ),
            Ok(Passed::default())
        );
        // Nothing newer than what is held: chitchat skips every value.
        let mut old = garbage.clone();
        old.version = 3;
        assert_eq!(
            check(&mut f, &part(owner_id(), 1, vec![old]), Some(&base)),
            Ok(Passed::default())
        );
        // Anything newer is checked.
        let refusal = check(&mut f, &part(owner_id(), 3, vec![garbage]), Some(&base)).unwrap_err();
        assert_eq!(refusal.reason(), "unsigned");
    }

    #[test]
    fn a_first_contact_that_crossed_a_newer_one_is_applied_on_top_not_refused() {
        let mut f = fixture();
        let id = owner_id();
        let old = honest_state(&f);
        let mut holding = old.clone();
        holding.push(kv(&f.owner, &id, "domain/d2", "later", 4));
        // A peer without domain/d2 but with a newer value answered a digest sent before
        // this node learned anything: from 0, nothing garbage-collected. Chitchat
        // applies it on top (it is not a reset): it takes nothing back, and what is
        // new in it is checked.
        let mut crossing = old.clone();
        crossing.push(kv(&f.owner, &id, "domain/d3", "newer", 5));
        assert_eq!(
            check(
                &mut f,
                &part(id.clone(), 0, crossing.clone()),
                Some(&held(&holding))
            ),
            Ok(Passed::default())
        );
        crossing[3].value = "forged".into();
        assert_eq!(
            check(&mut f, &part(id, 0, crossing), Some(&held(&holding)))
                .unwrap_err()
                .reason(),
            "unsigned"
        );
    }

    #[test]
    fn tombstones_and_bare_max_versions_are_refused() {
        let mut f = fixture();
        let state = honest_state(&f);
        let tombstone = KeyValue {
            key: "domain/d1".into(),
            value: String::new(),
            version: 4,
            status: STATUS_DELETED,
        };
        let refusal = check(
            &mut f,
            &part(owner_id(), 3, vec![tombstone]),
            Some(&held(&state)),
        )
        .unwrap_err();
        assert_eq!(refusal.reason(), "unsigned_tombstone");
        let mut bare = part(owner_id(), 3, Vec::new());
        bare.ops.push(NodeOp::SetMaxVersion(1_000_000));
        let refusal = check(&mut f, &bare, Some(&held(&state))).unwrap_err();
        assert_eq!(refusal.reason(), "unsigned_max_version");
    }

    #[test]
    fn a_signed_deletion_passes() {
        let mut f = fixture();
        let state = honest_state(&f);
        let message = Subject {
            cluster: CLUSTER,
            owner: &owner_id(),
            key: "status/d1",
            deleted: true,
            version: 4,
            payload: "",
        }
        .message();
        let (scheme, signature) = f.owner.sign(&message).unwrap();
        let deletion = KeyValue {
            key: "status/d1".into(),
            value: seal(scheme, &signature, ""),
            version: 4,
            status: STATUS_DELETE_AFTER_TTL,
        };
        assert!(
            check(
                &mut f,
                &part(owner_id(), 3, vec![deletion]),
                Some(&held(&state))
            )
            .is_ok()
        );
    }

    #[test]
    fn a_state_from_nothing_must_open_with_the_certificate() {
        let mut f = fixture();
        let state = honest_state(&f);
        let refusal = check(&mut f, &part(owner_id(), 0, state[1..].to_vec()), None).unwrap_err();
        assert_eq!(refusal, Refusal::ResetWithoutCertificate);
    }

    #[test]
    fn a_reset_cannot_take_back_what_is_held() {
        let mut f = fixture();
        let id = owner_id();
        let old = honest_state(&f);
        let newer = kv(&f.owner, &id, "status/d1", "digest 2", 4);
        let mut holding = old.clone();
        holding[2] = newer.clone();
        let now_held = held(&holding);

        // Replays the old status: older than held.
        let mut replay = part(id.clone(), 0, old.clone());
        replay.last_gc_version = 9;
        assert_eq!(
            check(&mut f, &replay, Some(&now_held))
                .unwrap_err()
                .reason(),
            "rollback"
        );

        // Leaves the status out, claiming it was collected: the claim is above every
        // version it signs for.
        let mut omit = part(id.clone(), 0, old[..2].to_vec());
        omit.last_gc_version = 9;
        assert_eq!(
            check(&mut f, &omit, Some(&now_held)).unwrap_err().reason(),
            "rollback"
        );

        // What an honest peer sends after collecting a deleted key: everything else,
        // at least as new as what is held.
        let gone = kv(&f.owner, &id, "gone", "x", 5);
        let mut with_gone = holding.clone();
        with_gone.push(gone);
        let mut honest = part(
            id.clone(),
            0,
            vec![
                old[0].clone(),
                old[1].clone(),
                newer.clone(),
                kv(&f.owner, &id, "later", "y", 7),
            ],
        );
        honest.last_gc_version = 6;
        assert_eq!(
            check(&mut f, &honest, Some(&held(&with_gone))),
            Ok(Passed::default())
        );
    }

    #[test]
    fn an_older_value_in_ordinary_news_is_counted_stale_and_left_to_chitchat() {
        let mut f = fixture();
        let id = owner_id();
        let state = honest_state(&f);
        let mut holding = state.clone();
        holding[2] = kv(&f.owner, &id, "status/d1", "digest 2", 6);
        let replay = part(id, 2, vec![state[2].clone()]);
        assert_eq!(
            check(&mut f, &replay, Some(&held(&holding))),
            Ok(Passed {
                stale: 1,
                ..Passed::default()
            })
        );
    }

    #[test]
    fn a_rotated_certificate_signs_what_follows_it() {
        let mut f = fixture();
        let id = owner_id();
        let state = honest_state(&f);
        let rotated = credentials(
            &f.ca,
            "node-a",
            (time::Duration::hours(-1), time::Duration::days(1)),
        );
        let rotation = vec![
            cert_kv(&rotated, &id, 4),
            kv(&rotated, &id, "domain/d1", "ad", 5),
        ];
        assert!(check(&mut f, &part(id.clone(), 3, rotation), Some(&held(&state))).is_ok());
        // After the new certificate, the old key signs nothing.
        let stale_key = vec![
            cert_kv(&rotated, &id, 4),
            kv(&f.owner, &id, "domain/d1", "ad", 5),
        ];
        let refusal =
            check(&mut f, &part(id.clone(), 3, stale_key), Some(&held(&state))).unwrap_err();
        assert_eq!(refusal.reason(), "bad_signature");
        // A rotation to a certificate of another CA is refused.
        let foreign = vec![
            cert_kv(&f.foreign, &id, 4),
            kv(&f.foreign, &id, "domain/d1", "ad", 5),
        ];
        let refusal = check(&mut f, &part(id, 3, foreign), Some(&held(&state))).unwrap_err();
        assert_eq!(refusal.reason(), "untrusted_certificate");
    }
}
