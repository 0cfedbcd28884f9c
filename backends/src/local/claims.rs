//! Claims from `claims/<claim-uid>.json`: what the API server's ResourceClaim and
//! the ComputeDomain's opaque config say, in one small file.

use async_trait::async_trait;
use domaind_actors::model::{
    AllocatedDevice, AllocationMode, ClaimInfo, ClaimRef, DomainRef, DomainUid, Isolation, NodeId,
    ReadinessPolicy,
};
use domaind_actors::ports::{ClaimError, ClaimSource};
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::{CLAIM_FILE_LIMIT, LocalDir, count_bad_file, read_json};

use domaind_kube_api::names::{CHANNEL_REQUEST, DOMAIN_CHANNEL, channel_device, channel_of_device};

/// A claim allocated to a node, as the local backend keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimFile {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub compute_domain: ComputeDomainRef,
    #[serde(default)]
    pub allocation_mode: AllocationMode,
    /// The daemon's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<ReadinessPolicy>,
    /// The DRA driver the claim was allocated by; ours when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// The allocated device; `channel-0` of the node's pool when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Allocated with `adminAccess` (a monitoring pod's claim): it joins no domain, may
    /// name one of another namespace, and gets the channel of `device`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin_access: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ComputeDomainRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.numNodes`; 0 (follow the workload) when absent.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub num_nodes: u32,
    /// `spec.isolation`; `IMEXDomain` when absent.
    #[serde(default, skip_serializing_if = "Isolation::is_default")]
    pub isolation: Isolation,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Resolves claims from the local backend's claim files.
#[derive(Debug, Clone)]
pub struct LocalClaimSource {
    dir: LocalDir,
    node: NodeId,
    driver: String,
}

impl LocalClaimSource {
    pub fn new(dir: LocalDir, node: impl Into<NodeId>, driver: impl Into<String>) -> Self {
        Self {
            dir,
            node: node.into(),
            driver: driver.into(),
        }
    }

    /// What `file` gives the claim the kubelet `asked` for, or why it is refused (the
    /// user's words): the rules a parsed claim file must meet. Public for the fuzz
    /// targets (`fuzz/`).
    pub fn check(&self, asked: &ClaimRef, file: ClaimFile) -> Result<ClaimInfo, String> {
        let claim = format!("claim {}/{} ({})", asked.namespace, asked.name, asked.uid);
        if file.uid != asked.uid {
            return Err(format!(
                "{claim}: its file holds uid {:?}; the file must be named after the claim's uid",
                file.uid
            ));
        }
        if (file.namespace.as_str(), file.name.as_str())
            != (asked.namespace.as_str(), asked.name.as_str())
        {
            return Err(format!(
                "{claim}: the claim file names {}/{}; the kubelet and the file must agree",
                file.namespace, file.name
            ));
        }
        if let Some(driver) = file.driver.as_deref().filter(|d| *d != self.driver) {
            return Err(format!(
                "{claim} is allocated by driver {driver}, not {}: it is not ours to prepare",
                self.driver
            ));
        }
        let cd = &file.compute_domain;
        if cd.uid.is_empty() || cd.name.is_empty() || cd.namespace.is_empty() {
            return Err(format!(
                "{claim}: computeDomain needs a namespace, a name and a uid"
            ));
        }
        let device = file
            .device
            .unwrap_or_else(|| channel_device(DOMAIN_CHANNEL));
        if file.admin_access && channel_of_device(&device).is_none() {
            return Err(format!(
                "{claim} has adminAccess and device {device:?}, which is not a channel device \
                 (channel-<N>): an admin claim gets the channel it was allocated"
            ));
        }
        if !file.admin_access && cd.namespace != asked.namespace {
            return Err(format!(
                "{claim} is in namespace {} but its ComputeDomain {}/{} is in {}: a claim can \
                 only join a ComputeDomain of its own namespace",
                asked.namespace, cd.namespace, cd.name, cd.namespace
            ));
        }
        Ok(ClaimInfo {
            domain: DomainRef {
                uid: DomainUid(cd.uid.clone()),
                namespace: cd.namespace.clone(),
                name: cd.name.clone(),
                num_nodes: cd.num_nodes,
            },
            allocation_mode: file.allocation_mode,
            readiness: file.readiness,
            devices: vec![AllocatedDevice {
                request: CHANNEL_REQUEST.into(),
                pool: self.node.clone(),
                device,
            }],
            isolation: cd.isolation,
            admin_access: file.admin_access,
        })
    }
}

#[async_trait]
impl ClaimSource for LocalClaimSource {
    async fn resolve(&self, claim: &ClaimRef) -> Result<ClaimInfo, ClaimError> {
        let bad = |reason: &'static str, message: String| {
            count_bad_file("claim", reason);
            warn!(claim = %claim.uid, %message, "claim refused");
            ClaimError::Permanent(message)
        };
        let path = self
            .dir
            .claim_path(&claim.uid)
            .map_err(|e| bad(e.reason(), e.to_string()))?;
        let dir = self.dir.clone();
        let read =
            tokio::task::spawn_blocking(move || read_json::<ClaimFile>(&path, CLAIM_FILE_LIMIT))
                .await
                .map_err(|e| ClaimError::Transient(format!("claim lookup failed: {e}")))?;
        match read {
            Ok(Some(file)) => self.check(claim, file).map_err(|m| bad("invalid", m)),
            Ok(None) => Err(ClaimError::Permanent(format!(
                "claim {}/{} ({}) is unknown: no file {} in the local backend",
                claim.namespace,
                claim.name,
                claim.uid,
                dir.claim_path(&claim.uid)
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            ))),
            Err(error) if error.is_bad_file() => Err(bad(error.reason(), error.to_string())),
            Err(error) => Err(ClaimError::Transient(error.to_string())),
        }
    }
}
