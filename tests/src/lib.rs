//! domaind's end-to-end tests: real `domaind` processes on loopback, the real API
//! server and the real kubelets of `../shared/kube`. This library is what the suite
//! (`suite/`) and other packages' process-level tests share; unit and scenario tests
//! live beside the code they test.

pub mod apiserver;
pub mod binaries;
pub mod cluster;
pub mod figures;
pub mod kubelet_log;
pub mod nvidia_model;
pub mod tokens;

pub use binaries::{Binaries, binaries};
