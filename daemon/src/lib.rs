//! The node's adapters: what touches the machine (IMEX, GPUs, CDI, device nodes, the
//! checkpoint file) and, later, Kubernetes and the kubelet. Each implements a port of
//! `domaind-actors` or a trait of its own, beside a fake that honours the same
//! contract.

mod atomic_file;
pub mod cdi;
pub mod checkpoint;
pub mod controller;
pub mod crd;
pub mod demo;
pub mod devices;
pub mod dra;
pub mod events;
pub mod gpu;
pub mod health;
pub mod imex;
pub mod kube;
pub mod local;
pub mod prepare;
pub mod procfs;
pub mod rack;
pub mod run;
pub mod stale;
