//! `imex-sim`'s TLS: the links of a config that turns IMEX's SSL/TLS on run over
//! mutual TLS with the files it names, as `nvidia-imex`'s do.
//!
//! - Each end presents the certificate its role's options name (`IMEX_SERVER_*` when
//!   accepting, `IMEX_CLIENT_*` when dialling) and requires the peer's to chain to that
//!   role's CA (`*_CERT_AUTH`). A peer whose certificate chains to another CA is
//!   refused: the link stays down, the refusal is printed with its reason (once per
//!   peer and reason: a dialler retries every second) and counted in the status
//!   listing (`tls.refused`).
//! - The server says so when it has accepted the client's certificate (one byte after
//!   the handshake): in TLS 1.3 a client's handshake completes before the server has
//!   checked the client's certificate, and a link must not count as up on one side only.
//! - A dialler checks the server's certificate against what it dialled, as IMEX's gRPC
//!   client does: `IMEX_SECURITY_TARGET_OVERRIDE` when set, else a peer the nodes config
//!   lists by IP must present that IP as an IP SAN. So a certificate IMEX would refuse
//!   fails here too. domaind sets the override in DNS-names mode, where the slot names
//!   dialled fit no certificate, if its certificate carries IMEX's shared name (as
//!   `auto` turns TLS on only then). Without it a peer listed by name is checked for its
//!   chain only: the simulator dials the IP it resolved and no longer knows the name
//!   (docs/ARCHITECTURE.md, "IMEX over mutual TLS").
//! - SIGUSR1 reloads the files (and re-reads which peers are listed by IP); new links
//!   use them, established ones keep their session. A set that does not load is
//!   refused and the old one kept (IMEX then skips the rest of the reload, the
//!   reconnection included; so does the simulator).
//! - Not modelled: a reload telling the peers to reload theirs.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use domaind_gossip::identity::node_name_of;
use domaind_gossip::tls::{crypto_provider, read_certs, read_key, server_config};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use serde::Serialize;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use domaind_imex::config::tls_keys;

/// How long a peer may take to complete its handshake (and a server to confirm it).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The server's word, after the handshake, that it accepted the client's certificate.
pub const ACCEPTED: u8 = 1;

/// The files of one role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleFiles {
    pub key: PathBuf,
    pub cert: PathBuf,
    pub ca: PathBuf,
}

/// What the config says of TLS, when it turns it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOptions {
    pub server: RoleFiles,
    pub client: RoleFiles,
    /// `IMEX_SECURITY_TARGET_OVERRIDE`: the name every server's certificate is checked
    /// against instead of the address dialled.
    pub target_override: Option<String>,
    /// `IMEX_NODE_CONFIG_FILE`: its IP entries are the peers checked by IP.
    pub nodes_config: Option<PathBuf>,
}

impl TlsOptions {
    /// `None` when the config leaves TLS off (`IMEX_ENABLE_AUTH_ENCRYPTION` absent or
    /// `0`). On, it needs the SSL/TLS mode, credentials from files, and all six paths:
    /// like IMEX, the simulator refuses to start rather than run in the clear.
    pub fn from_config(
        keys: &BTreeMap<String, String>,
        config: &Path,
    ) -> Result<Option<Self>, String> {
        let value = |key: &str| keys.get(key).map(String::as_str).unwrap_or("");
        match value(tls_keys::ENABLE) {
            "" | "0" => return Ok(None),
            "1" => {}
            other => {
                return Err(format!(
                    "{}: {} must be 0 or 1, not {other:?}",
                    config.display(),
                    tls_keys::ENABLE
                ));
            }
        }
        let mode = value(tls_keys::MODE);
        if mode != tls_keys::MODE_SSL_TLS {
            return Err(format!(
                "{}: {} is {mode:?}; imex-sim supports {} only",
                config.display(),
                tls_keys::MODE,
                tls_keys::MODE_SSL_TLS
            ));
        }
        let source = value(tls_keys::SOURCE);
        if source != tls_keys::SOURCE_FILE {
            return Err(format!(
                "{}: {} is {source:?}; imex-sim reads credentials from files only ({})",
                config.display(),
                tls_keys::SOURCE,
                tls_keys::SOURCE_FILE
            ));
        }
        let path = |key: &str| match value(key) {
            "" => Err(format!(
                "{}: {key} is missing (needed with {}=1)",
                config.display(),
                tls_keys::ENABLE
            )),
            path => Ok(PathBuf::from(path)),
        };
        Ok(Some(Self {
            server: RoleFiles {
                key: path(tls_keys::SERVER_KEY)?,
                cert: path(tls_keys::SERVER_CERT)?,
                ca: path(tls_keys::SERVER_CERT_AUTH)?,
            },
            client: RoleFiles {
                key: path(tls_keys::CLIENT_KEY)?,
                cert: path(tls_keys::CLIENT_CERT)?,
                ca: path(tls_keys::CLIENT_CERT_AUTH)?,
            },
            target_override: Some(value(tls_keys::TARGET_OVERRIDE))
                .filter(|name| !name.is_empty())
                .map(str::to_owned),
            nodes_config: Some(value("IMEX_NODE_CONFIG_FILE"))
                .filter(|path| !path.is_empty())
                .map(PathBuf::from),
        }))
    }
}

/// The handshakes' ends, built from one reading of the files.
#[derive(Clone)]
struct Loaded {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
}

fn load(options: &TlsOptions) -> Result<Loaded, String> {
    let server = &options.server;
    let server = server_config(
        &read_certs(&server.ca, "CA certificate").map_err(|e| e.to_string())?,
        read_certs(&server.cert, "certificate").map_err(|e| e.to_string())?,
        read_key(&server.key).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("server credentials: {e}"))?;
    let client = &options.client;
    let client = dialler_config(
        &read_certs(&client.ca, "CA certificate").map_err(|e| e.to_string())?,
        read_certs(&client.cert, "certificate").map_err(|e| e.to_string())?,
        read_key(&client.key).map_err(|e| e.to_string())?,
        options,
    )
    .map_err(|e| format!("client credentials: {e}"))?;
    Ok(Loaded {
        acceptor: TlsAcceptor::from(server),
        connector: TlsConnector::from(client),
    })
}

/// The nodes config's entries that are IPs: the peers IMEX dials by IP. Unreadable: none.
fn ip_entries(nodes_config: Option<&Path>) -> BTreeSet<IpAddr> {
    nodes_config
        .and_then(|path| std::fs::read_to_string(path).ok())
        .unwrap_or_default()
        .lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter_map(|entry| entry.parse().ok())
        .collect()
}

/// A dialler's TLS: it presents `chain` and checks the server as IMEX's client does
/// ([`DialledNameVerifier`]).
fn dialler_config(
    ca: &[CertificateDer<'static>],
    chain: Vec<CertificateDer<'static>>,
    key: rustls_pki_types::PrivateKeyDer<'static>,
    options: &TlsOptions,
) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    for cert in ca {
        roots.add(cert.clone()).map_err(|e| e.to_string())?;
    }
    let provider = crypto_provider();
    let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| e.to_string())?;
    let target_override = options
        .target_override
        .as_ref()
        .map(|name| {
            ServerName::try_from(name.clone()).map_err(|e| {
                format!(
                    "{} {name:?} is not a host name: {e}",
                    tls_keys::TARGET_OVERRIDE
                )
            })
        })
        .transpose()?;
    let verifier = DialledNameVerifier {
        inner,
        target_override,
        by_ip: ip_entries(options.nodes_config.as_deref()),
    };
    let config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_auth_cert(chain, key)
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(config))
}

/// Checks a server's certificate (chain, validity, usage) against the name IMEX would:
/// the override, else the IP dialled when the nodes config lists it, else (a slot name
/// the simulator no longer sees) the name the certificate carries, which leaves the
/// chain.
#[derive(Debug)]
struct DialledNameVerifier {
    inner: Arc<WebPkiServerVerifier>,
    target_override: Option<ServerName<'static>>,
    by_ip: BTreeSet<IpAddr>,
}

impl ServerCertVerifier for DialledNameVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        dialled: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let listed_by_ip = match dialled {
            ServerName::IpAddress(ip) => self.by_ip.contains(&IpAddr::from(*ip)),
            _ => false,
        };
        let name = match &self.target_override {
            Some(name) => name.clone(),
            None if listed_by_ip => dialled.to_owned(),
            None => {
                let node =
                    node_name_of(end_entity).map_err(|e| rustls::Error::General(e.to_string()))?;
                ServerName::try_from(node.as_str().to_owned())
                    .map_err(|e| rustls::Error::General(e.to_string()))?
            }
        };
        self.inner
            .verify_server_cert(end_entity, intermediates, &name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// What the status listing says of TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TlsStats {
    pub enabled: bool,
    /// Links whose handshake both ends accepted, either way.
    pub handshakes: u64,
    /// Handshakes refused, either way, on TLS's own terms: a certificate that does not
    /// chain to the CA, or a peer that does not speak TLS. A connection that breaks or
    /// stalls mid-handshake (a peer restarting, paused) is lost, not refused.
    pub refused: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_refusal: Option<String>,
    /// Credential reloads (SIGUSR1) that loaded, and that did not.
    pub reloads: u64,
    pub reloads_refused: u64,
}

/// The simulator's TLS: its current credentials and what its handshakes did.
pub struct LinkTls {
    options: TlsOptions,
    current: Mutex<Loaded>,
    stats: Mutex<TlsStats>,
    /// The last reason printed per peer, so that a dialler retrying every second does
    /// not print the same refusal every second.
    told: Mutex<BTreeMap<String, String>>,
}

impl LinkTls {
    /// Reads the files; an error names the one that failed.
    pub fn load(options: TlsOptions) -> Result<Self, String> {
        let loaded = load(&options)?;
        Ok(Self {
            options,
            current: Mutex::new(loaded),
            stats: Mutex::new(TlsStats {
                enabled: true,
                ..TlsStats::default()
            }),
            told: Mutex::default(),
        })
    }

    /// Re-reads the files for new links; a set that does not load leaves the old one.
    pub fn reload(&self) -> Result<(), String> {
        match load(&self.options) {
            Ok(loaded) => {
                *lock(&self.current) = loaded;
                lock(&self.stats).reloads += 1;
                Ok(())
            }
            Err(error) => {
                lock(&self.stats).reloads_refused += 1;
                Err(error)
            }
        }
    }

    pub fn acceptor(&self) -> TlsAcceptor {
        lock(&self.current).acceptor.clone()
    }

    pub fn connector(&self) -> TlsConnector {
        lock(&self.current).connector.clone()
    }

    pub fn stats(&self) -> TlsStats {
        lock(&self.stats).clone()
    }

    pub fn accepted(&self, peer: &str) {
        lock(&self.stats).handshakes += 1;
        if lock(&self.told).remove(peer).is_some() {
            println!("imex-sim: TLS link with {peer} accepted");
        }
    }

    /// Counts a refusal, and prints it unless it is the one last printed for `peer`.
    pub fn refused(&self, peer: &str, reason: String) {
        {
            let mut stats = lock(&self.stats);
            stats.refused += 1;
            stats.last_refusal = Some(reason.clone());
        }
        let mut told = lock(&self.told);
        if told.get(peer) != Some(&reason) {
            eprintln!("imex-sim: TLS link with {peer} refused: {reason}");
            told.insert(peer.to_owned(), reason);
        }
    }
}

impl std::fmt::Debug for LinkTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkTls")
            .field("options", &self.options)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use domaind_imex::config::{ImexSettings, parse_config, render_config};

    fn keys(text: &str) -> BTreeMap<String, String> {
        parse_config(text)
    }

    #[test]
    fn the_options_we_write_are_the_options_the_simulator_reads() {
        let mut settings = ImexSettings::new("/run/imex", "127.0.0.1".parse().unwrap());
        settings.tls = true;
        let options = TlsOptions::from_config(&keys(&render_config(&settings)), Path::new("c"))
            .unwrap()
            .expect("on");
        let ours = RoleFiles {
            key: settings.tls_key_path(),
            cert: settings.tls_cert_path(),
            ca: settings.tls_ca_path(),
        };
        assert_eq!(options.server, ours);
        assert_eq!(options.client, ours);
        settings.tls = false;
        let off = TlsOptions::from_config(&keys(&render_config(&settings)), Path::new("c"));
        assert_eq!(off, Ok(None));
    }

    #[test]
    fn the_peers_checked_by_ip_are_the_nodes_configs_ip_entries_and_an_override_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let nodes = dir.path().join("nodes_config.cfg");
        std::fs::write(
            &nodes,
            "# peers\n10.0.0.1\n fd00::2 \ndomaind-imex-slot-002\n\n",
        )
        .unwrap();
        assert_eq!(
            ip_entries(Some(&nodes)),
            BTreeSet::from(["10.0.0.1".parse().unwrap(), "fd00::2".parse().unwrap()])
        );
        assert!(ip_entries(Some(&dir.path().join("missing"))).is_empty());
        let mut settings = ImexSettings::new("/run/imex", "127.0.0.1".parse().unwrap());
        settings.tls = true;
        let unnamed = TlsOptions::from_config(&keys(&render_config(&settings)), Path::new("c"))
            .unwrap()
            .unwrap();
        assert_eq!(unnamed.target_override, None, "no shared name");
        settings.shared_name = true;
        let ours = TlsOptions::from_config(&keys(&render_config(&settings)), Path::new("c"))
            .unwrap()
            .unwrap();
        assert_eq!(
            ours.target_override.as_deref(),
            Some(domaind_gossip::identity::IMEX_SHARED_NAME),
            "DNS-names mode"
        );
        assert_eq!(ours.nodes_config, Some(settings.nodes_config_path()));
        settings.mode = domaind_imex::AddressingMode::Ips;
        let ips = TlsOptions::from_config(&keys(&render_config(&settings)), Path::new("c"))
            .unwrap()
            .unwrap();
        assert_eq!(ips.target_override, None);
        let text = format!(
            "{}IMEX_SECURITY_TARGET_OVERRIDE=imex.cluster\n",
            render_config(&settings)
        );
        let overridden = TlsOptions::from_config(&keys(&text), Path::new("c"))
            .unwrap()
            .unwrap();
        assert_eq!(overridden.target_override.as_deref(), Some("imex.cluster"));
    }

    #[test]
    fn tls_turned_on_but_not_usable_is_a_refusal_to_start_not_the_clear() {
        let full = "IMEX_ENABLE_AUTH_ENCRYPTION=1\nIMEX_AUTH_ENCRYPTION_MODE=SSL_TLS\n\
                    IMEX_AUTH_SOURCE=FILE\nIMEX_SERVER_KEY=k\nIMEX_SERVER_CERT=c\n\
                    IMEX_SERVER_CERT_AUTH=a\nIMEX_CLIENT_KEY=k\nIMEX_CLIENT_CERT=c\n\
                    IMEX_CLIENT_CERT_AUTH=a\n";
        assert!(
            TlsOptions::from_config(&keys(full), Path::new("c"))
                .unwrap()
                .is_some()
        );
        for (broken, says) in [
            (
                full.replace("ENCRYPTION=1", "ENCRYPTION=yes"),
                "must be 0 or 1",
            ),
            (full.replace("SSL_TLS", "GSS_AUTH_ENCRYPT"), "SSL_TLS only"),
            (full.replace("SOURCE=FILE", "SOURCE=ENV_VAL"), "files only"),
            (
                full.replace("IMEX_CLIENT_CERT_AUTH=a\n", ""),
                "IMEX_CLIENT_CERT_AUTH is missing",
            ),
        ] {
            let error = TlsOptions::from_config(&keys(&broken), Path::new("c")).unwrap_err();
            assert!(error.contains(says), "{error}");
        }
    }
}
