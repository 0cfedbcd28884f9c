use std::io;
use std::path::PathBuf;

/// Why a claim's CDI spec could not be made, written, removed or listed. Each names
/// the claim or file and, where there is one, what to fix.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error(
        "invalid claim UID {uid:?}: {reason}; a claim UID becomes a CDI device name and a \
         file name, so it may hold only letters, digits, '_', '.', ':' and '-' (the \
         kubelet sends UUIDs)"
    )]
    InvalidClaimUid { uid: String, reason: &'static str },

    #[error(
        "invalid DRA driver name {driver:?} for the CDI vendor: {reason}; give a DNS \
         subdomain of at most 63 characters, such as compute-domain.nvidia.com"
    )]
    InvalidDriver {
        driver: String,
        reason: &'static str,
    },

    #[error(
        "claim {claim}: allocation mode All needs at least one IMEX channel and none was \
         given; check that the nvidia-caps-imex-channels devices exist on this node"
    )]
    NoChannels { claim: String },

    #[error("claim {claim}: the CDI spec would be invalid: {reason}")]
    InvalidSpec { claim: String, reason: String },

    #[error("cannot encode the CDI spec {path}: {source}")]
    Encode {
        path: PathBuf,
        source: serde_json::Error,
    },

    #[error(
        "cannot write the CDI spec {path}: {source}; check that the CDI directory is \
         writable by domaind and is the one the container runtime reads"
    )]
    Write { path: PathBuf, source: io::Error },

    #[error("cannot remove the CDI spec {path}: {source}")]
    Remove { path: PathBuf, source: io::Error },

    #[error("cannot list the CDI directory {dir}: {source}")]
    List { dir: PathBuf, source: io::Error },
}
