//! A development PKI: one CA, and node certificates signed by it, for the demo, tests
//! and clusters without a certificate manager. In production the chart mounts
//! certificates issued elsewhere in the same layout (`ca.crt`, `tls.crt`, `tls.key`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

use crate::identity::{IMEX_SHARED_NAME, NodeName};
use crate::signed::credentials::{CredentialsError, StateCredentials};
use crate::tls::TlsPaths;

pub const CA_CERT_FILE: &str = "ca.crt";
pub const CA_KEY_FILE: &str = "ca.key";

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("cannot generate {what}: {source}")]
    Generate {
        what: &'static str,
        source: rcgen::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a usable CA: {source}")]
    BadCa { path: PathBuf, source: rcgen::Error },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} exists; refusing to overwrite it (remove it first)")]
    Exists { path: PathBuf },
}

/// A certificate authority that signs node certificates.
pub struct DevCa {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for DevCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCa").finish_non_exhaustive()
    }
}

/// A node certificate and key, and the CA certificate that verifies its peers.
#[derive(Debug, Clone)]
pub struct NodeCert {
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_cert_pem: String,
}

/// What to put in a node certificate.
#[derive(Debug, Clone)]
pub struct NodeCertRequest {
    pub node: NodeName,
    /// Extra IP subject-alternative names; the node's identity is its DNS name alone.
    pub ips: Vec<IpAddr>,
    /// Also [`IMEX_SHARED_NAME`], as the cluster's signer issues it (on unless turned
    /// off, for a test's certificate IMEX in DNS-names mode must refuse).
    pub imex_shared_name: bool,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

impl NodeCertRequest {
    /// Valid from an hour ago (clock skew) for `valid_for`.
    pub fn new(node: NodeName, valid_for: Duration) -> Self {
        let now = OffsetDateTime::now_utc();
        Self {
            node,
            ips: Vec::new(),
            imex_shared_name: true,
            not_before: now - Duration::hours(1),
            not_after: now + valid_for,
        }
    }
}

impl DevCa {
    /// A new CA valid for `valid_for`.
    pub fn generate(common_name: &str, valid_for: Duration) -> Result<Self, PkiError> {
        let key = KeyPair::generate().map_err(|source| PkiError::Generate {
            what: "CA key",
            source,
        })?;
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::hours(1);
        params.not_after = now + valid_for;
        let cert = params
            .self_signed(&key)
            .map_err(|source| PkiError::Generate {
                what: "CA certificate",
                source,
            })?;
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads a CA written by [`DevCa::write`].
    pub fn load(dir: &Path) -> Result<Self, PkiError> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let read = |path: &PathBuf| {
            std::fs::read_to_string(path).map_err(|source| PkiError::Read {
                path: path.clone(),
                source,
            })
        };
        let cert_pem = read(&cert_path)?;
        let key_pem = read(&key_path)?;
        let key = KeyPair::from_pem(&key_pem).map_err(|source| PkiError::BadCa {
            path: key_path,
            source,
        })?;
        let issuer =
            Issuer::from_ca_cert_pem(&cert_pem, key).map_err(|source| PkiError::BadCa {
                path: cert_path,
                source,
            })?;
        Ok(Self {
            cert_pem,
            key_pem,
            issuer,
        })
    }

    /// Writes `ca.crt` and `ca.key` (mode 0600) into `dir`, never over existing files.
    pub fn write(&self, dir: &Path) -> Result<(), PkiError> {
        for name in [CA_CERT_FILE, CA_KEY_FILE] {
            let path = dir.join(name);
            if path.exists() {
                return Err(PkiError::Exists { path });
            }
        }
        write_file(&dir.join(CA_CERT_FILE), &self.cert_pem)?;
        write_file(&dir.join(CA_KEY_FILE), &self.key_pem)
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Signs a certificate for one node, usable as both TLS client and server.
    pub fn issue(&self, request: &NodeCertRequest) -> Result<NodeCert, PkiError> {
        let key = KeyPair::generate().map_err(|source| PkiError::Generate {
            what: "node key",
            source,
        })?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, request.node.as_str());
        let dns = request
            .node
            .as_str()
            .try_into()
            .map_err(|source| PkiError::Generate {
                what: "node name",
                source,
            })?;
        let shared = request
            .imex_shared_name
            .then(|| IMEX_SHARED_NAME.try_into().map(SanType::DnsName))
            .transpose()
            .map_err(|source| PkiError::Generate {
                what: "IMEX's shared name",
                source,
            })?;
        params.subject_alt_names = std::iter::once(SanType::DnsName(dns))
            .chain(shared)
            .chain(request.ips.iter().copied().map(SanType::IpAddress))
            .collect();
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        params.not_before = request.not_before;
        params.not_after = request.not_after;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|source| PkiError::Generate {
                what: "node certificate",
                source,
            })?;
        Ok(NodeCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            ca_cert_pem: self.cert_pem.clone(),
        })
    }
}

impl NodeCert {
    /// The credentials this certificate signs gossip state with.
    pub fn credentials(&self, node: &NodeName) -> Result<StateCredentials, CredentialsError> {
        StateCredentials::from_pem(node, &self.cert_pem, &self.key_pem, &self.ca_cert_pem)
    }

    /// Writes `tls.crt`, `tls.key` (mode 0600) and `ca.crt` into `dir`, each atomically,
    /// so a node watching the directory never reads half a rotation of one file.
    pub fn write(&self, dir: &Path) -> Result<TlsPaths, PkiError> {
        let paths = TlsPaths::in_dir(dir);
        write_file(&paths.ca_cert, &self.ca_cert_pem)?;
        write_file(&paths.key, &self.key_pem)?;
        write_file(&paths.cert, &self.cert_pem)?;
        Ok(paths)
    }
}

/// Replaces the file whole and durably (mode 0600): a node watching the directory
/// never reads half of it, and a power loss leaves the old file or the new.
fn write_file(path: &Path, contents: &str) -> Result<(), PkiError> {
    let error = |source| PkiError::Write {
        path: path.to_path_buf(),
        source,
    };
    domaind_atomic_file::replace_at(path, contents.as_bytes(), 0o600).map_err(error)
}

#[cfg(test)]
mod tests {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject as _;
    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::{FromDer as _, X509Certificate};

    use super::*;
    use crate::identity::node_name_of;

    fn dns_names(cert: &NodeCert) -> Vec<String> {
        let der = CertificateDer::from_pem_slice(cert.cert_pem.as_bytes()).unwrap();
        let (_, parsed) = X509Certificate::from_der(der.as_ref()).unwrap();
        let san = parsed.subject_alternative_name().unwrap().unwrap();
        let names = san
            .value
            .general_names
            .iter()
            .filter_map(|name| match name {
                GeneralName::DNSName(dns) => Some((*dns).to_owned()),
                _ => None,
            });
        names.collect()
    }

    /// What the cluster's signer issues, the dev CA issues: the node, then IMEX's
    /// shared name, which gossip never takes for the node.
    #[test]
    fn a_node_certificate_carries_imex_s_shared_name_unless_told_not_to() {
        let ca = DevCa::generate("test CA", Duration::days(1)).unwrap();
        let node = NodeName::new("node-a").unwrap();
        let mut request = NodeCertRequest::new(node.clone(), Duration::days(1));
        let cert = ca.issue(&request).unwrap();
        assert_eq!(dns_names(&cert), ["node-a", IMEX_SHARED_NAME]);
        let der = CertificateDer::from_pem_slice(cert.cert_pem.as_bytes()).unwrap();
        assert_eq!(node_name_of(&der).unwrap(), node);
        assert!(cert.credentials(&node).is_ok());
        request.imex_shared_name = false;
        assert_eq!(dns_names(&ca.issue(&request).unwrap()), ["node-a"]);
    }
}
