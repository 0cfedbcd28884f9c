//! What loading the checkpoint found: shared by the store, which reports it, and the
//! writer, which does the loading.

use std::path::PathBuf;

use domaind_actors::model::DomainRef;
use domaind_actors::ports::Checkpoint;

/// What a load found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadOutcome {
    /// No checkpoint: the first start on this node, or the files were removed.
    Missing,
    /// The checkpoint of this boot.
    Restored { claims: usize },
    /// Written before the node last rebooted. Prepared claims, device nodes and
    /// containers do not survive a reboot, so it was emptied and loading starts empty.
    PreviousBoot { written_on_boot: String },
    /// Some records could not be trusted. They were set aside (copied to `moved_to`,
    /// unless that failed too) and dropped; the rest was restored.
    Damaged {
        /// Claims restored.
        claims: usize,
        damaged_records: usize,
        /// Claims whose last record was damaged: their state is unknown, so they were
        /// left out (and, with the Kubernetes backend, rebuilt from the API server).
        lost_claims: Vec<String>,
        /// Damaged records that named no claim we could tell: what they cost is
        /// unknown (the Kubernetes backend rebuilds what the API server knows of).
        unattributed: usize,
        /// `line N: why`, for the log.
        details: Vec<String>,
        /// The ComputeDomains to tell.
        domains: Vec<DomainRef>,
        moved_to: Option<PathBuf>,
    },
    /// Written by a newer domaind: the load failed, and records fail until the file is
    /// gone or domaind is upgraded.
    NewerFormat { found: u32, supported: u32 },
}

impl LoadOutcome {
    /// State was lost or refused in a way an operator should hear of, unlike a first
    /// start or a reboot: logged as an error and counted.
    pub fn needs_attention(&self) -> bool {
        matches!(self, Self::Damaged { .. } | Self::NewerFormat { .. })
    }

    /// Whether claims may be missing that the API server could tell us of.
    pub fn may_have_lost_claims(&self) -> bool {
        match self {
            Self::Missing => true,
            Self::Damaged {
                lost_claims,
                unattributed,
                ..
            } => !lost_claims.is_empty() || *unattributed > 0,
            _ => false,
        }
    }
}

/// A successful load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    pub checkpoint: Checkpoint,
    pub outcome: LoadOutcome,
}
