//! The backends claims and status go through: the Kubernetes API (`kube`), or local
//! files without a cluster (`local`). Both map the model onto the CRD's documents
//! (`contract`), show users the same event texts (`events`) and find stale claims by
//! one rule (`stale`).

pub mod contract;
pub mod events;
pub mod kube;
pub mod local;
pub mod stale;

/// Gives the backends' metrics their help text (`# HELP` on `/metrics`, and the book's
/// metrics reference); the daemon calls it once, after installing its recorder.
pub fn describe_metrics() {
    use metrics::describe_counter;
    kube::describe_metrics();
    describe_counter!(
        local::BAD_FILES,
        "Files of the local backend that could not be used, by `kind` (`claim`, `status`, \
         `events`) and `reason` (`invalid` for a claim file that parses but is refused)."
    );
    describe_counter!(
        stale::STALE_CLAIMS_RELEASED,
        "Checkpointed claims released as stale, by `reason`: `claim_deleted`, \
         `claim_recreated`, `claim_not_allocated_here`, `domain_deleted`, \
         `domain_recreated`."
    );
    describe_counter!(
        stale::STALE_CLAIM_CHECKS,
        "Stale-claim checks, by `outcome`: `clean` (every claim decided), `undecided` (a \
         lookup failed: those claims are kept and asked about again), `failed` (a release \
         failed, or the node's claims could not be read)."
    );
}
