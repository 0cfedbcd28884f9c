//! The node daemon (`domaind run`) and its adapters: what touches the machine (IMEX,
//! GPUs, CDI, device nodes, the checkpoint file), the kubelet (the DRA plugin), and the
//! backends claims and status go through (Kubernetes, or local files without a
//! cluster). Each adapter implements a port of `domaind-actors` or a trait of its own,
//! beside a fake that honours the same contract. Also the loopback rack (`rack`), which
//! runs several node daemons on one machine for the demo, the chaos harness and the
//! end-to-end tests.

pub mod cdi;
pub mod certs;
pub mod contract;
pub mod devices;
pub mod events;
pub mod kube;
pub mod local;
pub mod prepare;
pub mod run;
pub mod stale;
