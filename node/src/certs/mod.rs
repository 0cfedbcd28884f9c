//! The node's gossip certificate in `--tls-mode csr`: the daemon makes its own P-256
//! key, asks the cluster's signer (the controller, through a CertificateSigningRequest)
//! for a certificate naming its node, and writes key and certificate where gossip's TLS
//! loader reads them. At two thirds of the certificate's life it asks again with a new
//! key; until the new one is issued the old files stay, so gossip goes on with the old
//! certificate, and the loader's reload switches without a restart.
//!
//! | module | job |
//! |---|---|
//! | `schedule` | when to renew (pure) |
//! | `port` | the signer as the client sees it |
//! | `kube` | the signer through the Kubernetes CSR API |

pub mod kube;
mod port;
pub mod schedule;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use domaind_backoff::Backoff;
use domaind_gossip::identity::IMEX_SHARED_NAME;
use rcgen::{CertificateParams, DnType, KeyPair};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer as _, X509Certificate};

pub use port::{Answer, Signer};

pub const KEY_FILE: &str = "tls.key";
pub const CERT_FILE: &str = "tls.crt";

/// `domaind_gossip_cert_requests_total{outcome, reason}`: each request's outcome
/// (`issued`, `denied`, `error`, `bad_certificate`) and, when denied, the reason.
pub const CERT_REQUESTS: &str = "domaind_gossip_cert_requests_total";

/// The wall clock; tests derive theirs from paused tokio time.
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

pub fn system_clock() -> Clock {
    Arc::new(SystemTime::now)
}

/// Retries after a denial or an error: from 2 s, doubling, up to 5 min; jittered, since
/// a misconfigured signer denies every node at once.
pub fn retry_backoff() -> Backoff {
    Backoff::new(Duration::from_secs(2), Duration::from_secs(300)).jittered()
}

/// Where the node's certificate stands, for `/readyz` until it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertState {
    Waiting(String),
    Valid { not_after: SystemTime },
}

/// When a certificate is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("the signer denied the request ({reason}): {message}")]
    Denied { reason: String, message: String },
    #[error("{0}")]
    Error(String),
    #[error("the signer issued a certificate we cannot use: {0}")]
    BadCertificate(String),
}

impl Failure {
    fn outcome(&self) -> &'static str {
        match self {
            Self::Denied { .. } => "denied",
            Self::Error(_) => "error",
            Self::BadCertificate(_) => "bad_certificate",
        }
    }
}

/// Asks for, checks, writes and renews this node's certificate.
pub struct CertClient {
    node: String,
    /// What to ask for besides the node's name ([`CertClient::with_imex_names`]).
    imex: ImexNames,
    dir: PathBuf,
    lifetime: Duration,
    signer: Arc<dyn Signer>,
    clock: Clock,
    backoff: Backoff,
    state: watch::Sender<CertState>,
}

impl std::fmt::Debug for CertClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertClient")
            .field("node", &self.node)
            .field("dir", &self.dir)
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

impl CertClient {
    /// `dir` gets `tls.key` (0600) and `tls.crt`; `lifetime` is what each request asks
    /// for (the signer may give less).
    pub fn new(
        node: &str,
        dir: &Path,
        lifetime: Duration,
        signer: Arc<dyn Signer>,
        clock: Clock,
        backoff: Backoff,
    ) -> (Self, watch::Receiver<CertState>) {
        let (state, watching) = watch::channel(CertState::Waiting(
            "no gossip certificate yet: requesting one".into(),
        ));
        let client = Self {
            node: node.to_string(),
            imex: ImexNames::default(),
            dir: dir.to_path_buf(),
            lifetime,
            signer,
            clock,
            backoff,
            state,
        };
        (client, watching)
    }

    /// Also asks for what IMEX checks a peer's certificate against (docs/ARCHITECTURE.md,
    /// "IMEX over mutual TLS"). A certificate left from a run that did not ask for
    /// exactly these is not reused.
    pub fn with_imex_names(mut self, imex: ImexNames) -> Self {
        self.imex = imex;
        self
    }

    pub fn cert_path(&self) -> PathBuf {
        self.dir.join(CERT_FILE)
    }

    pub fn key_path(&self) -> PathBuf {
        self.dir.join(KEY_FILE)
    }

    /// A certificate on disk: the one a previous run left if it is ours and not yet due
    /// for renewal, else a new one. `None` if stopped first.
    pub async fn first(&mut self, stop: &CancellationToken) -> Option<Validity> {
        let now = (self.clock)();
        if let Some(validity) = on_disk(&self.dir, &self.node, &self.imex, now)
            && schedule::renew_at(validity.not_before, validity.not_after) > now
        {
            info!(node = %self.node, dir = %self.dir.display(), "using the gossip certificate a previous run was issued");
            self.state.send_replace(CertState::Valid {
                not_after: validity.not_after,
            });
            return Some(validity);
        }
        self.obtain(None, stop).await
    }

    /// Renews `current` at two thirds of its life, and each new one likewise, until
    /// `stop`.
    pub async fn renew(mut self, mut current: Validity, stop: CancellationToken) {
        loop {
            let wait = schedule::renew_in((self.clock)(), current.not_before, current.not_after);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.cancelled() => return,
            }
            info!(node = %self.node, "renewing the gossip certificate");
            match self.obtain(Some(current), &stop).await {
                Some(renewed) => current = renewed,
                None => return,
            }
        }
    }

    /// Asks until a certificate is issued, backing off after each failure. The files
    /// are replaced only by a certificate that checks out.
    async fn obtain(
        &mut self,
        current: Option<Validity>,
        stop: &CancellationToken,
    ) -> Option<Validity> {
        loop {
            let attempt = tokio::select! {
                result = self.attempt() => result,
                _ = stop.cancelled() => return None,
            };
            match attempt {
                Ok(validity) => {
                    ::metrics::counter!(CERT_REQUESTS, "outcome" => "issued", "reason" => "")
                        .increment(1);
                    self.backoff.succeed();
                    self.state.send_replace(CertState::Valid {
                        not_after: validity.not_after,
                    });
                    info!(node = %self.node, cert = %self.cert_path().display(), "gossip certificate issued");
                    return Some(validity);
                }
                Err(failure) => {
                    let reason = match &failure {
                        Failure::Denied { reason, .. } => reason.clone(),
                        _ => String::new(),
                    };
                    ::metrics::counter!(CERT_REQUESTS, "outcome" => failure.outcome(), "reason" => reason)
                        .increment(1);
                    let retry_in = self.backoff.fail();
                    let expired = current.is_some_and(|c| c.not_after <= (self.clock)());
                    if expired {
                        error!(node = %self.node, %failure, ?retry_in, "the gossip certificate expired and no new one is issued; peers refuse this node until one is");
                    } else {
                        warn!(node = %self.node, %failure, ?retry_in, "no gossip certificate issued; retrying");
                    }
                    if current.is_none() || expired {
                        self.state.send_replace(CertState::Waiting(format!(
                            "no gossip certificate: {failure}"
                        )));
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(retry_in) => {}
                        _ = stop.cancelled() => return None,
                    }
                }
            }
        }
    }

    async fn attempt(&self) -> Result<Validity, Failure> {
        let key =
            KeyPair::generate().map_err(|e| Failure::Error(format!("cannot make a key: {e}")))?;
        let csr =
            request_for(&self.node, &self.imex, &key).map_err(|e| Failure::Error(e.to_string()))?;
        let answer = self
            .signer
            .request(&self.node, &csr, self.lifetime)
            .await
            .map_err(|e| Failure::Error(e.to_string()))?;
        let pem = match answer {
            Answer::Issued(pem) => pem,
            Answer::Denied { reason, message } => return Err(Failure::Denied { reason, message }),
        };
        let validity = check(
            &pem,
            &self.node,
            &self.imex,
            key.public_key_raw(),
            (self.clock)(),
        )
        .map_err(Failure::BadCertificate)?;
        // The key first: the loader refuses a certificate without its key, and takes
        // the pair at its next look once both are in place.
        let write = |name: &str, bytes: &[u8], mode| {
            domaind_atomic_file::replace(&self.dir, name, bytes, mode).map_err(|e| {
                Failure::Error(format!(
                    "cannot write {}: {e}",
                    self.dir.join(name).display()
                ))
            })
        };
        write(KEY_FILE, key.serialize_pem().as_bytes(), 0o600)?;
        write(CERT_FILE, pem.as_bytes(), 0o644)?;
        Ok(validity)
    }
}

/// What a node certificate carries for IMEX besides the node's name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImexNames {
    /// [`IMEX_SHARED_NAME`] as a second DNS name: what IMEX in DNS-names mode checks
    /// through `IMEX_SECURITY_TARGET_OVERRIDE`.
    pub shared_name: bool,
    /// IP SANs: what IMEX in IPs mode checks (the signer grants only the node's own).
    pub ips: Vec<IpAddr>,
}

impl ImexNames {
    fn dns_names<'a>(&self, node: &'a str) -> Vec<&'a str> {
        let mut names = vec![node];
        if self.shared_name {
            names.push(IMEX_SHARED_NAME);
        }
        names
    }
}

/// Why no signing request could be made: rcgen's error, after what was being made.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("cannot name {node:?} in a request: {source}")]
    Name { node: String, source: rcgen::Error },
    #[error("cannot make the request: {0}")]
    Make(#[source] rcgen::Error),
}

/// A CSR for `node`: its name as the common name and the first DNS name, and `imex`.
pub fn request_for(node: &str, imex: &ImexNames, key: &KeyPair) -> Result<String, RequestError> {
    let names: Vec<String> = imex
        .dns_names(node)
        .into_iter()
        .map(str::to_owned)
        .collect();
    let mut params = CertificateParams::new(names).map_err(|source| RequestError::Name {
        node: node.to_owned(),
        source,
    })?;
    params.distinguished_name.push(DnType::CommonName, node);
    params
        .subject_alt_names
        .extend(imex.ips.iter().copied().map(rcgen::SanType::IpAddress));
    params
        .serialize_request(key)
        .and_then(|csr| csr.pem())
        .map_err(RequestError::Make)
}

/// Whether `pem` is a certificate for `node` and exactly `imex` of the key
/// `public_key`, valid now.
fn check(
    pem: &str,
    node: &str,
    imex: &ImexNames,
    public_key: &[u8],
    now: SystemTime,
) -> Result<Validity, String> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|e| e.to_string())?;
    let (_, cert) = X509Certificate::from_der(&block.contents).map_err(|e| e.to_string())?;
    let names: Vec<GeneralName<'_>> = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| san.value.general_names.clone())
        .unwrap_or_default();
    let octets: Vec<Vec<u8>> = imex.ips.iter().copied().map(octets_of).collect();
    let wanted: Vec<GeneralName<'_>> = imex
        .dns_names(node)
        .into_iter()
        .map(GeneralName::DNSName)
        .chain(octets.iter().map(|o| GeneralName::IPAddress(o)))
        .collect();
    let same = names.len() == wanted.len() && wanted.iter().all(|w| names.contains(w));
    if !same {
        return Err(format!(
            "it names {names:?}, not exactly {:?} and the IPs {:?}",
            imex.dns_names(node),
            imex.ips
        ));
    }
    if cert.public_key().subject_public_key.data.as_ref() != public_key {
        return Err("it is not for the key this node asked with".into());
    }
    let at = |t: x509_parser::time::ASN1Time| {
        SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(t.timestamp()).unwrap_or(0))
    };
    let validity = Validity {
        not_before: at(cert.validity().not_before),
        not_after: at(cert.validity().not_after),
    };
    if validity.not_after <= now {
        return Err("it has already expired".into());
    }
    Ok(validity)
}

fn octets_of(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// Whether the certificate at `path` carries `ip` as an IP SAN; an unreadable one
/// does not.
pub fn carries_ip(path: &Path, ip: IpAddr) -> bool {
    carries(path, &GeneralName::IPAddress(&octets_of(ip)))
}

/// Whether the certificate at `path` carries [`IMEX_SHARED_NAME`]; an unreadable one
/// does not.
pub fn carries_imex_shared_name(path: &Path) -> bool {
    carries(path, &GeneralName::DNSName(IMEX_SHARED_NAME))
}

fn carries(path: &Path, wanted: &GeneralName<'_>) -> bool {
    let Ok(pem) = std::fs::read(path) else {
        return false;
    };
    let Ok((_, block)) = x509_parser::pem::parse_x509_pem(&pem) else {
        return false;
    };
    let Ok((_, cert)) = X509Certificate::from_der(&block.contents) else {
        return false;
    };
    cert.subject_alternative_name()
        .ok()
        .flatten()
        .is_some_and(|san| san.value.general_names.iter().any(|name| name == wanted))
}

/// The certificate and key in `dir`, if they are a pair for `node` and `imex`.
fn on_disk(dir: &Path, node: &str, imex: &ImexNames, now: SystemTime) -> Option<Validity> {
    let pem = std::fs::read_to_string(dir.join(CERT_FILE)).ok()?;
    let key = KeyPair::from_pem(&std::fs::read_to_string(dir.join(KEY_FILE)).ok()?).ok()?;
    check(&pem, node, imex, key.public_key_raw(), now).ok()
}

#[cfg(test)]
mod tests;
