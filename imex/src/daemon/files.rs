//! The files IMEX reads, written as it must find them: its config, nodes config and
//! hosts block, and its TLS credentials, rewritten when they rotate.

use super::*;

impl Inner {
    /// Writes IMEX's key, certificate and CA bundle; whether any changed. CA first and
    /// key before certificate: a daemon that reloads meanwhile (a peer's reload makes
    /// it) finds a pair that does not match and keeps what it had, as IMEX does with
    /// credentials it cannot load; our own SIGUSR1 follows the last write.
    pub(super) fn write_credentials(&self, files: &TlsFiles) -> std::io::Result<bool> {
        let dir = &self.settings.config_dir;
        let mut changed = false;
        for (name, contents) in [
            (TLS_CA_FILE, files.ca_cert()),
            (TLS_KEY_FILE, files.key()),
            (TLS_CERT_FILE, files.cert()),
        ] {
            changed |= write_secret(dir, name, contents).map_err(|e| {
                std::io::Error::new(e.kind(), format!("{}: {e}", dir.join(name).display()))
            })?;
        }
        Ok(changed)
    }

    /// At start: the credentials with TLS on (an error without them), and no key left
    /// behind with TLS off.
    pub(super) fn prepare_credentials(&self) -> Result<(), PortError> {
        let s = &self.settings;
        if !s.tls {
            for path in [s.tls_key_path(), s.tls_cert_path(), s.tls_ca_path()] {
                match std::fs::remove_file(&path) {
                    Ok(()) => info!(file = %path.display(), "IMEX TLS is off: removed its file"),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        warn!(file = %path.display(), error = %e, "cannot remove a file of IMEX TLS, which is off")
                    }
                }
            }
            return Ok(());
        }
        let Some(credentials) = &self.credentials else {
            return Err(PortError::permanent(
                "IMEX TLS is on but the adapter was given no credentials",
            ));
        };
        let files = credentials.borrow().clone();
        self.write_credentials(&files)
            .map(|_| ())
            .map_err(|e| io_error("cannot write IMEX's TLS credentials", e))
    }

    pub(super) fn nodes_config(&self, peers: &PeerSet) -> String {
        match self.settings.mode {
            AddressingMode::DnsNames => render_nodes_config_dns(self.settings.max_slots),
            AddressingMode::Ips => render_nodes_config_ips(peers),
        }
    }

    /// Writes our block of the hosts file for `peers` (DNS-names mode); `held`: with the
    /// slots the file maps now kept besides them ([`hosts::held_block`]).
    pub(super) fn write_hosts(&self, peers: &PeerSet, held: bool) -> Result<bool, PortError> {
        if self.settings.mode != AddressingMode::DnsNames {
            return Ok(false);
        }
        let s = &self.settings;
        let block = if held {
            let served = std::fs::read_to_string(&s.hosts_file).unwrap_or_default();
            hosts::held_block(&served, peers, s.max_slots, s.unused_slot_ip)
        } else {
            hosts::render_block(peers, s.max_slots, s.unused_slot_ip)
        };
        hosts::write(&self.settings.hosts_file, &block).map_err(|e| {
            io_error(
                &format!("cannot write {}", self.settings.hosts_file.display()),
                e,
            )
        })
    }
}

/// Writes through a temporary file and a rename, so IMEX never reads half a file. A
/// file that already holds `contents` is left alone: a restart on a full state
/// directory (where the config dir lives by default) then starts IMEX with the files
/// it has, rather than failing to rewrite them unchanged.
pub(super) fn write_atomic(path: &Path, contents: &str) -> std::io::Result<()> {
    if std::fs::read(path).is_ok_and(|existing| existing == contents.as_bytes()) {
        return Ok(());
    }
    domaind_atomic_file::replace_at(path, contents.as_bytes(), 0o644)
}

/// Writes a file only root may read, atomically; whether it changed. A file that already
/// holds `contents` with that mode is left alone (a full state directory must not keep
/// IMEX from starting on the files it has).
pub(super) fn write_secret(dir: &Path, name: &str, contents: &[u8]) -> std::io::Result<bool> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(name);
    let same = std::fs::read(&path).is_ok_and(|existing| existing == contents);
    let private = std::fs::metadata(&path)
        .is_ok_and(|meta| meta.permissions().mode() & 0o777 == TLS_FILE_MODE);
    if same && private {
        return Ok(false);
    }
    domaind_atomic_file::replace(dir, name, contents, TLS_FILE_MODE)?;
    Ok(true)
}

/// Rewrites IMEX's credentials whenever they rotate and asks the daemon to reload them;
/// a write that fails is tried again every [`CREDENTIALS_RETRY`] (IMEX keeps the old
/// credentials meanwhile). Ends when the adapter or the credentials' source is gone.
pub(super) async fn follow_credentials(
    inner: std::sync::Weak<Inner>,
    mut credentials: Credentials,
) {
    let mut failing = false;
    loop {
        if failing {
            tokio::select! {
                changed = credentials.changed() => if changed.is_err() { return },
                () = tokio::time::sleep(CREDENTIALS_RETRY) => {}
            }
        } else if credentials.changed().await.is_err() {
            return;
        }
        let files = credentials.borrow_and_update().clone();
        let Some(inner) = inner.upgrade() else { return };
        let mut state = inner.state.lock().await;
        match inner.write_credentials(&files) {
            Ok(changed) => {
                if failing || changed {
                    metrics::counter!(IMEX_TLS_ROTATIONS, "outcome" => "written").increment(1);
                    info!(
                        "IMEX's TLS credentials rotated: files rewritten, asking IMEX to reload them"
                    );
                    request_reload(&inner, &mut state);
                }
                failing = false;
            }
            Err(e) => {
                metrics::counter!(IMEX_TLS_ROTATIONS, "outcome" => "failed").increment(1);
                error!(error = %e, retry_in = ?CREDENTIALS_RETRY, "cannot write IMEX's rotated TLS credentials; IMEX keeps the old ones");
                failing = true;
            }
        }
    }
}
