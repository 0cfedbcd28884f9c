//! The names other components and existing tools match on: NVIDIA's driver used the same
//! finalizer, labels and device class, so tools written for it keep working.

/// On every ComputeDomain the controller serves, until no node is a member any more.
/// The anchor's name: a CD it left behind is released by us too.
pub const FINALIZER: &str = "resource.nvidia.com/computeDomain";

/// On the templates we create (and the claims made from them): the CD's uid. The owned
/// templates watch selects on it.
pub const DOMAIN_LABEL: &str = "resource.nvidia.com/computeDomain";
/// The anchor tells workload templates from its own daemon templates with this label.
pub const TARGET_LABEL: &str = "resource.nvidia.com/computeDomainTarget";
pub const TARGET_WORKLOAD: &str = "Workload";
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "domaind-controller";

/// The device class of the channel a workload's pods get.
pub const DEFAULT_CHANNEL_DEVICE_CLASS: &str = "compute-domain-default-channel.nvidia.com";
/// The one request of a template, as the anchor names it (node daemons match on it).
pub const CHANNEL_REQUEST: &str = "channel";

/// The controller's server-side-apply field manager. The node daemons apply the rest of
/// the status as `domaind-node`; with `conditions` a map keyed by `type`, neither
/// removes what the other wrote.
pub const FIELD_MANAGER: &str = "domaind-controller";

/// The status condition the controller owns.
pub const TEMPLATE_READY: &str = "TemplateReady";

/// Event and condition reasons.
pub mod reason {
    pub const TEMPLATE_CREATED: &str = "TemplateCreated";
    pub const TEMPLATE_NAME_TAKEN: &str = "TemplateNameTaken";
    pub const TEMPLATE_REJECTED: &str = "TemplateRejected";
    pub const WAITING_FOR_MEMBERS: &str = "WaitingForMembers";
    pub const DOMAIN_CREATED: &str = "DomainCreated";
}
