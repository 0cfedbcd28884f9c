//! The controller's Prometheus metrics: names in one place, so that the metrics reference
//! (generated from the registrations) and the code agree.

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

/// Gives the controller's metrics their help text (`# HELP` on `/metrics`, and the
/// book's metrics reference).
pub fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        RECONCILES,
        "Passes over a ComputeDomain, by `outcome`: `ok`, `error`."
    );
    describe_counter!(
        RECONCILE_ERRORS,
        "Failed passes over a ComputeDomain, by `reason`: `add_finalizer`, `read_template`, \
         `create_template`, `delete_template`, `list_claims`, `remove_finalizer`, \
         `apply_condition`, `invalid`."
    );
    describe_histogram!(
        RECONCILE_SECONDS,
        "Seconds a pass over a ComputeDomain took."
    );
    describe_counter!(
        TEMPLATES_CREATED,
        "ResourceClaimTemplates created for ComputeDomains."
    );
    describe_counter!(
        TEMPLATES_DELETED,
        "ResourceClaimTemplates deleted with their ComputeDomain."
    );
    describe_counter!(
        TEMPLATE_NAME_CONFLICTS,
        "ComputeDomains found naming a template that exists and is not theirs."
    );
    describe_counter!(
        FINALIZERS_RELEASED,
        "Deleted ComputeDomains released (their finalizer removed) once none of their \
         claims was allocated."
    );
    describe_gauge!(LEADER, "1 while this controller replica leads.");
    describe_counter!(LEADERSHIP_ACQUIRED, "Times this replica became the leader.");
    describe_counter!(
        LEASE_ERRORS,
        "Failed reads and writes of the leader election's Lease, by `op`: `read`, `write`."
    );
    describe_counter!(
        RACK_DOMAINS_CREATED,
        "ComputeDomains created by rack mode, one per new NVLink clique."
    );
    describe_counter!(
        CSR_DECISIONS,
        "The signer's decisions on gossip node certificate requests, by `decision` \
         (`approved`, `denied`, `failed`: approved by someone else against our rules) and \
         `reason` (the rule, or `NodeCertificateApproved`)."
    );
    describe_counter!(
        CSR_ERRORS,
        "Certificate requests the signer could not act on (API errors), retried with \
         backoff."
    );
    describe_counter!(
        CA_BUNDLE_ERRORS,
        "Failures to load the gossip CA or publish its bundle."
    );
    describe_gauge!(
        DOMAINS,
        "ComputeDomains as the leader last saw them, by `status`: `Ready`, `NotReady` \
         (members, not all ready), `Idle` (no member: waiting for pods); 0 on other replicas."
    );
    describe_gauge!(
        DOMAIN_NODES,
        "Member nodes the ComputeDomains' statuses list, by `status`: `Ready`, `NotReady` (a \
         lost node stays listed until it is back or its domain is released); the leader's."
    );
    describe_histogram!(
        DOMAIN_READY_SECONDS,
        "Seconds a ComputeDomain took to become Ready, on the leader's clock from what its \
         watch sees, by `transition`: `formed` (from its first member), `healed` (from \
         losing Ready). A domain first seen mid-way is not timed."
    );
}
