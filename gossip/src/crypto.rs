//! The one crypto provider every TLS config and every signature of gossip uses.

use std::sync::{Arc, OnceLock};

use rustls::crypto::CryptoProvider;

/// The ring crypto provider, installed as the process default the first time it is
/// asked for. aws-lc-rs is never compiled in; having both would make rustls unable to
/// choose, so every config here is built from this provider explicitly.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            // Another library may have installed the same provider first; that is fine.
            let _ = CryptoProvider::install_default((*provider).clone());
            provider
        })
        .clone()
}
