//! A signed gossip value, as chitchat stores and relays it: the owner's signature,
//! then the payload.
//!
//! ```text
//! value   = base64url(scheme: u16 BE | signature) [ "~" version "~" base64url(extensions) ] "." payload
//! signed  = "domaind gossip state v1" 0x00
//!           | cluster id | node id | generation u64 | advertised address
//!           | key | deleted: u8 | version u64 | payload        (strings: u32 BE length | bytes)
//!           [ | envelope version: u8 | extensions ]           (with the suffix)
//! ```
//!
//! The signature covers everything a relay could otherwise change: whose state it is
//! (node, generation and the address peers dial, so a value cannot be moved to a
//! forged id), which key, whether it is a deletion, and its version (so an old value
//! cannot be replayed as a new one).
//!
//! Versions: version 1 has no suffix. A newer version writes its number (decimal) and
//! extensions in the suffix, and its signature covers them after what version 1 signs,
//! so an older reader checks the signature, reads the payload and skips the extensions.
//! Anything else that changes what is signed needs a new context string, which older
//! readers refuse. Releases before this one refuse the suffix: a release writes it
//! only once every node reads it (this one does), and this one writes version 1.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chitchat::ChitchatId;
use rustls::SignatureScheme;

const CONTEXT: &[u8] = b"domaind gossip state v1\0";
const SEPARATOR: char = '.';
/// Between the signature and a newer version's number and extensions: in neither
/// base64url nor a version number.
const SUFFIX: char = '~';

/// The envelope version this node speaks.
pub const ENVELOPE_VERSION: u8 = crate::version::WIRE_VERSION;

/// A node's certificate travels in its own state under this key, signed like any
/// other value; it is what every other value of that node is checked against.
pub const CERT_KEY: &str = "tls/cert";

/// A value taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed<'a> {
    pub scheme: SignatureScheme,
    pub signature: Vec<u8>,
    pub payload: &'a str,
    pub version: u8,
    /// A newer version's, unread here but signed.
    pub extensions: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("the value carries no signature")]
    NoSignature,
    #[error("the signature is not base64: {0}")]
    Encoding(String),
    #[error("the signature is too short")]
    Short,
    #[error("the envelope version is malformed: {0}")]
    Version(String),
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

    /// The bytes signed in an envelope of `version` with `extensions`.
    pub fn message_as(&self, version: u8, extensions: &[u8]) -> Vec<u8> {
        let mut out = self.message();
        if version > 1 {
            out.push(version);
            out.extend_from_slice(&(extensions.len() as u32).to_be_bytes());
            out.extend_from_slice(extensions);
        }
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

/// The stored value for `payload` under `signature`, in an envelope of `version`
/// (above 1) with `extensions`; the signature must cover them
/// ([`Subject::message_as`]).
pub fn seal_as(
    version: u8,
    extensions: &[u8],
    scheme: SignatureScheme,
    signature: &[u8],
    payload: &str,
) -> String {
    if version <= 1 {
        return seal(scheme, signature, payload);
    }
    let mut head = u16::from(scheme).to_be_bytes().to_vec();
    head.extend_from_slice(signature);
    format!(
        "{}{SUFFIX}{version}{SUFFIX}{}{SEPARATOR}{payload}",
        URL_SAFE_NO_PAD.encode(head),
        URL_SAFE_NO_PAD.encode(extensions)
    )
}

/// Takes a stored value apart; checks nothing but its shape.
pub fn open(value: &str) -> Result<Sealed<'_>, EnvelopeError> {
    let (head, payload) = value
        .split_once(SEPARATOR)
        .ok_or(EnvelopeError::NoSignature)?;
    let (head, version, extensions) = match head.split_once(SUFFIX) {
        None => (head, 1, Vec::new()),
        Some((head, suffix)) => {
            let malformed = |what: &str| EnvelopeError::Version(what.to_owned());
            let (version, extensions) = suffix
                .split_once(SUFFIX)
                .ok_or_else(|| malformed("no extensions"))?;
            // Only the decimal this module writes: `+2` and `02` parse as 2 too, and
            // the signature covers the number, not its text, so a relay could respell a
            // value it cannot alter.
            let version: u8 = version
                .parse()
                .ok()
                .filter(|parsed: &u8| parsed.to_string() == version)
                .ok_or_else(|| malformed("not a version number"))?;
            if version < 2 {
                return Err(malformed("version 1 has no suffix"));
            }
            let extensions = URL_SAFE_NO_PAD
                .decode(extensions)
                .map_err(|e| EnvelopeError::Encoding(e.to_string()))?;
            (head, version, extensions)
        }
    };
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
        version,
        extensions,
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
    fn a_newer_version_opens_to_the_parts_this_one_knows() {
        let value = seal_as(
            2,
            b"a field of version 2",
            SignatureScheme::ED25519,
            &[9, 9],
            "p.q",
        );
        let sealed = open(&value).unwrap();
        assert_eq!(
            (sealed.version, &sealed.extensions[..], sealed.payload),
            (2, &b"a field of version 2"[..], "p.q")
        );
        assert_eq!(payload(&value), Some("p.q"));
        // Version 1 is written as it always was.
        assert_eq!(
            seal_as(1, b"", SignatureScheme::ED25519, &[9], "p"),
            seal(SignatureScheme::ED25519, &[9], "p")
        );
        let owner = owner();
        let subject = Subject {
            cluster: "c",
            owner: &owner,
            key: "k",
            deleted: false,
            version: 1,
            payload: "p",
        };
        assert_eq!(subject.message_as(1, b""), subject.message());
        assert_ne!(subject.message_as(2, b"x"), subject.message_as(2, b"y"));
        assert_ne!(subject.message_as(2, b"x"), subject.message_as(3, b"x"));
    }

    #[test]
    fn a_malformed_version_suffix_does_not_open() {
        let sig = URL_SAFE_NO_PAD.encode([4u8, 3, 1]);
        for head in [
            format!("{sig}~2"),
            format!("{sig}~x~"),
            format!("{sig}~1~"),
            format!("{sig}~0~"),
            format!("{sig}~300~"),
        ] {
            assert!(
                matches!(open(&format!("{head}.p")), Err(EnvelopeError::Version(_))),
                "{head}"
            );
        }
        assert!(matches!(
            open(&format!("{sig}~2~!!.p")),
            Err(EnvelopeError::Encoding(_))
        ));
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

    /// Found by the `signed_state` fuzz target's contract (a value that opens seals back
    /// to the same text): `u8`'s parser takes `+2` and `02` for 2.
    #[test]
    fn a_version_spelt_otherwise_than_written_is_malformed() {
        let written = seal_as(
            2,
            b"ext",
            SignatureScheme::ECDSA_NISTP256_SHA256,
            &[1, 2],
            "p",
        );
        let sealed = open(&written).unwrap();
        assert_eq!(
            seal_as(2, &sealed.extensions, sealed.scheme, &sealed.signature, "p"),
            written
        );
        for respelt in ["~+2~", "~02~", "~002~"] {
            let value = written.replacen("~2~", respelt, 1);
            assert!(
                matches!(open(&value), Err(EnvelopeError::Version(_))),
                "{value}"
            );
        }
    }
}
