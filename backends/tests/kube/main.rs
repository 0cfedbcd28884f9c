//! The Kubernetes backend against a scripted API server (kube's tower mock): each test
//! checks the exact calls the backend makes and answers them as an API server would.

mod apiserver;
mod claim_status;
mod claims;
mod events;
mod reconcile;
mod slices;
mod stale;
mod status;
