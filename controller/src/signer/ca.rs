//! The gossip CA the controller signs node certificates with: loaded from its Secret,
//! or made once when there is none. Its key never leaves this process and the Secret.

use std::time::Duration;

use domaind_kube_api::names::IMEX_SHARED_NAME;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::OffsetDateTime;
use x509_parser::prelude::FromDer as _;

use super::rules::Grant;

/// How far back a certificate's validity starts: nodes whose clocks lag a little still
/// accept a certificate issued a moment ago.
const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// The CA's common name when the controller makes it.
const GENERATED_CA_NAME: &str = "domaind gossip CA";

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("the CA key is not a PEM private key rcgen can use: {0}")]
    Key(rcgen::Error),
    #[error("the CA certificate is not usable with its key: {0}")]
    Cert(rcgen::Error),
    #[error("the CA certificate cannot be parsed: {0}")]
    Parse(String),
    #[error("the CA expired at {0}")]
    Expired(OffsetDateTime),
    #[error("cannot make {what}: {source}")]
    Generate {
        what: &'static str,
        source: rcgen::Error,
    },
}

pub struct GossipCa {
    cert_pem: String,
    key_pem: String,
    not_after: OffsetDateTime,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for GossipCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GossipCa")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl GossipCa {
    /// A CA from a `kubernetes.io/tls` Secret's `tls.crt` and `tls.key`.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CaError> {
        let key = KeyPair::from_pem(key_pem).map_err(CaError::Key)?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).map_err(CaError::Cert)?;
        let (_, block) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
            .map_err(|e| CaError::Parse(e.to_string()))?;
        let (_, cert) = x509_parser::certificate::X509Certificate::from_der(&block.contents)
            .map_err(|e| CaError::Parse(e.to_string()))?;
        Ok(Self {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
            not_after: cert.validity().not_after.to_datetime(),
            issuer,
        })
    }

    /// A new CA, valid for `valid_for` from now.
    pub fn generate(valid_for: Duration, now: OffsetDateTime) -> Result<Self, CaError> {
        let generate = |what| move |source| CaError::Generate { what, source };
        let key = KeyPair::generate().map_err(generate("the CA key"))?;
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params
            .distinguished_name
            .push(DnType::CommonName, GENERATED_CA_NAME);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = now - BACKDATE;
        params.not_after = now + valid_for;
        let cert = params
            .self_signed(&key)
            .map_err(generate("the CA certificate"))?;
        Self::from_pem(&cert.pem(), &key.serialize_pem())
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Signs what `grant` allows, and only that: CN and the first DNS SAN are the node,
    /// the second IMEX's shared name if granted, the IP SANs its own addresses it asked
    /// for, the usages gossip's. It ends with the grant's lifetime or the CA, if sooner.
    pub fn sign(&self, grant: &Grant, now: OffsetDateTime) -> Result<String, CaError> {
        if self.not_after <= now {
            return Err(CaError::Expired(self.not_after));
        }
        let generate = |source| CaError::Generate {
            what: "the node certificate",
            source,
        };
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, grant.node.as_str());
        let shared = grant
            .imex_shared_name
            .then(|| IMEX_SHARED_NAME.try_into().map(SanType::DnsName))
            .transpose()
            .map_err(generate)?;
        params.subject_alt_names = std::iter::once(SanType::DnsName(
            grant.node.as_str().try_into().map_err(generate)?,
        ))
        .chain(shared)
        .chain(grant.ips.iter().copied().map(SanType::IpAddress))
        .collect();
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        params.not_before = now - BACKDATE;
        params.not_after = (now + grant.lifetime).min(self.not_after);
        let request = CertificateSigningRequestParams {
            params,
            public_key: grant.public_key.clone(),
        };
        Ok(request.signed_by(&self.issuer).map_err(generate)?.pem())
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use rcgen::PublicKeyData as _;
    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::X509Certificate;

    use super::*;

    fn parse(pem: &str) -> Vec<u8> {
        x509_parser::pem::parse_x509_pem(pem.as_bytes())
            .unwrap()
            .1
            .contents
    }

    fn grant(key: &KeyPair, lifetime: Duration) -> Grant {
        let csr = CertificateParams::new(vec!["node-a".to_string()])
            .unwrap()
            .serialize_request(key)
            .unwrap();
        let parsed = CertificateSigningRequestParams::from_der(csr.der()).unwrap();
        Grant {
            node: "node-a".into(),
            ips: vec![IpAddr::from([10, 0, 0, 1])],
            imex_shared_name: true,
            lifetime,
            public_key: parsed.public_key,
        }
    }

    #[test]
    fn a_signed_certificate_names_the_node_chains_to_the_ca_and_ends_in_time() {
        let now = OffsetDateTime::now_utc();
        let ca = GossipCa::generate(Duration::from_secs(365 * 86400), now).unwrap();
        let key = KeyPair::generate().unwrap();
        let pem = ca
            .sign(&grant(&key, Duration::from_secs(3600)), now)
            .unwrap();
        let der = parse(&pem);
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        let ca_der = parse(ca.cert_pem());
        let (_, ca_cert) = X509Certificate::from_der(&ca_der).unwrap();
        cert.verify_signature(Some(ca_cert.public_key())).unwrap();
        assert_eq!(
            cert.public_key().subject_public_key.data.as_ref(),
            key.der_bytes()
        );
        let sans = cert.subject_alternative_name().unwrap().unwrap();
        assert_eq!(
            sans.value.general_names,
            vec![
                GeneralName::DNSName("node-a"),
                GeneralName::DNSName(IMEX_SHARED_NAME),
                GeneralName::IPAddress(&[10, 0, 0, 1])
            ]
        );
        let cn: Vec<_> = cert
            .subject()
            .iter_common_name()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(cn, ["node-a"]);
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && eku.client_auth && !eku.any && !eku.code_signing);
        assert!(!cert.is_ca());
        assert_eq!(
            cert.validity().not_after.timestamp(),
            (now + Duration::from_secs(3600)).unix_timestamp()
        );
    }

    /// The CA rotation docs/OPERATIONS.md describes: the Secret's `tls.crt` holds the new
    /// CA first and the old after it, `tls.key` the new key. The new one signs; the whole
    /// bundle is what the nodes are given to trust, so old and new certificates both
    /// chain while nodes renew.
    #[test]
    fn a_bundle_of_new_and_old_ca_signs_with_the_first_and_publishes_both() {
        let now = OffsetDateTime::now_utc();
        let old = GossipCa::generate(Duration::from_secs(365 * 86400), now).unwrap();
        let new = GossipCa::generate(Duration::from_secs(365 * 86400), now).unwrap();
        let bundle = format!("{}{}", new.cert_pem(), old.cert_pem());
        let ca = GossipCa::from_pem(&bundle, new.key_pem()).unwrap();
        assert_eq!(ca.cert_pem(), bundle);
        let key = KeyPair::generate().unwrap();
        let der = parse(
            &ca.sign(&grant(&key, Duration::from_secs(3600)), now)
                .unwrap(),
        );
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        let new_der = parse(new.cert_pem());
        let (_, new_cert) = X509Certificate::from_der(&new_der).unwrap();
        cert.verify_signature(Some(new_cert.public_key())).unwrap();
        let old_der = parse(old.cert_pem());
        let (_, old_cert) = X509Certificate::from_der(&old_der).unwrap();
        assert!(cert.verify_signature(Some(old_cert.public_key())).is_err());
    }

    #[test]
    fn a_certificate_never_outlives_its_ca_and_an_expired_ca_signs_nothing() {
        let now = OffsetDateTime::now_utc();
        let ca = GossipCa::generate(Duration::from_secs(600), now).unwrap();
        let key = KeyPair::generate().unwrap();
        let pem = ca
            .sign(&grant(&key, Duration::from_secs(86400)), now)
            .unwrap();
        let der = parse(&pem);
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        assert_eq!(
            cert.validity().not_after.timestamp(),
            (now + Duration::from_secs(600)).unix_timestamp()
        );
        let later = now + Duration::from_secs(601);
        assert!(matches!(
            ca.sign(&grant(&key, Duration::from_secs(60)), later),
            Err(CaError::Expired(_))
        ));
    }

    #[test]
    fn a_ca_round_trips_through_its_pem_and_a_wrong_key_is_refused() {
        let now = OffsetDateTime::now_utc();
        let ca = GossipCa::generate(Duration::from_secs(3600), now).unwrap();
        let again = GossipCa::from_pem(ca.cert_pem(), ca.key_pem()).unwrap();
        assert_eq!(again.cert_pem(), ca.cert_pem());
        assert!(GossipCa::from_pem(ca.cert_pem(), "not a key").is_err());
        assert!(GossipCa::from_pem("not a cert", ca.key_pem()).is_err());
    }
}
