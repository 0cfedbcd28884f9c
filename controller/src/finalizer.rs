//! The finalizer that holds a ComputeDomain until no node is a member: JSON patches
//! that add and remove it, each guarded by a `test` of what they expect, so that a
//! concurrent change of the list fails the patch (and the reconcile is retried) instead
//! of being overwritten.

use kube::ResourceExt as _;

use domaind_kube_api::crd::ComputeDomain;
use domaind_kube_api::names::FINALIZER;

pub fn has(cd: &ComputeDomain) -> bool {
    cd.finalizers().iter().any(|f| f == FINALIZER)
}

/// The patch that adds our finalizer.
pub fn add(cd: &ComputeDomain) -> serde_json::Value {
    let finalizers = cd.finalizers();
    if finalizers.is_empty() {
        // Absent or empty: the list is created whole.
        serde_json::json!([
            test("/metadata/finalizers", metadata_finalizers(cd)),
            serde_json::json!({"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}),
        ])
    } else {
        serde_json::json!([
            test("/metadata/finalizers", serde_json::json!(finalizers)),
            serde_json::json!({"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}),
        ])
    }
}

/// The patch that removes our finalizer, if the CD has it.
pub fn remove(cd: &ComputeDomain) -> Option<serde_json::Value> {
    let index = cd.finalizers().iter().position(|f| f == FINALIZER)?;
    let path = format!("/metadata/finalizers/{index}");
    Some(serde_json::json!([
        test(&path, serde_json::json!(FINALIZER)),
        serde_json::json!({"op": "remove", "path": path}),
    ]))
}

/// `null` when the list is absent, as the server has it.
fn metadata_finalizers(cd: &ComputeDomain) -> serde_json::Value {
    match &cd.metadata.finalizers {
        None => serde_json::Value::Null,
        Some(list) => serde_json::json!(list),
    }
}

fn test(path: &str, value: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"op": "test", "path": path, "value": value})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::fixtures::compute_domain;
    use serde_json::json;

    #[test]
    fn adds_the_list_when_there_is_none() {
        let cd = compute_domain();
        assert!(!has(&cd));
        assert_eq!(
            add(&cd),
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": ["resource.nvidia.com/computeDomain"]}
            ])
        );
    }

    #[test]
    fn appends_to_someone_elses_finalizers() {
        let mut cd = compute_domain();
        cd.metadata.finalizers = Some(vec!["example.com/keep".into()]);
        assert_eq!(
            add(&cd),
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": ["example.com/keep"]},
                {"op": "add", "path": "/metadata/finalizers/-", "value": "resource.nvidia.com/computeDomain"}
            ])
        );
    }

    #[test]
    fn removes_only_ours_at_its_index() {
        let mut cd = compute_domain();
        assert_eq!(remove(&cd), None);
        cd.metadata.finalizers = Some(vec![
            "example.com/keep".into(),
            "resource.nvidia.com/computeDomain".into(),
        ]);
        assert!(has(&cd));
        assert_eq!(
            remove(&cd),
            Some(json!([
                {"op": "test", "path": "/metadata/finalizers/1", "value": "resource.nvidia.com/computeDomain"},
                {"op": "remove", "path": "/metadata/finalizers/1"}
            ]))
        );
    }
}
