//! The domain's vocabulary. No Kubernetes, tonic or NVML types: adapters translate.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// A Kubernetes node name, as gossip knows it.
pub type NodeId = String;

/// A ComputeDomain's UID.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DomainUid(pub String);

impl fmt::Display for DomainUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A ComputeDomain: identity, and the part of its spec the node needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainRef {
    pub uid: DomainUid,
    pub namespace: String,
    pub name: String,
    /// `spec.numNodes`: 0 follows the workload; above 0, the domain is not Ready until
    /// this many nodes are.
    #[serde(default)]
    pub num_nodes: u32,
}

impl fmt::Display for DomainRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// `<clusterUUID>.<cliqueId>`, or empty for a node without NVLink fabric.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CliqueId(pub String);

impl CliqueId {
    pub fn has_fabric(&self) -> bool {
        !self.0.is_empty()
    }
}

impl fmt::Display for CliqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An IMEX slot: the index of a node in the domain's IMEX nodes config.
pub type Slot = u16;

/// The default and usual maximum: an NVL72 rack has 18 nodes.
pub const DEFAULT_MAX_SLOTS: Slot = 18;

/// When a prepared claim's pod may start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReadinessPolicy {
    /// This node's IMEX daemon is ready (NVIDIA's driver's behaviour).
    #[default]
    Local,
    /// Every member of the domain is ready: a barrier across nodes.
    Domain,
}

/// Which channel devices a claim gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum AllocationMode {
    /// The domain's channel only.
    #[default]
    Single,
    /// Every channel device.
    All,
}

/// How a ComputeDomain is kept apart from the others (`spec.isolation`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Isolation {
    /// The domain owns its nodes' IMEX daemons: its own IMEX domain, one ComputeDomain
    /// per node (NVIDIA's driver's behaviour, and what a manifest without the field means).
    #[default]
    #[serde(rename = "IMEXDomain")]
    ImexDomain,
    /// The nodes' IMEX daemons form one IMEX domain per clique, shared by every domain of
    /// this mode there; each domain has its own channel, so memory is shared only within
    /// it. Several such domains may hold one node.
    Channel,
}

impl Isolation {
    pub fn is_default(&self) -> bool {
        *self == Self::ImexDomain
    }
}

/// As `spec.isolation` spells it.
impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ImexDomain => "IMEXDomain",
            Self::Channel => "Channel",
        })
    }
}

/// An IMEX channel number (`/dev/nvidia-caps-imex-channels/channel<N>`).
pub type ChannelId = u32;

/// What a node tells its clique about its part in one domain: the value of its
/// `domain/<uid>` gossip key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Advertisement {
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub num_nodes: u32,
    /// The address IMEX daemons use to reach this node.
    pub ip: IpAddr,
    pub clique: CliqueId,
    /// The slot this node holds, or none yet.
    pub slot: Option<Slot>,
    /// This node's IMEX daemon reports ready for the current peer set.
    pub imex_ready: bool,
    /// This node's IMEX daemon is down and failing (it exited or could not start, and
    /// is restarted with backoff): the reporter names the node in the status. Left out
    /// when false, so that a healthy node's advertisement reads as before the field.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub imex_failing: bool,
    /// This node's IMEX keeps running when its daemon stops (an IMEX runner or a host
    /// service keeps it): its peers hold it while their IMEX still reaches its IMEX
    /// (`rules::peer_health`). Left out when false, as `imex_failing`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub imex_outlives_daemon: bool,
    /// When this node joined the domain (ms since the epoch, its own clock): seniority
    /// in slot conflicts. Only the order matters, never the value.
    pub joined_at_ms: u64,
    /// Channel isolation only (left out otherwise, so that an exclusive domain's
    /// advertisement reads as before): the mode, the channel this node holds for the
    /// domain and, on the shared IMEX domain's own advertisement, the channel of every
    /// sharing domain as this node assigns them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
}

/// The channel-isolation part of an advertisement.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sharing {
    /// On a ComputeDomain's advertisement: the channel this node holds for it, once
    /// assigned. Its members' preference after restarts, as a slot is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<ChannelId>,
    /// On a ComputeDomain's advertisement: this node has handed `channel` to a pod. A
    /// domain held anywhere outranks every domain held nowhere, whatever their
    /// seniority: its channel can no longer move.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    /// On the shared IMEX domain's advertisement: every sharing domain's channel as this
    /// node assigns them. A channel is handed to a pod only once every live node of the
    /// shared IMEX domain assigns it the same way.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub channels: BTreeMap<DomainUid, ChannelId>,
    /// On the shared IMEX domain's advertisement: the channels this node's pods hold,
    /// by domain. Kept by the others with the rest of a lost node's advertisement, so
    /// that a channel stays reserved while a node whose daemon died (its pods may well
    /// run on) is away.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub held_channels: BTreeMap<DomainUid, ChannelId>,
}

/// A live member of a domain, from gossip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainMember {
    pub node: NodeId,
    /// The node's gossip generation (higher after each restart).
    pub generation: u64,
    pub ad: Advertisement,
}

/// Whether a domain, or one node of it, is ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    Ready,
    NotReady,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ready => "Ready",
            Self::NotReady => "NotReady",
        })
    }
}

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClaimRef {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

/// One device the scheduler allocated to a claim on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatedDevice {
    /// The claim's request it satisfies (`channel`).
    pub request: String,
    /// The ResourceSlice pool: the node.
    pub pool: String,
    /// The device's name in the pool, e.g. `channel-0`.
    pub device: String,
}

/// What the claim source knows about a claim allocated on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimInfo {
    pub domain: DomainRef,
    pub allocation_mode: AllocationMode,
    /// From the claim's opaque config; the daemon's default when absent.
    pub readiness: Option<ReadinessPolicy>,
    /// `spec.isolation` of the claim's ComputeDomain.
    #[serde(default, skip_serializing_if = "Isolation::is_default")]
    pub isolation: Isolation,
    /// The devices of our driver allocated on this node: what the kubelet is told the
    /// claim got. Whichever channel device was picked, the claim's containers get the
    /// domain's channel (see the DRA plugin).
    #[serde(default)]
    pub devices: Vec<AllocatedDevice>,
    /// The claim was allocated with `adminAccess` (a monitoring pod's): its devices and
    /// nothing more. It joins no domain, so it counts for none of the node's rules:
    /// not a member, not a holder against another domain, not a holder of a channel.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin_access: bool,
}

impl ClaimInfo {
    /// Whether preparing the claim makes this node a member of its domain: every claim
    /// but an admin one.
    pub fn joins_domain(&self) -> bool {
        !self.admin_access
    }
}
