//! Why a gossip message is refused before chitchat sees it: the words the wire parser
//! and the guard both speak.

/// Chitchat builds a delta to fit a UDP datagram, measured before compression; a
/// stream that inflates much beyond that was not written by chitchat, and reading it
/// whole is what a compression bomb wants.
pub const MAX_INFLATED_BYTES: usize = 256 * 1024;

/// Why a message was refused before chitchat could apply it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("gossip message is malformed: {0}")]
    Malformed(String),
    #[error("delta inflates past {MAX_INFLATED_BYTES} bytes")]
    Inflated,
    #[error(
        "delta for node {node:?} carries key {key:?} at version {key_version}, above the node's max version {max_version}"
    )]
    VersionAboveMax {
        node: String,
        key: String,
        key_version: u64,
        max_version: u64,
    },
    #[error("delta rewrites the receiving node's own state (max version {max_version})")]
    AboutReceiver { max_version: u64 },
}

impl Violation {
    /// The `reason` label of `domaind_gossip_frames_rejected_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "malformed",
            Self::Inflated => "oversized",
            Self::VersionAboveMax { .. } => "version_above_max",
            Self::AboutReceiver { .. } => "delta_about_receiver",
        }
    }
}
