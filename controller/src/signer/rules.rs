//! Whether a CertificateSigningRequest gets a gossip node certificate: a pure function
//! of what the API server recorded about the requester (`spec.username`, `spec.extra`,
//! which a client cannot choose) and what the request asks for.
//!
//! The certificate we issue is built from the grant alone (CN and DNS SAN = the node,
//! IMEX's shared name and the node's own IPs if asked for, fixed usages): nothing else
//! the request carries reaches it.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use rcgen::{CertificateSigningRequestParams, IsCa, PublicKey, SanType};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::oid_registry::{OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY};
use x509_parser::prelude::FromDer as _;

use domaind_kube_api::names::{GOSSIP_CERT_USAGES, IMEX_SHARED_NAME};
use domaind_kube_api::reasons::CsrReason;

/// What the signer accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The node daemons' ServiceAccount user, `system:serviceaccount:<ns>:<name>`.
    pub node_daemon: String,
    /// The lifetime of a certificate whose request names none, and the most any gets.
    pub lifetime: Duration,
}

impl Policy {
    pub fn new(namespace: &str, service_account: &str, lifetime: Duration) -> Self {
        Self {
            node_daemon: format!("system:serviceaccount:{namespace}:{service_account}"),
            lifetime,
        }
    }
}

/// The parts of a CSR the rules read.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub username: Option<&'a str>,
    /// `spec.extra["authentication.kubernetes.io/node-name"]`.
    pub bound_node: Option<&'a [String]>,
    pub usages: &'a [String],
    /// `spec.request`: a PEM `CERTIFICATE REQUEST` block.
    pub pem: &'a [u8],
    pub expiration_seconds: Option<i32>,
    /// The addresses the API server lists for the requester's Node (`status.addresses`,
    /// written by that node's kubelet): the only IPs its certificate may carry. The
    /// request itself cannot vouch for an IP, and `nvidia-imex` in IPs mode takes an IP
    /// SAN as proof that the peer it dialled is that node.
    pub node_addresses: &'a [IpAddr],
}

/// A rule a request broke: one per [`CsrReason`] that denies, which says what each means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    NotNodeDaemon,
    NotBoundToNode,
    BadUsages,
    BadRequest,
    BadKey,
    NameMismatch,
    IpMismatch,
}

impl Rule {
    /// The `Denied` condition's reason, the event's and the metric's.
    pub fn reason(self) -> &'static str {
        let reason = match self {
            Self::NotNodeDaemon => CsrReason::NotNodeDaemon,
            Self::NotBoundToNode => CsrReason::NotBoundToNode,
            Self::BadUsages => CsrReason::BadUsages,
            Self::BadRequest => CsrReason::BadRequest,
            Self::BadKey => CsrReason::BadKey,
            Self::NameMismatch => CsrReason::NameMismatch,
            Self::IpMismatch => CsrReason::IpMismatch,
        };
        reason.as_str()
    }
}

/// A denial: the rule and what exactly was wrong, for the condition's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub rule: Rule,
    pub message: String,
}

/// An approval: what to sign.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub node: String,
    /// IP SANs, each one of the node's own addresses.
    pub ips: Vec<IpAddr>,
    /// A second DNS SAN, [`IMEX_SHARED_NAME`]: any node of ours may carry it.
    pub imex_shared_name: bool,
    pub lifetime: Duration,
    pub public_key: PublicKey,
}

fn refuse(rule: Rule, message: impl Into<String>) -> Refusal {
    Refusal {
        rule,
        message: message.into(),
    }
}

/// Approves `request` only when every rule holds; else the first rule broken, in the
/// order: requester, binding, usages, request, key, names.
pub fn decide(policy: &Policy, request: &Request<'_>) -> Result<Grant, Refusal> {
    let username = request.username.unwrap_or_default();
    if username != policy.node_daemon {
        return Err(refuse(
            Rule::NotNodeDaemon,
            format!(
                "requested by {username:?}; only {} may request gossip node certificates",
                policy.node_daemon
            ),
        ));
    }
    let node = match request.bound_node {
        Some([node]) if !node.is_empty() => node.clone(),
        Some(nodes) if nodes.len() > 1 => {
            return Err(refuse(
                Rule::NotBoundToNode,
                format!("the requester's token names {} nodes", nodes.len()),
            ));
        }
        _ => {
            return Err(refuse(
                Rule::NotBoundToNode,
                "the requester's token is not bound to a pod on a node (no \
                 authentication.kubernetes.io/node-name in spec.extra)",
            ));
        }
    };
    check_usages(request.usages)?;
    let pem = std::str::from_utf8(request.pem)
        .map_err(|_| refuse(Rule::BadRequest, "spec.request is not PEM text"))?;
    let der = csr_der(pem)?;
    check_key(&der)?;
    let parsed = CertificateSigningRequestParams::from_der(&der.as_slice().into())
        .map_err(|error| refuse(Rule::BadRequest, format!("spec.request: {error}")))?;
    if let IsCa::Ca(_) = parsed.params.is_ca {
        return Err(refuse(
            Rule::BadRequest,
            "the request asks for a CA certificate",
        ));
    }
    if parsed.public_key.algorithm() != &rcgen::PKCS_ECDSA_P256_SHA256 {
        return Err(refuse(
            Rule::BadKey,
            "the request is not signed with ECDSA P-256 and SHA-256",
        ));
    }
    let (ips, imex_shared_name) = check_names(&parsed, &der, &node, request.node_addresses)?;
    let lifetime = match request.expiration_seconds {
        Some(seconds) => {
            Duration::from_secs(u64::try_from(seconds).unwrap_or(0)).min(policy.lifetime)
        }
        None => policy.lifetime,
    };
    Ok(Grant {
        node,
        ips,
        imex_shared_name,
        lifetime,
        public_key: parsed.public_key,
    })
}

fn check_usages(usages: &[String]) -> Result<(), Refusal> {
    let asked: BTreeSet<&str> = usages.iter().map(String::as_str).collect();
    let needed: BTreeSet<&str> = GOSSIP_CERT_USAGES.into_iter().collect();
    if asked == needed {
        Ok(())
    } else {
        Err(refuse(
            Rule::BadUsages,
            format!(
                "usages {usages:?}; gossip node certificates have exactly {GOSSIP_CERT_USAGES:?}"
            ),
        ))
    }
}

/// The DER of the one `CERTIFICATE REQUEST` block.
fn csr_der(pem: &str) -> Result<Vec<u8>, Refusal> {
    let (rest, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|error| {
        refuse(
            Rule::BadRequest,
            format!("spec.request is not PEM: {error}"),
        )
    })?;
    if block.label != "CERTIFICATE REQUEST" {
        return Err(refuse(
            Rule::BadRequest,
            format!(
                "spec.request holds a {:?} block, not a CERTIFICATE REQUEST",
                block.label
            ),
        ));
    }
    if !String::from_utf8_lossy(rest).trim().is_empty() {
        return Err(refuse(
            Rule::BadRequest,
            "spec.request holds more than one PEM block",
        ));
    }
    Ok(block.contents)
}

/// The key itself, not just the signature's algorithm: a P-384 key can sign with
/// SHA-256 too.
fn check_key(der: &[u8]) -> Result<(), Refusal> {
    let (_, csr) = X509CertificationRequest::from_der(der)
        .map_err(|error| refuse(Rule::BadRequest, format!("spec.request: {error}")))?;
    let algorithm = &csr.certification_request_info.subject_pki.algorithm;
    let curve = algorithm.parameters.as_ref().and_then(|p| p.as_oid().ok());
    if algorithm.algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY && curve.as_ref() == Some(&OID_EC_P256) {
        Ok(())
    } else {
        Err(refuse(
            Rule::BadKey,
            format!(
                "the key is {} {curve:?}; gossip node keys are ECDSA P-256",
                algorithm.algorithm
            ),
        ))
    }
}

/// The one DNS name must be the node, besides at most [`IMEX_SHARED_NAME`] (for IMEX in
/// DNS-names mode); IP SANs are allowed, each one of the node's own addresses (for IMEX
/// in IPs mode); anything else is refused. The IPs granted, in the order asked, without
/// repeats, and whether the shared name is.
fn check_names(
    parsed: &CertificateSigningRequestParams,
    der: &[u8],
    node: &str,
    node_addresses: &[IpAddr],
) -> Result<(Vec<IpAddr>, bool), Refusal> {
    let sans = parsed.params.subject_alt_names.as_slice();
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    for san in sans {
        match san {
            SanType::DnsName(name) => dns.push(name.as_str()),
            SanType::IpAddress(ip) => {
                if !ips.contains(ip) {
                    ips.push(*ip);
                }
            }
            _ => {
                return Err(refuse(
                    Rule::NameMismatch,
                    format!(
                        "the request must name exactly one DNS name, {node:?}, and at most \
                         {IMEX_SHARED_NAME:?} and the node's own IPs; it names {sans:?}"
                    ),
                ));
            }
        }
    }
    let shared = dns.iter().filter(|name| **name == IMEX_SHARED_NAME).count();
    let own: Vec<&str> = dns
        .iter()
        .copied()
        .filter(|name| *name != IMEX_SHARED_NAME)
        .collect();
    match (own.as_slice(), shared) {
        ([name], 0 | 1) if *name == node => {}
        ([name], 0 | 1) => {
            return Err(refuse(
                Rule::NameMismatch,
                format!("the request names {name:?} but the requester runs on node {node:?}"),
            ));
        }
        _ => {
            return Err(refuse(
                Rule::NameMismatch,
                format!(
                    "the request must name exactly one DNS name, {node:?}, besides at most \
                     {IMEX_SHARED_NAME:?} once; it names {sans:?}"
                ),
            ));
        }
    }
    if let Some(foreign) = ips.iter().find(|ip| !node_addresses.contains(ip)) {
        return Err(refuse(
            Rule::IpMismatch,
            format!(
                "the request names IP {foreign}, which is not an address of node {node:?} \
                 (its Node lists {node_addresses:?})"
            ),
        ));
    }
    let (_, csr) = X509CertificationRequest::from_der(der)
        .map_err(|error| refuse(Rule::BadRequest, format!("spec.request: {error}")))?;
    for cn in csr.certification_request_info.subject.iter_common_name() {
        let cn = cn.as_str().unwrap_or_default();
        if cn != node {
            return Err(refuse(
                Rule::NameMismatch,
                format!(
                    "the request's common name is {cn:?} but the requester runs on node {node:?}"
                ),
            ));
        }
    }
    Ok((ips, shared == 1))
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
