//! What a node signs its gossip state with, and what it checks others' against: its
//! own TLS certificate and key, and the CA that TLS trusts. One identity for both, so
//! that rotating the certificate rotates the signing key, and a certificate the
//! handshake would refuse signs nothing anyone accepts.

use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::sign::SigningKey;
use rustls::{RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use tokio::sync::watch;

use crate::crypto::crypto_provider;
use crate::identity::{NodeName, node_name_of};

/// The signature schemes a node signs with, in order of preference: whichever its key
/// supports (our CA issues ECDSA P-256).
const SCHEMES: &[SignatureScheme] = &[
    SignatureScheme::ECDSA_NISTP256_SHA256,
    SignatureScheme::ED25519,
    SignatureScheme::ECDSA_NISTP384_SHA384,
    SignatureScheme::RSA_PSS_SHA256,
];

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("{what} is not valid PEM: {reason}")]
    Pem { what: &'static str, reason: String },
    #[error("the certificate does not name a node: {0}")]
    Identity(#[from] crate::identity::IdentityError),
    #[error("the certificate names {found}, not {expected}")]
    WrongNode { expected: NodeName, found: NodeName },
    #[error("the key cannot sign gossip state: {0}")]
    Key(String),
    #[error("the CA certificate is unusable: {0}")]
    Trust(String),
}

/// A node's certificate and key, and the trust anchors for everyone else's.
pub struct StateCredentials {
    node: NodeName,
    cert: CertificateDer<'static>,
    key: Arc<dyn SigningKey>,
    trust: Arc<dyn ClientCertVerifier>,
}

impl std::fmt::Debug for StateCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateCredentials")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// The credentials in force, replaced when the certificate rotates.
pub type CredentialsWatch = watch::Receiver<Arc<StateCredentials>>;

impl StateCredentials {
    /// Credentials from a node's certificate, key and CA. The certificate must name
    /// `node`; the key must be one rustls can sign with.
    pub fn new(
        node: &NodeName,
        cert: CertificateDer<'static>,
        key: &PrivateKeyDer<'_>,
        roots: Arc<RootCertStore>,
    ) -> Result<Self, CredentialsError> {
        let found = node_name_of(&cert)?;
        if &found != node {
            return Err(CredentialsError::WrongNode {
                expected: node.clone(),
                found,
            });
        }
        let provider = crypto_provider();
        let key = provider
            .key_provider
            .load_private_key(key.clone_key())
            .map_err(|e| CredentialsError::Key(e.to_string()))?;
        if key.choose_scheme(SCHEMES).is_none() {
            return Err(CredentialsError::Key(format!(
                "no scheme among {SCHEMES:?} fits a {:?} key",
                key.algorithm()
            )));
        }
        // The client verifier: node certificates are TLS client certificates too, so a
        // certificate carried in gossip is held to what the handshake requires.
        let trust = WebPkiClientVerifier::builder_with_provider(roots, provider)
            .build()
            .map_err(|e| CredentialsError::Trust(e.to_string()))?;
        Ok(Self {
            node: node.clone(),
            cert,
            key,
            trust,
        })
    }

    /// Credentials from PEM text: the node certificate (first in the chain), its key
    /// and the CA certificate(s).
    pub fn from_pem(
        node: &NodeName,
        cert_pem: &str,
        key_pem: &str,
        ca_pem: &str,
    ) -> Result<Self, CredentialsError> {
        let pem = |what: &'static str| {
            move |e: rustls_pki_types::pem::Error| CredentialsError::Pem {
                what,
                reason: e.to_string(),
            }
        };
        let cert =
            CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(pem("certificate"))?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(pem("key"))?;
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots
                .add(ca.map_err(pem("CA certificate"))?)
                .map_err(|e| CredentialsError::Trust(e.to_string()))?;
        }
        Self::new(node, cert, &key, Arc::new(roots))
    }

    /// Credentials that never rotate: for simulations and tests.
    pub fn fixed(self) -> CredentialsWatch {
        watch::channel(Arc::new(self)).1
    }

    pub fn node(&self) -> &NodeName {
        &self.node
    }

    pub fn cert(&self) -> &CertificateDer<'static> {
        &self.cert
    }

    /// Signs `message` with this node's key.
    pub fn sign(&self, message: &[u8]) -> Result<(SignatureScheme, Vec<u8>), SignError> {
        let signer = self.key.choose_scheme(SCHEMES).ok_or(SignError::NoScheme)?;
        let signature = signer.sign(message)?;
        Ok((signer.scheme(), signature))
    }

    /// Whether `cert` is one the gossip handshake would accept now: it chains to our
    /// CA, is valid at `now`, and may authenticate a client. The error is rustls's
    /// verdict.
    pub fn trusts(&self, cert: &CertificateDer<'_>, now: UnixTime) -> Result<(), rustls::Error> {
        self.trust.verify_client_cert(cert, &[], now).map(|_| ())
    }
}

/// Why this node's key signed nothing. Loading refuses a key that fits no scheme, so
/// either is a bug, not a condition to wait out.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("the key fits no signing scheme")]
    NoScheme,
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{DevCa, NodeCertRequest};

    fn name(node: &str) -> NodeName {
        NodeName::new(node).unwrap()
    }

    #[test]
    fn a_certificate_for_another_node_is_refused() {
        let ca = DevCa::generate("test CA", time::Duration::hours(1)).unwrap();
        let cert = ca
            .issue(&NodeCertRequest::new(
                name("node-a"),
                time::Duration::hours(1),
            ))
            .unwrap();
        let error = StateCredentials::from_pem(
            &name("node-b"),
            &cert.cert_pem,
            &cert.key_pem,
            &cert.ca_cert_pem,
        )
        .unwrap_err();
        assert!(
            matches!(error, CredentialsError::WrongNode { .. }),
            "{error}"
        );
    }

    #[test]
    fn credentials_trust_their_own_ca_and_not_another() {
        let ca = DevCa::generate("test CA", time::Duration::hours(1)).unwrap();
        let other = DevCa::generate("other CA", time::Duration::hours(1)).unwrap();
        let mine = ca
            .issue(&NodeCertRequest::new(
                name("node-a"),
                time::Duration::hours(1),
            ))
            .unwrap();
        let theirs = other
            .issue(&NodeCertRequest::new(
                name("node-b"),
                time::Duration::hours(1),
            ))
            .unwrap();
        let creds = StateCredentials::from_pem(
            &name("node-a"),
            &mine.cert_pem,
            &mine.key_pem,
            &mine.ca_cert_pem,
        )
        .unwrap();
        let der = |pem: &str| CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        assert!(creds.trusts(&der(&mine.cert_pem), UnixTime::now()).is_ok());
        assert!(
            creds
                .trusts(&der(&theirs.cert_pem), UnixTime::now())
                .is_err()
        );
        let (scheme, signature) = creds.sign(b"hello").unwrap();
        assert_eq!(scheme, SignatureScheme::ECDSA_NISTP256_SHA256);
        assert!(!signature.is_empty());
    }
}
