//! The end-to-end suite, one test binary: each costs link time and disk.
//!
//! The tests that need a cluster or root are ignored with what they need, so a plain
//! `cargo test` reports them as not run and why; `cargo test -- --ignored` runs them,
//! and there a missing need fails the test.
//!
//! - `rack`: a loopback rack of `domaind run` processes with the local backend.
//! - `storm`: SIGTERM during a storm of prepares; what was answered is what is held.
//! - `cliques`: a loopback rack of three cliques, a domain each, nothing crossing.
//! - `clique_move`: a node whose fabric registers in another clique moves there.
//! - `kube`: the node daemons and the controller against the real API server.
//! - `kubelet`: the same with real kubelets, NVIDIA's blog workload and a node loss.
//! - `health`: a pod's channel health from our `DRAResourceHealth` stream, as IMEX dies and comes back.
//! - `formation`: the formation benchmark on real Kubernetes (ignored; run by hand).
//! - `scale`: up to 144 daemons on one real API server, its requests, bytes and CPU
//!   (ignored; run by hand).
//! - `scale_model`: the same measured on a model of NVIDIA's coordination (ignored).
//! - `admission`: the chart's admission policies for the node daemon, with its tokens.
//! - `certs`: gossip node certificates through the CSR signer on the real API server.
//! - `discovery`: gossip seeds from the real API server, two cliques kept apart.
//! - `sharing`: two ComputeDomains with `isolation: Channel` on the same real kubelets.
//! - `statedir`: a node on a full state directory serves from memory and catches up.
//! - `migrate`: `domaind migrate --check` on objects shaped as NVIDIA's stack leaves them.
//! - `chaos_cluster`: `domaind-chaos run --cluster` on the real API server and kubelets.
//! - `examples`: `deploy/examples/` accepted by the real API server (server-side dry run).
//! - `pods`: the chaos harness's access to a chart-installed cluster's pods (`PodAccess`).
//! - `claim_status`: each pod's claim says how its channel is (`status.devices`).
//! - `admin`: monitoring pods with `adminAccess` beside a workload, joining no domain.
//! - `taints`: a node whose IMEX keeps failing is tainted; the real scheduler goes elsewhere.
//! - `status_cliques`: a ComputeDomain spanning two cliques lists both (the status sink).

mod admin;
mod admission;
mod certs;
mod chaos_cluster;
mod claim_status;
mod clique_move;
mod cliques;
mod discovery;
mod examples;
mod formation;
mod health;
mod kube;
mod kubelet;
mod migrate;
mod pods;
mod rack;
mod scale;
mod scale_model;
mod sharing;
mod statedir;
mod status_cliques;
mod storm;
mod taints;
