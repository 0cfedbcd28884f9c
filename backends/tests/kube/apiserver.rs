//! What the kube backend's tests share: the project's scripted API server
//! (`domaind_kube_api::testing`), and the objects and caches they start from.

use domaind_backends::kube::DomainCache;
use domaind_kube_api::crd::ComputeDomain;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use serde_json::{Value, json};

pub use domaind_kube_api::testing::{Expect, pair, status};

/// A ComputeDomain as the API server returns it.
pub fn compute_domain(namespace: &str, name: &str, uid: &str, generation: i64) -> ComputeDomain {
    serde_json::from_value(json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": name, "namespace": namespace, "uid": uid,
                     "generation": generation, "resourceVersion": "100"},
        "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": format!("{name}-channel")}}},
    }))
    .unwrap()
}

/// A cache holding `domains`, synced; keep the writer to keep it so.
pub fn synced_cache(domains: Vec<ComputeDomain>) -> (DomainCache, Writer<ComputeDomain>) {
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for cd in domains {
        writer.apply_watcher_event(&watcher::Event::InitApply(cd));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    (DomainCache::from_store(store), writer)
}

/// A cache whose first list has not arrived.
pub fn unsynced_cache() -> (DomainCache, Writer<ComputeDomain>) {
    let (store, writer) = reflector::store();
    (DomainCache::from_store(store), writer)
}

/// The reference claim, as a real API server returned it.
pub fn reference_claim() -> Value {
    serde_json::from_str(include_str!(
        "../../../kube-api/fixtures/resourceclaim-allocated.json"
    ))
    .unwrap()
}

/// Sums a counter's values over label sets that contain every `labels` pair.
pub fn counter(
    snapshot: &[(
        metrics_util::CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        metrics_util::debugging::DebugValue,
    )],
    name: &str,
    labels: &[(&str, &str)],
) -> u64 {
    snapshot
        .iter()
        .filter(|(key, ..)| key.key().name() == name)
        .filter(|(key, ..)| {
            labels.iter().all(|(k, v)| {
                key.key()
                    .labels()
                    .any(|label| label.key() == *k && label.value() == *v)
            })
        })
        .map(|(.., value)| match value {
            metrics_util::debugging::DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum()
}

/// `error` keeps the API call's error and, beneath it, kube's own answer with `code`:
/// the source chain is whole, not flattened into text.
pub fn assert_refused_by_kube(error: &domaind_actors::ports::PortError, code: u16) {
    use std::error::Error as _;
    let api = error
        .source()
        .and_then(|s| s.downcast_ref::<domaind_kube_api::ApiError>())
        .unwrap_or_else(|| panic!("no ApiError beneath {error}"));
    assert_eq!(api.code(), Some(code), "{api}");
    match api.source().and_then(|s| s.downcast_ref::<kube::Error>()) {
        Some(kube::Error::Api(status)) => assert_eq!(status.code, code),
        other => panic!("no kube error beneath {api}: {other:?}"),
    }
}
