//! The node daemon (`domaind run`): the wiring that builds the node's actors and
//! adapters from its flags and serves them (`run`), and the node's certificates
//! (`certs`). The adapters are crates of their own: the kubelet plugin, IMEX, GPUs, the
//! checkpoint journal, what a claim gets on the machine (prepare) and the backends.

pub mod certs;
pub mod run;
