//! The backends claims and status go through: the Kubernetes API (`kube`), or local
//! files without a cluster (`local`). Both map the model onto the CRD's documents
//! (`contract`), show users the same event texts (`events`) and find stale claims by
//! one rule (`stale`).

pub mod contract;
pub mod events;
pub mod kube;
pub mod local;
pub mod stale;
