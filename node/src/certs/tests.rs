//! The client against a fake signer, in paused time: the wall clock is derived from
//! tokio's, so "two thirds of the lifetime" is exact.

use std::collections::VecDeque;
use std::sync::Mutex;

use async_trait::async_trait;
use domaind_actors::ports::PortError;
use rcgen::{BasicConstraints, CertificateSigningRequestParams, IsCa, Issuer, KeyUsagePurpose};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use super::*;

const HOUR: Duration = Duration::from_secs(3600);
const LIFETIME: Duration = Duration::from_secs(3 * 3600);

/// What the fake signer does with the next request.
#[derive(Debug, Clone, Copy)]
enum Next {
    Issue,
    /// Issue once `release` is notified.
    IssueWhenReleased,
    Deny,
    /// Issue a certificate for another node.
    IssueForOtherNode,
    Fail,
}

/// A signer that signs what it is told to, with the test's clock, and says when asked.
struct FakeSigner {
    issuer: Issuer<'static, KeyPair>,
    clock: Clock,
    script: Mutex<VecDeque<Next>>,
    asked: mpsc::UnboundedSender<Instant>,
    release: Notify,
}

impl FakeSigner {
    fn sign(&self, csr_pem: &str, node: &str) -> String {
        let mut csr = CertificateSigningRequestParams::from_pem(csr_pem).unwrap();
        // Like the controller: the node's name, then IMEX's shared name and the IPs if
        // asked for (the fake does not check whose they are).
        csr.params.subject_alt_names.retain(|san| match san {
            rcgen::SanType::IpAddress(_) => true,
            rcgen::SanType::DnsName(name) => name.as_str() == IMEX_SHARED_NAME,
            _ => false,
        });
        csr.params
            .subject_alt_names
            .insert(0, rcgen::SanType::DnsName(node.try_into().unwrap()));
        let now = time::OffsetDateTime::from((self.clock)());
        csr.params.not_before = now;
        csr.params.not_after = now + LIFETIME;
        csr.signed_by(&self.issuer).unwrap().pem()
    }
}

#[async_trait]
impl Signer for FakeSigner {
    async fn request(
        &self,
        node: &str,
        csr_pem: &str,
        lifetime: Duration,
    ) -> Result<Answer, PortError> {
        assert_eq!(lifetime, LIFETIME);
        self.asked.send(Instant::now()).unwrap();
        let next = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Next::Issue);
        match next {
            Next::Issue => Ok(Answer::Issued(self.sign(csr_pem, node))),
            Next::IssueWhenReleased => {
                self.release.notified().await;
                Ok(Answer::Issued(self.sign(csr_pem, node)))
            }
            Next::Deny => Ok(Answer::Denied {
                reason: "NameMismatch".into(),
                message: "names another node".into(),
            }),
            Next::IssueForOtherNode => Ok(Answer::Issued(self.sign(csr_pem, "node-b"))),
            Next::Fail => Err(PortError::transient("the API server did not answer")),
        }
    }
}

struct Rig {
    dir: tempfile::TempDir,
    signer: Arc<FakeSigner>,
    asked: mpsc::UnboundedReceiver<Instant>,
    clock: Clock,
}

fn rig(script: &[Next]) -> Rig {
    let start_wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let start = Instant::now();
    let clock: Clock = Arc::new(move || start_wall + start.elapsed());
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let (asked_tx, asked) = mpsc::unbounded_channel();
    let signer = Arc::new(FakeSigner {
        issuer: Issuer::new(params, key),
        clock: clock.clone(),
        script: Mutex::new(script.iter().copied().collect()),
        asked: asked_tx,
        release: Notify::new(),
    });
    Rig {
        dir: tempfile::tempdir().unwrap(),
        signer,
        asked,
        clock,
    }
}

impl Rig {
    fn client(&self) -> (CertClient, watch::Receiver<CertState>) {
        CertClient::new(
            "node-a",
            self.dir.path(),
            LIFETIME,
            self.signer.clone(),
            self.clock.clone(),
            Backoff::new(Duration::from_secs(2), Duration::from_secs(300)),
        )
    }

    fn files(&self) -> (String, String) {
        let read = |name| std::fs::read_to_string(self.dir.path().join(name)).unwrap();
        (read(KEY_FILE), read(CERT_FILE))
    }
}

#[tokio::test(start_paused = true)]
async fn renews_at_two_thirds_with_a_new_key_and_keeps_the_old_until_the_new_is_issued() {
    let mut rig = rig(&[Next::Issue, Next::IssueWhenReleased]);
    let start = Instant::now();
    let (mut client, mut state) = rig.client();
    let stop = CancellationToken::new();
    let first = client.first(&stop).await.unwrap();
    assert_eq!(rig.asked.recv().await.unwrap(), start);
    assert_eq!(
        first.not_after.duration_since(first.not_before).unwrap(),
        LIFETIME
    );
    assert!(matches!(
        *state.borrow_and_update(),
        CertState::Valid { .. }
    ));
    let old = rig.files();
    let mode = std::fs::metadata(rig.dir.path().join(KEY_FILE)).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );

    let renewing = tokio::spawn(client.renew(first, stop.clone()));
    let asked_again = rig.asked.recv().await.unwrap();
    assert_eq!(asked_again - start, HOUR * 2, "two thirds of three hours");
    // Pending: the old key and certificate stay where gossip reads them.
    assert_eq!(rig.files(), old);
    assert!(!state.has_changed().unwrap());

    rig.signer.release.notify_one();
    state.changed().await.unwrap();
    let new = rig.files();
    assert_ne!(new.0, old.0, "a new key");
    assert_ne!(new.1, old.1, "a new certificate");
    let CertState::Valid { not_after } = *state.borrow() else {
        panic!("valid after renewal");
    };
    assert_eq!(not_after, first.not_after + HOUR * 2);

    // The next renewal comes two thirds into the new certificate's life.
    assert_eq!(rig.asked.recv().await.unwrap() - start, HOUR * 4);
    stop.cancel();
    renewing.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_denial_or_an_error_is_retried_with_backoff_and_shown_until_a_certificate_comes() {
    let mut rig = rig(&[Next::Deny, Next::Fail, Next::Deny, Next::Issue]);
    let (mut client, state) = rig.client();
    let stop = CancellationToken::new();
    let waiting = tokio::spawn(async move {
        let validity = client.first(&stop).await;
        (client, validity)
    });
    let mut times = Vec::new();
    for _ in 0..4 {
        times.push(rig.asked.recv().await.unwrap());
    }
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(
        gaps,
        [
            Duration::from_secs(2),
            Duration::from_secs(4),
            Duration::from_secs(8)
        ]
    );
    let (_client, validity) = waiting.await.unwrap();
    assert!(validity.is_some());
    assert!(matches!(*state.borrow(), CertState::Valid { .. }));
}

#[tokio::test(start_paused = true)]
async fn readiness_says_why_there_is_no_certificate_yet() {
    let mut rig = rig(&[Next::Deny]);
    let (mut client, mut state) = rig.client();
    assert!(
        matches!(&*state.borrow(), CertState::Waiting(why) if why.contains("no gossip certificate yet"))
    );
    let stop = CancellationToken::new();
    let task = {
        let stop = stop.clone();
        tokio::spawn(async move { client.first(&stop).await })
    };
    rig.asked.recv().await.unwrap();
    state.changed().await.unwrap();
    let why = match &*state.borrow() {
        CertState::Waiting(why) => why.clone(),
        other => panic!("{other:?}"),
    };
    assert!(
        why.contains("NameMismatch") && why.contains("names another node"),
        "{why}"
    );
    stop.cancel();
    assert_eq!(task.await.unwrap(), None);
    assert!(!rig.dir.path().join(CERT_FILE).exists());
}

#[tokio::test(start_paused = true)]
async fn a_certificate_for_another_node_is_never_written() {
    let mut rig = rig(&[Next::IssueForOtherNode, Next::Issue]);
    let start = Instant::now();
    let (mut client, _state) = rig.client();
    let validity = client.first(&CancellationToken::new()).await.unwrap();
    rig.asked.recv().await.unwrap();
    assert_eq!(
        rig.asked.recv().await.unwrap() - start,
        Duration::from_secs(2)
    );
    let (_, cert) = rig.files();
    assert_eq!(
        check(&cert, "node-a", &none(), &der_key(&rig), (rig.clock)()).unwrap(),
        validity
    );
}

fn none() -> ImexNames {
    ImexNames::default()
}

fn ips(ips: &[IpAddr]) -> ImexNames {
    ImexNames {
        shared_name: false,
        ips: ips.to_vec(),
    }
}

fn der_key(rig: &Rig) -> Vec<u8> {
    KeyPair::from_pem(&rig.files().0)
        .unwrap()
        .public_key_raw()
        .to_vec()
}

#[tokio::test(start_paused = true)]
async fn a_certificate_a_previous_run_left_is_used_until_it_is_due() {
    let mut rig = rig(&[]);
    let start = Instant::now();
    let (mut client, _) = rig.client();
    let first = client.first(&CancellationToken::new()).await.unwrap();
    rig.asked.recv().await.unwrap();

    // A restart an hour later: no new request.
    tokio::time::advance(HOUR).await;
    let (mut again, state) = rig.client();
    assert_eq!(again.first(&CancellationToken::new()).await.unwrap(), first);
    assert!(rig.asked.try_recv().is_err());
    assert!(matches!(*state.borrow(), CertState::Valid { .. }));

    // A restart past two thirds: a new one at once.
    tokio::time::advance(HOUR + Duration::from_secs(1)).await;
    let (mut late, _) = rig.client();
    let renewed = late.first(&CancellationToken::new()).await.unwrap();
    assert_ne!(renewed, first);
    assert_eq!(
        rig.asked.recv().await.unwrap() - start,
        HOUR * 2 + Duration::from_secs(1)
    );
}

#[test]
fn only_a_live_certificate_for_this_node_and_key_passes() {
    let rig = rig(&[]);
    let key = KeyPair::generate().unwrap();
    let csr = request_for("node-a", &none(), &key).unwrap();
    let now = (rig.clock)();
    let mine = rig.signer.sign(&csr, "node-a");
    assert!(check(&mine, "node-a", &none(), key.public_key_raw(), now).is_ok());
    let other_node = rig.signer.sign(&csr, "node-b");
    assert!(
        check(&other_node, "node-a", &none(), key.public_key_raw(), now)
            .unwrap_err()
            .contains("names")
    );
    let other_key = KeyPair::generate().unwrap();
    assert!(
        check(&mine, "node-a", &none(), other_key.public_key_raw(), now)
            .unwrap_err()
            .contains("key")
    );
    assert!(
        check(
            &mine,
            "node-a",
            &none(),
            key.public_key_raw(),
            now + LIFETIME
        )
        .unwrap_err()
        .contains("expired")
    );
    assert!(check("garbage", "node-a", &none(), key.public_key_raw(), now).is_err());
}

const NODE_IP: [u8; 4] = [10, 0, 0, 1];

/// IPs mode: the request carries the node's IP, and only a certificate with exactly
/// the name and that IP is taken (IMEX would refuse one without it).
#[test]
fn the_request_and_the_certificate_carry_the_nodes_ip_when_asked() {
    let rig = rig(&[]);
    let key = KeyPair::generate().unwrap();
    let ip = IpAddr::from(NODE_IP);
    let csr = request_for("node-a", &ips(&[ip]), &key).unwrap();
    let asked = CertificateSigningRequestParams::from_pem(&csr).unwrap();
    assert_eq!(
        asked.params.subject_alt_names,
        [
            rcgen::SanType::DnsName("node-a".try_into().unwrap()),
            rcgen::SanType::IpAddress(ip)
        ]
    );
    let now = (rig.clock)();
    let with_ip = rig.signer.sign(&csr, "node-a");
    assert!(check(&with_ip, "node-a", &ips(&[ip]), key.public_key_raw(), now).is_ok());
    let without = rig
        .signer
        .sign(&request_for("node-a", &none(), &key).unwrap(), "node-a");
    let error = check(&without, "node-a", &ips(&[ip]), key.public_key_raw(), now).unwrap_err();
    assert!(error.contains("10.0.0.1"), "{error}");
    assert!(check(&with_ip, "node-a", &none(), key.public_key_raw(), now).is_err());
}

/// A certificate a run without IPs left is asked for anew once IPs are wanted, so the
/// first one IMEX uses carries them.
#[tokio::test(start_paused = true)]
async fn a_certificate_left_without_the_ip_is_replaced_by_one_with_it() {
    let mut rig = rig(&[]);
    let (mut plain, _) = rig.client();
    plain.first(&CancellationToken::new()).await.unwrap();
    rig.asked.recv().await.unwrap();
    let (client, _) = rig.client();
    let mut client = client.with_imex_names(ips(&[IpAddr::from(NODE_IP)]));
    client.first(&CancellationToken::new()).await.unwrap();
    rig.asked.recv().await.unwrap();
    let (_, cert) = rig.files();
    let (_, block) = x509_parser::pem::parse_x509_pem(cert.as_bytes()).unwrap();
    let (_, parsed) = X509Certificate::from_der(&block.contents).unwrap();
    let names = parsed.subject_alternative_name().unwrap().unwrap();
    assert_eq!(
        names.value.general_names,
        [
            GeneralName::DNSName("node-a"),
            GeneralName::IPAddress(&NODE_IP)
        ]
    );
}

fn shared() -> ImexNames {
    ImexNames {
        shared_name: true,
        ips: Vec::new(),
    }
}

/// The controller has no gossip crate and keeps its own copy of the name.
#[test]
fn the_controller_signs_the_shared_name_gossip_and_imex_know() {
    assert_eq!(domaind_kube_api::names::IMEX_SHARED_NAME, IMEX_SHARED_NAME);
}

/// DNS-names mode: the request carries the node's name, then IMEX's shared name, and
/// only a certificate with exactly both is taken.
#[test]
fn the_request_and_the_certificate_carry_imex_s_shared_name_when_asked() {
    let rig = rig(&[]);
    let key = KeyPair::generate().unwrap();
    let csr = request_for("node-a", &shared(), &key).unwrap();
    let asked = CertificateSigningRequestParams::from_pem(&csr).unwrap();
    assert_eq!(
        asked.params.subject_alt_names,
        [
            rcgen::SanType::DnsName("node-a".try_into().unwrap()),
            rcgen::SanType::DnsName(IMEX_SHARED_NAME.try_into().unwrap())
        ]
    );
    let now = (rig.clock)();
    let with_name = rig.signer.sign(&csr, "node-a");
    assert!(check(&with_name, "node-a", &shared(), key.public_key_raw(), now).is_ok());
    let without = rig
        .signer
        .sign(&request_for("node-a", &none(), &key).unwrap(), "node-a");
    let error = check(&without, "node-a", &shared(), key.public_key_raw(), now).unwrap_err();
    assert!(error.contains(IMEX_SHARED_NAME), "{error}");
    assert!(check(&with_name, "node-a", &none(), key.public_key_raw(), now).is_err());
}

/// As for the IP: a certificate a run without the shared name left is replaced at
/// start, so the first one IMEX uses carries it, and the files say so.
#[tokio::test(start_paused = true)]
async fn a_certificate_left_without_the_shared_name_is_replaced_by_one_with_it() {
    let mut rig = rig(&[]);
    let (mut plain, _) = rig.client();
    plain.first(&CancellationToken::new()).await.unwrap();
    rig.asked.recv().await.unwrap();
    assert!(!carries_imex_shared_name(&plain.cert_path()));
    let (client, _) = rig.client();
    let mut client = client.with_imex_names(shared());
    client.first(&CancellationToken::new()).await.unwrap();
    rig.asked.recv().await.unwrap();
    assert!(carries_imex_shared_name(&client.cert_path()));
    assert!(!carries_ip(&client.cert_path(), IpAddr::from(NODE_IP)));
    let (_, cert) = rig.files();
    let (_, block) = x509_parser::pem::parse_x509_pem(cert.as_bytes()).unwrap();
    let (_, parsed) = X509Certificate::from_der(&block.contents).unwrap();
    let names = parsed.subject_alternative_name().unwrap().unwrap();
    assert_eq!(
        names.value.general_names,
        [
            GeneralName::DNSName("node-a"),
            GeneralName::DNSName(IMEX_SHARED_NAME)
        ]
    );
}

/// The previous release's `domaind_gossip::identity::node_name_of` (commit 73e7f0c),
/// which every gossip frame and signed value of a peer passes: exactly one DNS name, IP
/// SANs ignored.
fn previous_release_node_name(pem: &str) -> Result<String, String> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    let (_, cert) = X509Certificate::from_der(&block.contents).unwrap();
    let dns: Vec<&str> = cert
        .subject_alternative_name()
        .unwrap()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    GeneralName::DNSName(dns) => Some(*dns),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    match dns.as_slice() {
        [one] => Ok((*one).to_owned()),
        many => Err(format!("ambiguous: {}", many.join(", "))),
    }
}

/// Why IMEX's shared name is asked for only with --imex-shared-name: during a rolling
/// upgrade a node of the previous release would refuse gossip from a certificate that
/// carries it, and drop the upgraded node from IMEX. What a node asks for by default
/// (nothing in DNS-names mode, its IP in IPs mode) it still takes; this release takes
/// all three.
#[test]
fn the_previous_release_takes_what_is_asked_for_by_default_but_not_the_shared_name() {
    let rig = rig(&[]);
    let key = KeyPair::generate().unwrap();
    let issued = |imex: &ImexNames| {
        rig.signer
            .sign(&request_for("node-a", imex, &key).unwrap(), "node-a")
    };
    for imex in [none(), ips(&[IpAddr::from(NODE_IP)]), shared()] {
        let pem = issued(&imex);
        let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let der = rustls_pki_types::CertificateDer::from(block.contents);
        let ours = domaind_gossip::identity::node_name_of(&der).unwrap();
        assert_eq!(ours.as_str(), "node-a", "{imex:?}");
        let previous = previous_release_node_name(&pem);
        if imex.shared_name {
            let refusal = previous.unwrap_err();
            assert!(refusal.contains(IMEX_SHARED_NAME), "{refusal}");
        } else {
            assert_eq!(previous.unwrap(), "node-a", "{imex:?}");
        }
    }
}
