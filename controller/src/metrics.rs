//! The controller's Prometheus metrics: names in one place, so that the README's table
//! and the code agree.

pub const RECONCILES: &str = "domaind_controller_reconciles_total";
pub const RECONCILE_ERRORS: &str = "domaind_controller_reconcile_errors_total";
pub const RECONCILE_SECONDS: &str = "domaind_controller_reconcile_duration_seconds";
pub const TEMPLATES_CREATED: &str = "domaind_controller_templates_created_total";
pub const TEMPLATES_DELETED: &str = "domaind_controller_templates_deleted_total";
pub const TEMPLATE_NAME_CONFLICTS: &str = "domaind_controller_template_name_conflicts_total";
pub const FINALIZERS_RELEASED: &str = "domaind_controller_finalizers_released_total";
pub const LEADER: &str = "domaind_controller_leader";
pub const LEADERSHIP_ACQUIRED: &str = "domaind_controller_leadership_acquired_total";
pub const LEASE_ERRORS: &str = "domaind_controller_lease_errors_total";
pub const RACK_DOMAINS_CREATED: &str = "domaind_controller_rack_domains_created_total";
/// The signer's decisions: `decision` approved, denied or failed (approved by someone
/// else against our rules); `reason` the rule.
pub const CSR_DECISIONS: &str = "domaind_controller_csr_decisions_total";
/// CSRs the signer could not act on (API errors), retried with backoff.
pub const CSR_ERRORS: &str = "domaind_controller_csr_errors_total";
/// Failures to load the gossip CA or publish its bundle.
pub const CA_BUNDLE_ERRORS: &str = "domaind_controller_ca_bundle_errors_total";
/// Domains by `status`: `Ready`, `NotReady` (members, not all ready), `Idle` (no member:
/// NotReady in the CRD, waiting for pods), as the leader last saw them; 0 on other
/// replicas.
pub const DOMAINS: &str = "domaind_controller_domains";
/// Member nodes the domains' statuses list, by `status`: a lost node stays listed
/// `NotReady` until it is back or its domain is released.
pub const DOMAIN_NODES: &str = "domaind_controller_domain_nodes";
/// Seconds a domain took to become Ready, by `transition`: `formed` (from its first
/// member) and `healed` (from losing Ready), on the controller's clock (`census`).
pub const DOMAIN_READY_SECONDS: &str = "domaind_controller_domain_ready_seconds";
