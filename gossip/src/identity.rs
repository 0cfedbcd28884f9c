//! Who a peer is. A node's certificate carries its Kubernetes node name as its one
//! DNS subject-alternative name besides [`IMEX_SHARED_NAME`]; that name is also its
//! chitchat node id, so a peer can only ever gossip as the node its certificate names.

use std::fmt;
use std::sync::Arc;

use rustls_pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// The DNS name every node certificate of a deployment carries besides its node's,
/// for `nvidia-imex` in DNS-names mode: it dials slot names, which move between nodes,
/// so `IMEX_SECURITY_TARGET_OVERRIDE` names this instead. It is one fixed name rather
/// than one derived from the clique's gossip cluster id or the CA: every node is
/// issued it, so it can prove no more than the CA's chain does (membership of the
/// deployment), whatever it is derived from; a clique id is the node's own claim, which
/// the signer cannot check; and a CA-derived name would differ between old and new
/// certificates while a CA rotation runs, where IMEX has one override. Deployments stay
/// apart by their CAs. Under `.invalid` (RFC 2606), so it never resolves and no
/// Kubernetes node is named it; never a node's identity.
pub const IMEX_SHARED_NAME: &str = "imex.domaind.invalid";

/// A Kubernetes node name: a DNS-1123 subdomain (lowercase alphanumerics, `-` and `.`,
/// at most 253 characters, starting and ending with an alphanumeric).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeName(Arc<str>);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NodeNameError {
    #[error("node name is empty")]
    Empty,
    #[error("node name {0:?} is longer than 253 characters")]
    TooLong(String),
    #[error(
        "node name {0:?} is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', \
         starting and ending with a letter or digit)"
    )]
    Invalid(String),
}

impl NodeName {
    pub fn new(name: impl AsRef<str>) -> Result<Self, NodeNameError> {
        let name = name.as_ref();
        if name.is_empty() {
            return Err(NodeNameError::Empty);
        }
        if name.len() > 253 {
            return Err(NodeNameError::TooLong(name.to_owned()));
        }
        let labels_ok = name.split('.').all(|label| {
            let bytes = label.as_bytes();
            !bytes.is_empty()
                && bytes.len() <= 63
                && bytes[0].is_ascii_alphanumeric()
                && bytes[bytes.len() - 1].is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        });
        if !labels_ok {
            return Err(NodeNameError::Invalid(name.to_owned()));
        }
        Ok(Self(name.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl std::str::FromStr for NodeName {
    type Err = NodeNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error("certificate cannot be parsed: {0}")]
    Unparsable(String),
    #[error("certificate has no DNS subject-alternative name naming the node")]
    NoNodeName,
    #[error(
        "certificate names several nodes ({0}); a node certificate must carry exactly one DNS name"
    )]
    Ambiguous(String),
    #[error("certificate's DNS name is not a valid node name: {0}")]
    BadNodeName(#[from] NodeNameError),
}

/// The node a certificate names: its single DNS subject-alternative name other than
/// [`IMEX_SHARED_NAME`].
pub fn node_name_of(cert: &CertificateDer<'_>) -> Result<NodeName, IdentityError> {
    let (_, parsed) = X509Certificate::from_der(cert.as_ref())
        .map_err(|e| IdentityError::Unparsable(e.to_string()))?;
    let san = parsed
        .subject_alternative_name()
        .map_err(|e| IdentityError::Unparsable(e.to_string()))?;
    let dns_names: Vec<&str> = san
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    GeneralName::DNSName(dns) if *dns != IMEX_SHARED_NAME => Some(*dns),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    match dns_names.as_slice() {
        [] => Err(IdentityError::NoNodeName),
        [one] => Ok(NodeName::new(one)?),
        many => Err(IdentityError::Ambiguous(many.join(", "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_kubernetes_node_names() {
        for name in ["gb200-rack1-node07", "ip-10-0-0-1.ec2.internal", "a", "0"] {
            assert_eq!(NodeName::new(name).unwrap().as_str(), name);
        }
    }

    #[test]
    fn refuses_names_kubernetes_would_refuse() {
        assert_eq!(NodeName::new(""), Err(NodeNameError::Empty));
        assert!(matches!(
            NodeName::new("x".repeat(254)),
            Err(NodeNameError::TooLong(_))
        ));
        for bad in [
            "Node1", "-node", "node-", "no..de", "node_1", "node 1", "nöde",
        ] {
            assert!(
                matches!(NodeName::new(bad), Err(NodeNameError::Invalid(_))),
                "{bad} accepted"
            );
        }
    }

    fn self_signed(names: &[&str]) -> CertificateDer<'static> {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        rcgen::generate_simple_self_signed(names)
            .unwrap()
            .cert
            .der()
            .clone()
    }

    #[test]
    fn the_single_dns_name_is_the_node() {
        assert_eq!(
            node_name_of(&self_signed(&["node-a"])).unwrap().as_str(),
            "node-a"
        );
    }

    #[test]
    fn the_shared_imex_name_is_never_the_node() {
        for names in [["node-a", IMEX_SHARED_NAME], [IMEX_SHARED_NAME, "node-a"]] {
            assert_eq!(
                node_name_of(&self_signed(&names)).unwrap().as_str(),
                "node-a"
            );
        }
        assert_eq!(
            node_name_of(&self_signed(&[IMEX_SHARED_NAME])),
            Err(IdentityError::NoNodeName)
        );
    }

    #[test]
    fn several_dns_names_are_ambiguous() {
        assert!(matches!(
            node_name_of(&self_signed(&["node-a", "node-b"])),
            Err(IdentityError::Ambiguous(names)) if names == "node-a, node-b"
        ));
    }

    #[test]
    fn no_dns_name_is_no_identity() {
        assert_eq!(
            node_name_of(&self_signed(&[])),
            Err(IdentityError::NoNodeName)
        );
        assert!(matches!(
            node_name_of(&self_signed(&["Not_A_Node"])),
            Err(IdentityError::BadNodeName(_))
        ));
    }

    #[test]
    fn garbage_certificate_is_unparsable() {
        let junk = CertificateDer::from(vec![0x30, 0x03, 0x01, 0x02]);
        assert!(matches!(
            node_name_of(&junk),
            Err(IdentityError::Unparsable(_))
        ));
    }
}
