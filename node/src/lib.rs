//! The node daemon (`domaind run`): the wiring that builds the node's actors and
//! adapters from its flags and serves them (`run`), and the node's certificates
//! (`certs`). The adapters are crates of their own: the kubelet plugin, IMEX, GPUs, the
//! checkpoint journal, what a claim gets on the machine (prepare) and the backends.

pub mod certs;
pub mod run;

/// Gives every metric the node daemon records its help text (`# HELP` on `/metrics`, and
/// the book's metrics reference): its adapters' and core's, and its own.
pub fn describe_metrics() {
    use metrics::describe_counter;
    domaind_actors::actors::describe_metrics();
    domaind_backends::describe_metrics();
    domaind_checkpoint::describe_metrics();
    domaind_gossip::metrics::describe();
    domaind_heap::describe();
    domaind_imex::describe_metrics();
    domaind_kube_api::metrics::describe();
    domaind_kubelet_plugin::describe_metrics();
    describe_counter!(
        run::clique::CLIQUE_READ_FAILURES,
        "Reads of the NVLink fabric that said nothing usable (the clique is kept), by \
         `kind`: `nvml`, `topology`, `registering` (a registration under way), \
         `gpus_disagree`, `fabric_lost` (no GPU registered any more), `timeout`, `panicked`."
    );
    describe_counter!(
        run::clique::CLIQUE_FLAPS,
        "New NVLink cliques read once and not confirmed by the next read."
    );
    describe_counter!(
        run::clique::CLIQUE_MOVES,
        "Moves of this node to another NVLink clique carried out."
    );
    describe_counter!(
        run::seeds::SEED_ADDRESSES_DROPPED,
        "Addresses a static gossip seed name resolved to beyond the 32 taken from one name."
    );
    describe_counter!(
        run::seeds::SEED_RESOLVE_FAILURES,
        "Static gossip seed names that did not resolve."
    );
    describe_counter!(
        certs::CERT_REQUESTS,
        "`--tls-mode csr`: this node's certificate requests, by `outcome` (`issued`, \
         `denied`, `error`, `bad_certificate`) and `reason` (the signer's, when denied)."
    );
}
