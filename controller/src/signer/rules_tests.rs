//! Each rule broken on purpose is denied with its reason; a request that breaks none is
//! granted exactly what the rules allow.

use std::net::IpAddr;

use proptest::prelude::*;
use rcgen::{CertificateParams, DnType, KeyPair, PublicKeyData as _, SanType};

use super::*;

const SA: &str = "system:serviceaccount:domaind:domaind-node";
const DAY: Duration = Duration::from_secs(24 * 3600);

fn policy() -> Policy {
    Policy::new("domaind", "domaind-node", DAY)
}

fn usages() -> Vec<String> {
    GOSSIP_CERT_USAGES
        .iter()
        .map(|u| (*u).to_string())
        .collect()
}

/// A CSR as the node daemon makes it: CN and one DNS SAN, both `name`.
fn csr_for(name: &str, key: &KeyPair) -> String {
    let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.serialize_request(key).unwrap().pem().unwrap()
}

fn csr_with(key: &KeyPair, edit: impl FnOnce(&mut CertificateParams)) -> String {
    let mut params = CertificateParams::new(vec!["node-a".to_string()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, "node-a");
    edit(&mut params);
    params.serialize_request(key).unwrap().pem().unwrap()
}

/// A PEM block of `label` around `der` (k8s-openapi's ByteString is base64 in JSON).
fn pem_of(label: &str, der: &[u8]) -> String {
    let base64 = serde_json::to_value(k8s_openapi::ByteString(der.to_vec())).unwrap();
    let base64 = base64.as_str().unwrap();
    let lines: Vec<&str> = base64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

fn der_of(pem: &str) -> Vec<u8> {
    x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .unwrap()
        .1
        .contents
}

struct Ask {
    username: Option<String>,
    bound: Option<Vec<String>>,
    usages: Vec<String>,
    pem: String,
    expiration_seconds: Option<i32>,
    /// What node-a's Node object lists.
    addresses: Vec<IpAddr>,
}

const OWN_IP: [u8; 4] = [10, 0, 0, 1];
const OTHER_NODES_IP: [u8; 4] = [10, 0, 0, 2];

impl Ask {
    fn good(pem: String) -> Self {
        Self {
            username: Some(SA.into()),
            bound: Some(vec!["node-a".into()]),
            usages: usages(),
            pem,
            expiration_seconds: None,
            addresses: vec![IpAddr::from(OWN_IP), "fd00::1".parse().unwrap()],
        }
    }

    fn decide(&self) -> Result<Grant, Refusal> {
        decide(
            &policy(),
            &Request {
                username: self.username.as_deref(),
                bound_node: self.bound.as_deref(),
                usages: &self.usages,
                pem: self.pem.as_bytes(),
                expiration_seconds: self.expiration_seconds,
                node_addresses: &self.addresses,
            },
        )
    }

    fn denied(&self) -> Rule {
        match self.decide() {
            Ok(grant) => panic!("approved: {grant:?}"),
            Err(refusal) => {
                assert!(!refusal.message.is_empty());
                refusal.rule
            }
        }
    }
}

fn good() -> Ask {
    Ask::good(csr_for("node-a", &KeyPair::generate().unwrap()))
}

#[test]
fn a_node_daemon_on_its_node_asking_for_its_name_is_granted_the_default_lifetime() {
    let key = KeyPair::generate().unwrap();
    let grant = Ask::good(csr_for("node-a", &key)).decide().unwrap();
    assert_eq!(grant.node, "node-a");
    assert_eq!(grant.lifetime, DAY);
    assert_eq!(grant.public_key.der_bytes(), key.public_key_raw());
}

#[test]
fn a_requested_lifetime_is_honoured_up_to_the_configured_one() {
    let mut ask = good();
    ask.expiration_seconds = Some(3600);
    assert_eq!(ask.decide().unwrap().lifetime, Duration::from_secs(3600));
    ask.expiration_seconds = Some(7 * 24 * 3600);
    assert_eq!(ask.decide().unwrap().lifetime, DAY);
}

#[test]
fn the_usages_may_come_in_any_order() {
    let mut ask = good();
    ask.usages.reverse();
    assert!(ask.decide().is_ok());
}

#[test]
fn another_requester_is_not_the_node_daemon() {
    let mut ask = good();
    ask.username = Some("system:serviceaccount:domaind:default".into());
    assert_eq!(ask.denied(), Rule::NotNodeDaemon);
    ask.username = Some("system:serviceaccount:other:domaind-node".into());
    assert_eq!(ask.denied(), Rule::NotNodeDaemon);
    ask.username = Some("kubernetes-admin".into());
    assert_eq!(ask.denied(), Rule::NotNodeDaemon);
    ask.username = None;
    assert_eq!(ask.denied(), Rule::NotNodeDaemon);
}

#[test]
fn a_token_bound_to_no_node_is_refused() {
    let mut ask = good();
    ask.bound = None;
    assert_eq!(ask.denied(), Rule::NotBoundToNode);
    ask.bound = Some(vec![]);
    assert_eq!(ask.denied(), Rule::NotBoundToNode);
    ask.bound = Some(vec![String::new()]);
    assert_eq!(ask.denied(), Rule::NotBoundToNode);
    ask.bound = Some(vec!["node-a".into(), "node-b".into()]);
    assert_eq!(ask.denied(), Rule::NotBoundToNode);
}

#[test]
fn usages_other_than_gossips_are_refused() {
    for usages in [
        vec!["digital signature", "server auth"],
        vec!["digital signature", "client auth"],
        vec![
            "digital signature",
            "key encipherment",
            "server auth",
            "client auth",
        ],
        vec![
            "digital signature",
            "server auth",
            "client auth",
            "code signing",
        ],
        vec![
            "digital signature",
            "server auth",
            "client auth",
            "cert sign",
        ],
        vec![],
    ] {
        let mut ask = good();
        ask.usages = usages.iter().map(|u| (*u).to_string()).collect();
        assert_eq!(ask.denied(), Rule::BadUsages, "{usages:?}");
    }
}

#[test]
fn what_is_not_one_valid_csr_is_a_bad_request() {
    let key = KeyPair::generate().unwrap();
    let csr = csr_for("node-a", &key);
    let cert = CertificateParams::new(vec!["node-a".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap()
        .pem();
    let two = format!("{csr}{csr}");
    for pem in [
        String::new(),
        "not a PEM block".to_string(),
        cert,
        two,
        pem_of("CERTIFICATE REQUEST", b"\x30\x03\x02\x01\x01"),
    ] {
        assert_eq!(Ask::good(pem.clone()).denied(), Rule::BadRequest, "{pem}");
    }
    let mut ask = good();
    ask.pem = String::new();
    let invalid_utf8 = Request {
        pem: &[0xff, 0xfe],
        username: Some(SA),
        bound_node: Some(&["node-a".to_string()]),
        usages: &usages(),
        expiration_seconds: None,
        node_addresses: &[],
    };
    assert_eq!(
        decide(&policy(), &invalid_utf8).unwrap_err().rule,
        Rule::BadRequest
    );
}

#[test]
fn a_request_whose_signature_does_not_match_is_a_bad_request() {
    // The CN "node-a" becomes "node-z" after signing: still well-formed DER.
    let mut der = der_of(&good().pem);
    let at = der.windows(6).position(|w| w == b"node-a").unwrap();
    der[at + 5] = b'z';
    let ask = Ask::good(pem_of("CERTIFICATE REQUEST", &der));
    let refusal = ask.decide().unwrap_err();
    assert_eq!(refusal.rule, Rule::BadRequest);
    assert!(refusal.message.contains("signature"), "{}", refusal.message);
}

#[test]
fn a_request_for_a_ca_is_a_bad_request() {
    let key = KeyPair::generate().unwrap();
    let pem = csr_with(&key, |p| {
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    });
    assert_eq!(Ask::good(pem).denied(), Rule::BadRequest);
}

#[test]
fn keys_other_than_p256_are_refused() {
    for algorithm in [&rcgen::PKCS_ECDSA_P384_SHA384, &rcgen::PKCS_ED25519] {
        let key = KeyPair::generate_for(algorithm).unwrap();
        assert_eq!(
            Ask::good(csr_for("node-a", &key)).denied(),
            Rule::BadKey,
            "{algorithm:?}"
        );
    }
}

#[test]
fn names_other_than_exactly_the_requesters_node_are_refused() {
    let key = KeyPair::generate().unwrap();
    let other_node = csr_for("node-b", &key);
    let two_names = csr_with(&key, |p| {
        p.subject_alt_names
            .push(SanType::DnsName("node-b".try_into().unwrap()));
    });
    let with_uri = csr_with(&key, |p| {
        p.subject_alt_names
            .push(SanType::URI("spiffe://x/node-a".try_into().unwrap()));
    });
    let with_email = csr_with(&key, |p| {
        p.subject_alt_names
            .push(SanType::Rfc822Name("a@node-a".try_into().unwrap()));
    });
    let ip_only = csr_with(&key, |p| {
        p.subject_alt_names = vec![SanType::IpAddress([10, 0, 0, 1].into())];
    });
    let none = csr_with(&key, |p| p.subject_alt_names.clear());
    let other_cn = csr_with(&key, |p| {
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, "node-b");
    });
    for pem in [
        other_node, two_names, with_uri, with_email, ip_only, none, other_cn,
    ] {
        assert_eq!(Ask::good(pem.clone()).denied(), Rule::NameMismatch, "{pem}");
    }
    let no_cn = csr_with(&key, |p| {
        p.distinguished_name = rcgen::DistinguishedName::new()
    });
    assert!(
        Ask::good(no_cn).decide().is_ok(),
        "a common name is optional"
    );
}

/// IMEX's shared name, as every node asks for it in DNS-names mode: granted to any node
/// of ours besides its own name, whatever its node; nothing else on the side.
#[test]
fn imex_s_shared_name_is_granted_to_any_node_besides_its_own() {
    let shared = || SanType::DnsName(IMEX_SHARED_NAME.try_into().unwrap());
    let key = KeyPair::generate().unwrap();
    for node in ["node-a", "node-b"] {
        let mut params = CertificateParams::new(vec![node.to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, node);
        params.subject_alt_names.push(shared());
        let mut ask = Ask::good(params.serialize_request(&key).unwrap().pem().unwrap());
        ask.bound = Some(vec![node.to_string()]);
        let grant = ask.decide().unwrap();
        assert!(grant.imex_shared_name, "{node}");
        assert_eq!(grant.node, node);
    }
    let first = csr_with(&key, |p| p.subject_alt_names.insert(0, shared()));
    assert!(Ask::good(first).decide().unwrap().imex_shared_name);
    assert!(
        !good().decide().unwrap().imex_shared_name,
        "not asked, not given"
    );
}

/// Any DNS name but the node's and the one shared name is refused as before, a
/// look-alike of the shared name included; so is the shared name alone or twice.
#[test]
fn a_dns_name_other_than_the_shared_one_is_refused_beside_it() {
    let key = KeyPair::generate().unwrap();
    let with = |names: &[&str]| {
        csr_with(&key, |p| {
            for name in names {
                p.subject_alt_names
                    .push(SanType::DnsName((*name).try_into().unwrap()));
            }
        })
    };
    let look_alike = format!("x.{IMEX_SHARED_NAME}");
    for pem in [
        with(&["imex.other.invalid"]),
        with(&[&look_alike]),
        with(&[IMEX_SHARED_NAME, "node-b"]),
        with(&[IMEX_SHARED_NAME, IMEX_SHARED_NAME]),
        csr_with(&key, |p| {
            p.subject_alt_names = vec![SanType::DnsName(IMEX_SHARED_NAME.try_into().unwrap())];
        }),
    ] {
        let refusal = Ask::good(pem.clone()).decide().unwrap_err();
        assert_eq!(refusal.rule, Rule::NameMismatch, "{pem}");
        assert!(refusal.message.contains("node-a"), "{}", refusal.message);
    }
}

#[test]
fn the_nodes_own_ips_are_granted_and_in_the_certificate_once() {
    let key = KeyPair::generate().unwrap();
    let pem = csr_with(&key, |p| {
        for ip in [
            IpAddr::from(OWN_IP),
            "fd00::1".parse().unwrap(),
            IpAddr::from(OWN_IP),
        ] {
            p.subject_alt_names.push(SanType::IpAddress(ip));
        }
    });
    let grant = Ask::good(pem).decide().unwrap();
    assert_eq!(
        grant.ips,
        [IpAddr::from(OWN_IP), "fd00::1".parse::<IpAddr>().unwrap()]
    );
    assert!(
        good().decide().unwrap().ips.is_empty(),
        "no IP asked, none given"
    );
}

/// A node asking for another node's IP could answer IMEX's dials to that node as it:
/// refused with its own reason, whatever else the request gets right.
#[test]
fn an_ip_that_is_not_the_requesters_nodes_is_refused() {
    let key = KeyPair::generate().unwrap();
    let foreign = csr_with(&key, |p| {
        p.subject_alt_names
            .push(SanType::IpAddress(OTHER_NODES_IP.into()));
    });
    let refusal = Ask::good(foreign.clone()).decide().unwrap_err();
    assert_eq!(refusal.rule, Rule::IpMismatch);
    assert_eq!(refusal.rule.reason(), "IpMismatch");
    assert!(
        refusal.message.contains("10.0.0.2") && refusal.message.contains("node-a"),
        "{}",
        refusal.message
    );
    let own_and_foreign = csr_with(&key, |p| {
        p.subject_alt_names.push(SanType::IpAddress(OWN_IP.into()));
        p.subject_alt_names
            .push(SanType::IpAddress(OTHER_NODES_IP.into()));
    });
    assert_eq!(Ask::good(own_and_foreign).denied(), Rule::IpMismatch);
    let mut unknown_node = Ask::good(foreign);
    unknown_node.addresses.clear();
    assert_eq!(unknown_node.denied(), Rule::IpMismatch);
}

#[test]
fn each_rule_has_its_own_reason() {
    let rules = [
        Rule::NotNodeDaemon,
        Rule::NotBoundToNode,
        Rule::BadUsages,
        Rule::BadRequest,
        Rule::BadKey,
        Rule::NameMismatch,
        Rule::IpMismatch,
    ];
    let reasons: BTreeSet<&str> = rules.iter().map(|r| r.reason()).collect();
    assert_eq!(reasons.len(), rules.len());
}

fn node_name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,10}[a-z0-9](\\.[a-z0-9]{1,5})?"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Granted exactly when the named node is the requester's node, and then for it.
    #[test]
    fn granted_only_for_the_requesters_own_node(bound in node_name(), named in node_name()) {
        let key = KeyPair::generate().unwrap();
        let mut ask = Ask::good(csr_for(&named, &key));
        ask.bound = Some(vec![bound.clone()]);
        match ask.decide() {
            Ok(grant) => {
                prop_assert_eq!(&named, &bound);
                prop_assert_eq!(grant.node, bound);
            }
            Err(refusal) => {
                prop_assert_ne!(&named, &bound);
                prop_assert_eq!(refusal.rule, Rule::NameMismatch);
            }
        }
    }

    /// Any set of usages but gossip's own is refused.
    #[test]
    fn only_gossips_usages_pass(pick in proptest::collection::vec(0usize..6, 0..6)) {
        const ALL: [&str; 6] = [
            "digital signature", "server auth", "client auth",
            "key encipherment", "code signing", "any",
        ];
        let mut ask = good();
        ask.usages = pick.iter().map(|&i| ALL[i].to_string()).collect();
        let set: BTreeSet<usize> = pick.iter().copied().collect();
        let exact = set == BTreeSet::from([0, 1, 2]);
        prop_assert_eq!(ask.decide().is_ok(), exact);
    }
}
