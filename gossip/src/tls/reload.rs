//! Rotation without restart: the files are re-read on a timer, and a changed set that
//! builds cleanly replaces the current one. New connections use it; established ones
//! keep the session they negotiated. A broken set is refused and the old one kept.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{TlsError, TlsFiles, TlsMaterial, TlsPaths};
use crate::identity::NodeName;
use crate::metrics;
use crate::signed::credentials::{CredentialsWatch, StateCredentials};

/// A node's current TLS material, kept in step with its files.
#[derive(Debug)]
pub struct NodeTls {
    paths: TlsPaths,
    node: NodeName,
    current: ArcSwap<TlsMaterial>,
    seen: Mutex<SeenFiles>,
    /// The signing half of the current material, for gossip to re-sign its state
    /// when it changes.
    credentials: watch::Sender<Arc<StateCredentials>>,
    /// The files behind the current material, for the node's IMEX daemon.
    files: watch::Sender<Arc<TlsFiles>>,
}

/// The files behind the current material, and the last set refused, so that a broken
/// rotation is reported once rather than on every check.
#[derive(Debug)]
struct SeenFiles {
    loaded: TlsFiles,
    refused: Option<TlsFiles>,
}

impl NodeTls {
    /// Loads the files for `node`; fails if the certificate names another node.
    pub fn load(paths: TlsPaths, node: NodeName) -> Result<Arc<Self>, TlsError> {
        let files = TlsFiles::read(&paths)?;
        let material = TlsMaterial::build(&paths, &files, &node)?;
        metrics::cert_expiry(material.expiry());
        let (credentials, _) = watch::channel(material.credentials());
        let (files_watch, _) = watch::channel(Arc::new(files.clone()));
        Ok(Arc::new(Self {
            paths,
            node,
            credentials,
            files: files_watch,
            current: ArcSwap::from_pointee(material),
            seen: Mutex::new(SeenFiles {
                loaded: files,
                refused: None,
            }),
        }))
    }

    pub fn node(&self) -> &NodeName {
        &self.node
    }

    pub fn paths(&self) -> &TlsPaths {
        &self.paths
    }

    pub fn material(&self) -> Arc<TlsMaterial> {
        self.current.load_full()
    }

    /// The gossip-signing credentials, following every rotation.
    pub fn credentials(&self) -> CredentialsWatch {
        self.credentials.subscribe()
    }

    /// The files of the current material, following every rotation: only a set that
    /// built is ever published, so a reader never copies a broken or half-written one.
    pub fn files(&self) -> watch::Receiver<Arc<TlsFiles>> {
        self.files.subscribe()
    }

    /// Re-reads the files; swaps in new material if they changed and are valid.
    /// Returns whether a new set was installed. A set refused before is not retried
    /// (nor reported again) until the files change once more.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let files = TlsFiles::read(&self.paths)?;
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.loaded == files || seen.refused.as_ref() == Some(&files) {
            return Ok(false);
        }
        match TlsMaterial::build(&self.paths, &files, &self.node) {
            Ok(material) => {
                metrics::cert_expiry(material.expiry());
                self.credentials.send_replace(material.credentials());
                self.current.store(Arc::new(material));
                self.files.send_replace(Arc::new(files.clone()));
                *seen = SeenFiles {
                    loaded: files,
                    refused: None,
                };
                Ok(true)
            }
            Err(error) => {
                seen.refused = Some(files);
                Err(error)
            }
        }
    }

    /// Checks the files every `interval` until the last `Arc<NodeTls>` is dropped.
    pub fn spawn_reloader(self: &Arc<Self>, interval: Duration) -> JoinHandle<()> {
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let Some(tls) = weak.upgrade() else { return };
                tls.reload_and_report();
            }
        })
    }

    fn reload_and_report(&self) {
        match self.reload_if_changed() {
            Ok(true) => {
                metrics::tls_reload("rotated");
                tracing::info!(node = %self.node, cert = %self.paths.cert.display(), "TLS certificate rotated");
            }
            Ok(false) => {}
            Err(error) => {
                metrics::tls_reload("refused");
                tracing::error!(node = %self.node, %error, "new TLS files refused; keeping the current certificate");
            }
        }
    }
}
