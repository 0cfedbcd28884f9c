//! Mutual-TLS material for the gossip plane: one CA, one certificate per node.
//!
//! Certificates are read from files (the Kubernetes TLS-secret layout: `ca.crt`,
//! `tls.crt`, `tls.key`) and reloaded when the files change, so that rotation
//! needs no restart. Only TLS 1.3 is offered: both ends are ours.

mod reload;
mod verify;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::identity::{IdentityError, NodeName, node_name_of};
use crate::signed::credentials::StateCredentials;

pub use reload::NodeTls;

pub use crate::crypto::crypto_provider;

/// Where a node's TLS files live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPaths {
    pub ca_cert: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsPaths {
    /// The layout of a Kubernetes `kubernetes.io/tls` secret and of `domaind certs issue`.
    pub fn in_dir(dir: impl AsRef<Path>) -> Self {
        let dir = dir.as_ref();
        Self {
            ca_cert: dir.join("ca.crt"),
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} in {path} is not valid PEM: {reason}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{path} holds no {what}")]
    Empty { what: &'static str, path: PathBuf },
    #[error("node certificate {path}: {source}")]
    Identity {
        path: PathBuf,
        source: IdentityError,
    },
    #[error(
        "node certificate {path} names node {found:?} but this node is {expected:?}; \
         issue a certificate for {expected:?}"
    )]
    WrongNode {
        path: PathBuf,
        expected: NodeName,
        found: NodeName,
    },
    #[error("node certificate {path} is not valid now (valid from {not_before} until {not_after})")]
    NotValidNow {
        path: PathBuf,
        not_before: String,
        not_after: String,
    },
    #[error("TLS configuration rejected: {0}")]
    Config(String),
}

/// The raw bytes of the three files, as read: for a node's other TLS users (its IMEX
/// daemon) to get exactly the set gossip accepted, never a half-rotated one.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsFiles {
    ca_cert: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsFiles { .. }")
    }
}

impl TlsFiles {
    /// A set of PEM contents, as the files would hold them.
    pub fn from_pem(
        ca_cert: impl Into<Vec<u8>>,
        cert: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            ca_cert: ca_cert.into(),
            cert: cert.into(),
            key: key.into(),
        }
    }

    /// The CA bundle, PEM.
    pub fn ca_cert(&self) -> &[u8] {
        &self.ca_cert
    }

    /// The node's certificate chain, PEM.
    pub fn cert(&self) -> &[u8] {
        &self.cert
    }

    /// The node's private key, PEM.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    pub(crate) fn read(paths: &TlsPaths) -> Result<Self, TlsError> {
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                path: path.clone(),
                source,
            })
        };
        Ok(Self {
            ca_cert: read(&paths.ca_cert)?,
            cert: read(&paths.cert)?,
            key: read(&paths.key)?,
        })
    }
}

/// Ready-to-use rustls configurations for one node, built from one set of files.
#[derive(Debug)]
pub struct TlsMaterial {
    node: NodeName,
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    /// The same certificate and key, for signing gossip state.
    credentials: Arc<StateCredentials>,
    /// When the node certificate, and the first of the CA certificates, expire.
    expiry: Expiry,
}

/// Expiry times, in seconds since the Unix epoch: what an alert on a certificate close
/// to expiry compares with the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry {
    pub node_cert: i64,
    /// The earliest of the CA file's certificates: a bundle mid-rotation holds two.
    pub ca: i64,
}

impl TlsMaterial {
    pub(crate) fn build(
        paths: &TlsPaths,
        files: &TlsFiles,
        expected: &NodeName,
    ) -> Result<Self, TlsError> {
        let ca_certs = parse_certs(&paths.ca_cert, &files.ca_cert, "CA certificate")?;
        let chain = parse_certs(&paths.cert, &files.cert, "certificate")?;
        let key = PrivateKeyDer::from_pem_slice(&files.key).map_err(|e| TlsError::Pem {
            what: "private key",
            path: paths.key.clone(),
            reason: e.to_string(),
        })?;

        let node = node_name_of(&chain[0]).map_err(|source| TlsError::Identity {
            path: paths.cert.clone(),
            source,
        })?;
        if &node != expected {
            return Err(TlsError::WrongNode {
                path: paths.cert.clone(),
                expected: expected.clone(),
                found: node,
            });
        }
        let node_cert_expiry = check_valid_now(&paths.cert, &chain[0])?;
        let ca_expiry = ca_certs
            .iter()
            .map(|ca| not_after(&paths.ca_cert, ca))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .min()
            .expect("parse_certs refuses an empty CA file");

        let roots = roots(&ca_certs)?;
        let credentials = StateCredentials::new(&node, chain[0].clone(), &key, roots.clone())
            .map_err(|e| TlsError::Config(format!("gossip state signing: {e}")))?;
        let server = server_config_with(roots.clone(), chain.clone(), key.clone_key())?;
        let client = client_config_with(roots, chain, key)?;

        Ok(Self {
            node,
            server,
            client,
            credentials: Arc::new(credentials),
            expiry: Expiry {
                node_cert: node_cert_expiry,
                ca: ca_expiry,
            },
        })
    }

    pub fn expiry(&self) -> Expiry {
        self.expiry
    }

    pub fn node(&self) -> &NodeName {
        &self.node
    }

    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.server.clone()
    }

    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.client.clone()
    }

    pub fn credentials(&self) -> Arc<StateCredentials> {
        self.credentials.clone()
    }
}

/// A server end of mutual TLS: TLS 1.3, our certificate, and a client certificate
/// required and verified against `ca_certs` (chain, validity, client-auth usage; no
/// name: a client is whoever its certificate says).
pub fn server_config(
    ca_certs: &[CertificateDer<'static>],
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ServerConfig>, TlsError> {
    server_config_with(roots(ca_certs)?, chain, key)
}

/// A client end of mutual TLS: TLS 1.3, our certificate, and the server's chain verified
/// against `ca_certs` for the node name the certificate itself carries (see `verify`).
pub fn client_config(
    ca_certs: &[CertificateDer<'static>],
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ClientConfig>, TlsError> {
    client_config_with(roots(ca_certs)?, chain, key)
}

fn roots(ca_certs: &[CertificateDer<'static>]) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for ca in ca_certs {
        roots
            .add(ca.clone())
            .map_err(|e| TlsError::Config(format!("CA certificate: {e}")))?;
    }
    Ok(Arc::new(roots))
}

fn server_config_with(
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = crypto_provider();
    let client_verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let server = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(config_error)?
        .with_client_cert_verifier(client_verifier)
        .with_single_cert(chain, key)
        .map_err(config_error)?;
    Ok(Arc::new(server))
}

fn client_config_with(
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = crypto_provider();
    let server_verifier = verify::NodeServerVerifier::new(roots, provider.clone())?;
    let client = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(config_error)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(server_verifier))
        .with_client_auth_cert(chain, key)
        .map_err(config_error)?;
    Ok(Arc::new(client))
}

fn config_error(error: rustls::Error) -> TlsError {
    TlsError::Config(error.to_string())
}

/// The certificates of a PEM file, naming the file in the error.
pub fn read_certs(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_certs(path, &pem, what)
}

/// The private key of a PEM file, naming the file in the error.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Pem {
        what: "private key",
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

fn parse_certs(
    path: &Path,
    pem: &[u8],
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

fn parse_x509<'a>(
    path: &Path,
    cert: &'a CertificateDer<'_>,
) -> Result<X509Certificate<'a>, TlsError> {
    X509Certificate::from_der(cert.as_ref())
        .map(|(_, parsed)| parsed)
        .map_err(|e| TlsError::Identity {
            path: path.to_path_buf(),
            source: IdentityError::Unparsable(e.to_string()),
        })
}

/// When `cert` expires, in seconds since the Unix epoch.
fn not_after(path: &Path, cert: &CertificateDer<'_>) -> Result<i64, TlsError> {
    Ok(parse_x509(path, cert)?.validity().not_after.timestamp())
}

/// Refuses to start (or to rotate to) a certificate that peers would refuse anyway:
/// failing here names the file, where a peer's handshake error would not. Returns when
/// it expires, in seconds since the Unix epoch.
fn check_valid_now(path: &Path, cert: &CertificateDer<'_>) -> Result<i64, TlsError> {
    let parsed = parse_x509(path, cert)?;
    let validity = parsed.validity();
    if validity.is_valid() {
        Ok(validity.not_after.timestamp())
    } else {
        Err(TlsError::NotValidNow {
            path: path.to_path_buf(),
            not_before: validity.not_before.to_string(),
            not_after: validity.not_after.to_string(),
        })
    }
}
