//! What the targets hold fixed: the sender of frames, the receiver, and the CA and node
//! certificate that signed state is checked against. The certificate and its key are
//! committed (`fixtures/`, written by `seeds --fixtures`): the seeds carry signatures
//! by that key, and a key made afresh at each start would refuse them all. Nothing
//! trusts this CA outside these targets.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::OnceLock;
use std::time::Duration;

use chitchat::ChitchatId;
use domaind_gossip::NodeName;
use domaind_gossip::pki::{DevCa, NodeCertRequest};
use domaind_gossip::signed::credentials::StateCredentials;
use rustls_pki_types::UnixTime;
use x509_parser::prelude::{FromDer, X509Certificate};

/// The node every frame claims to come from, as its connection's certificate names it.
pub const SENDER: &str = "node-a";
/// The receiving node.
pub const RECEIVER: &str = "node-b";
pub const CLUSTER: &str = "domaind/clique/fuzz";
pub const SENDER_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const GENERATION: u64 = 1_700_000_000_000;

const CA_PEM: &str = include_str!("../fixtures/ca.crt");
const CERT_PEM: &str = include_str!("../fixtures/node-a.crt");
const KEY_PEM: &str = include_str!("../fixtures/node-a.key");

pub fn sender_id() -> ChitchatId {
    ChitchatId::new(SENDER, GENERATION, SocketAddr::new(SENDER_IP, 7946))
}

pub fn receiver_id() -> ChitchatId {
    ChitchatId::new(
        RECEIVER,
        GENERATION,
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3)), 7946),
    )
}

pub fn sender_name() -> &'static NodeName {
    static NAME: OnceLock<NodeName> = OnceLock::new();
    NAME.get_or_init(|| NodeName::new(SENDER).expect("a DNS name"))
}

/// The sender's signing credentials (their trust anchors are the fixture CA).
pub fn credentials() -> &'static StateCredentials {
    static CREDENTIALS: OnceLock<StateCredentials> = OnceLock::new();
    CREDENTIALS.get_or_init(|| {
        StateCredentials::from_pem(sender_name(), CERT_PEM, KEY_PEM, CA_PEM)
            .expect("the committed fixture loads")
    })
}

/// The clock the checks run at: an hour into the certificate's validity, so that a
/// run's outcome never depends on the day it runs.
pub fn now() -> UnixTime {
    static NOW: OnceLock<UnixTime> = OnceLock::new();
    *NOW.get_or_init(|| {
        let der = credentials().cert().to_vec();
        let (_, cert) = X509Certificate::from_der(&der).expect("the fixture parses");
        let from = cert.validity().not_before.timestamp() as u64;
        UnixTime::since_unix_epoch(Duration::from_secs(from + 3600))
    })
}

/// The fixture files: a CA and a certificate for [`SENDER`], valid for a century.
#[derive(Debug)]
pub struct Files {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

pub fn generate() -> Files {
    let century = time::Duration::days(36_500);
    let ca = DevCa::generate("domaind fuzz fixture CA", century).expect("a CA");
    let cert = ca
        .issue(&NodeCertRequest::new(
            NodeName::new(SENDER).expect("a DNS name"),
            century,
        ))
        .expect("a node certificate");
    Files {
        ca_pem: cert.ca_cert_pem,
        cert_pem: cert.cert_pem,
        key_pem: cert.key_pem,
    }
}
