//! A signed gossip value, as chitchat stores and relays it: the owner's signature,
//! then the payload.
//!
//! ```text
//! value   = base64url(scheme: u16 BE | signature) "." payload
//! signed  = "domaind gossip state v1" 0x00
//!           | cluster id | node id | generation u64 | advertised address
//!           | key | deleted: u8 | version u64 | payload        (strings: u32 BE length | bytes)
//! ```
//!
//! The signature covers everything a relay could otherwise change: whose state it is
//! (node, generation and the address peers dial, so a value cannot be moved to a
//! forged id), which key, whether it is a deletion, and its version (so an old value
//! cannot be replayed as a new one).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chitchat::ChitchatId;
use rustls::SignatureScheme;

const CONTEXT: &[u8] = b"domaind gossip state v1\0";
const SEPARATOR: char = '.';

/// A node's certificate travels in its own state under this key, signed like any
/// other value; it is what every other value of that node is checked against.
pub const CERT_KEY: &str = "tls/cert";

/// A value taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed<'a> {
    pub scheme: SignatureScheme,
    pub signature: Vec<u8>,
    pub payload: &'a str,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("the value carries no signature")]
    NoSignature,
    #[error("the signature is not base64: {0}")]
    Encoding(String),
    #[error("the signature is too short")]
    Short,
}

/// What one signature covers.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub cluster: &'a str,
    pub owner: &'a ChitchatId,
    pub key: &'a str,
    pub deleted: bool,
    pub version: u64,
    pub payload: &'a str,
}

impl Subject<'_> {
    /// The bytes signed.
    pub fn message(&self) -> Vec<u8> {
        let addr = self.owner.gossip_advertise_addr.to_string();
        let mut out = Vec::with_capacity(
            CONTEXT.len() + 64 + self.cluster.len() + self.key.len() + self.payload.len(),
        );
        out.extend_from_slice(CONTEXT);
        push_str(&mut out, self.cluster);
        push_str(&mut out, &self.owner.node_id);
        out.extend_from_slice(&self.owner.generation_id.to_be_bytes());
        push_str(&mut out, &addr);
        push_str(&mut out, self.key);
        out.push(u8::from(self.deleted));
        out.extend_from_slice(&self.version.to_be_bytes());
        push_str(&mut out, self.payload);
        out
    }
}

fn push_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The stored value for `payload` under `signature`.
pub fn seal(scheme: SignatureScheme, signature: &[u8], payload: &str) -> String {
    let mut head = u16::from(scheme).to_be_bytes().to_vec();
    head.extend_from_slice(signature);
    let mut out = URL_SAFE_NO_PAD.encode(head);
    out.push(SEPARATOR);
    out.push_str(payload);
    out
}

/// Takes a stored value apart; checks nothing but its shape.
pub fn open(value: &str) -> Result<Sealed<'_>, EnvelopeError> {
    let (head, payload) = value
        .split_once(SEPARATOR)
        .ok_or(EnvelopeError::NoSignature)?;
    let head = URL_SAFE_NO_PAD
        .decode(head)
        .map_err(|e| EnvelopeError::Encoding(e.to_string()))?;
    let [hi, lo, signature @ ..] = head.as_slice() else {
        return Err(EnvelopeError::Short);
    };
    if signature.is_empty() {
        return Err(EnvelopeError::Short);
    }
    Ok(Sealed {
        scheme: SignatureScheme::from(u16::from_be_bytes([*hi, *lo])),
        signature: signature.to_vec(),
        payload,
    })
}

/// The payload of a stored value, without checking it: for values already checked
/// when they arrived, or written by this node.
pub fn payload(value: &str) -> Option<&str> {
    open(value).ok().map(|sealed| sealed.payload)
}

/// A value as `credentials` sign it for `owner`, in its wire form: what the owner
/// writes, for tests, benches and the chaos harness's forger, which must sign as
/// someone (themselves, or an owner they impersonate). Panics only if the key
/// cannot sign, which loading it already checked.
pub fn signed_key_value(
    credentials: &super::credentials::StateCredentials,
    cluster: &str,
    owner: &ChitchatId,
    key: &str,
    payload: &str,
    version: u64,
) -> crate::transport::wire::KeyValue {
    let message = Subject {
        cluster,
        owner,
        key,
        deleted: false,
        version,
        payload,
    }
    .message();
    let (scheme, signature) = credentials.sign(&message).expect("a loaded key signs");
    crate::transport::wire::KeyValue {
        key: key.into(),
        value: seal(scheme, &signature, payload),
        version,
        status: crate::transport::wire::STATUS_SET,
    }
}

/// A certificate as a payload.
pub fn cert_payload(der: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(der)
}

pub fn cert_from_payload(payload: &str) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(payload).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> ChitchatId {
        ChitchatId::new("node-a", 7, "127.0.0.2:7946".parse().unwrap())
    }

    #[test]
    fn a_sealed_value_opens_to_its_parts_payload_dots_included() {
        let value = seal(SignatureScheme::ECDSA_NISTP256_SHA256, &[1, 2, 3], "a.b.c");
        let sealed = open(&value).unwrap();
        assert_eq!(sealed.scheme, SignatureScheme::ECDSA_NISTP256_SHA256);
        assert_eq!(sealed.signature, vec![1, 2, 3]);
        assert_eq!(sealed.payload, "a.b.c");
    }

    #[test]
    fn unsigned_values_do_not_open() {
        assert_eq!(open("plain"), Err(EnvelopeError::NoSignature));
        assert!(matches!(open("!!.x"), Err(EnvelopeError::Encoding(_))));
        assert_eq!(
            open(&format!("{}.x", URL_SAFE_NO_PAD.encode([4u8, 3]))),
            Err(EnvelopeError::Short)
        );
    }

    #[test]
    fn every_field_changes_what_is_signed() {
        let owner = owner();
        let base = Subject {
            cluster: "c",
            owner: &owner,
            key: "k",
            deleted: false,
            version: 4,
            payload: "p",
        };
        let moved = ChitchatId::new("node-a", 7, "127.0.0.66:7946".parse().unwrap());
        let reborn = ChitchatId::new("node-a", 8, owner.gossip_advertise_addr);
        let someone = ChitchatId::new("node-b", 7, owner.gossip_advertise_addr);
        let variants = [
            Subject {
                cluster: "d",
                ..base
            },
            Subject {
                owner: &moved,
                ..base
            },
            Subject {
                owner: &reborn,
                ..base
            },
            Subject {
                owner: &someone,
                ..base
            },
            Subject { key: "l", ..base },
            Subject {
                deleted: true,
                ..base
            },
            Subject { version: 5, ..base },
            Subject {
                payload: "q",
                ..base
            },
            // Length prefixes: moving a byte between fields is another message.
            Subject {
                key: "kp",
                payload: "",
                ..base
            },
        ];
        for variant in variants {
            assert_ne!(variant.message(), base.message(), "{variant:?}");
        }
    }
}
