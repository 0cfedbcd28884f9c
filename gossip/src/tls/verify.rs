//! Server-certificate verification for outbound gossip connections.
//!
//! A gossip peer is dialled by address, and the node behind an address is not known
//! before the handshake (seeds are plain addresses). So the server certificate is
//! checked fully by webpki — chain to our CA, validity, key usage, signature — against
//! the node name the certificate itself carries. Who the peer claims to be in frames is
//! checked on the receiving side, against its client certificate.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{DigitallySignedStruct, Error, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::TlsError;
use crate::identity::node_name_of;

#[derive(Debug)]
pub(crate) struct NodeServerVerifier {
    inner: Arc<WebPkiServerVerifier>,
}

impl NodeServerVerifier {
    pub(crate) fn new(
        roots: Arc<RootCertStore>,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, TlsError> {
        let inner = WebPkiServerVerifier::builder_with_provider(roots, provider)
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        Ok(Self { inner })
    }
}

impl ServerCertVerifier for NodeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialled: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let node = node_name_of(end_entity).map_err(|e| Error::General(e.to_string()))?;
        let name = ServerName::try_from(node.as_str().to_owned())
            .map_err(|e| Error::General(e.to_string()))?;
        self.inner
            .verify_server_cert(end_entity, intermediates, &name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
