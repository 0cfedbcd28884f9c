//! This node's ResourceSlices: what they should hold, and what to write to get there.
//! Pure; the [publisher](super::publisher) does the I/O.
//!
//! One pool per node, named after the node, with `channels` devices `channel-0` ..
//! `channel-<n-1>`, each with the attributes `type` = `channel`, `id` = its number and
//! `cliqueID` = the node's clique (empty without fabric). The API allows 128 devices
//! per slice, so larger pools span several slices, named `<node>-<driver>-<i>`; every
//! slice carries the pool's generation and slice count, and the scheduler uses only a
//! pool whose slices of the newest generation are all there.
//!
//! A node with fabric also labels its slices with its clique
//! ([`CLIQUE_SLICE_LABEL`], see [`clique_label_value`]) and annotates them with its
//! gossip address ([`GOSSIP_ADDRESS_ANNOTATION`]): its clique-mates find it there
//! ([`peers`](super::peers)), each watching only its own clique's slices.
//!
//! While this node's IMEX keeps failing, every device carries the IMEX-failing taint
//! ([`tainted_slices`]; when, in [`taint_rule`](super::taint_rule)).
//!
//! Several channel devices let several pods of one ComputeDomain land on one node
//! (each claim is allocated one device). Which device a claim got does not matter to
//! what it is given: a `Single` claim gets the domain's channel, whatever device the
//! scheduler picked, because pods on different nodes share memory only through the
//! same channel number (see the prepare service).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// The API's limit on devices in one ResourceSlice (`ResourceSliceMaxDevices`).
pub const MAX_DEVICES_PER_SLICE: usize = 128;

/// Channel devices a node publishes by default: more pods of one ComputeDomain per
/// node than a 4-GPU node will usually run.
pub const DEFAULT_CHANNEL_DEVICES: u32 = 8;

/// The most channel devices a node may publish: IMEX has 2048 channels.
pub const MAX_CHANNEL_DEVICES: u32 = 2048;

/// A Kubernetes object name's limit (a DNS subdomain).
const NAME_LIMIT: usize = 253;

/// On the slices of a node with fabric: its clique, as [`clique_label_value`] writes
/// it. Clique-mates select on it, so that none caches the whole fleet's slices.
pub const CLIQUE_SLICE_LABEL: &str = "resource.nvidia.com/cliqueID";

/// On the slices of a node with fabric: the `ip:port` its gossip listens on.
pub const GOSSIP_ADDRESS_ANNOTATION: &str = "resource.nvidia.com/gossipAddress";

/// A label value's limit.
const LABEL_VALUE_LIMIT: usize = 63;

/// The value of [`CLIQUE_SLICE_LABEL`] for `clique`; `None` for the empty clique (no
/// fabric: nobody's peer). A clique is `<clusterUUID>.<cliqueId>`, a valid label value
/// as it is; one that is not (too long, odd characters) is written as `h-` and a
/// checksum, which stays valid and the same on every node. Checksums can collide, so
/// readers check the devices' `cliqueID` too.
pub fn clique_label_value(clique: &str) -> Option<String> {
    if clique.is_empty() {
        return None;
    }
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let valid = clique.len() <= LABEL_VALUE_LIMIT
        && edge_ok(clique.chars().next())
        && edge_ok(clique.chars().last())
        && clique
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    Some(if valid {
        clique.to_owned()
    } else {
        format!("h-{:08x}", crc32fast::hash(clique.as_bytes()))
    })
}

/// What this node publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    pub node: String,
    pub driver: String,
    /// `<clusterUUID>.<cliqueId>`, or empty for a node without fabric.
    pub clique: String,
    /// Channel devices: 1 to [`MAX_CHANNEL_DEVICES`].
    pub channels: u32,
    /// Where clique-mates reach this node's gossip; published only with a clique.
    pub gossip_addr: Option<SocketAddr>,
}

impl PoolSpec {
    /// The labels and annotations of every slice of the pool.
    fn discovery_metadata(&self) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
        let Some(label) = clique_label_value(&self.clique) else {
            return Default::default();
        };
        let labels = BTreeMap::from([(CLIQUE_SLICE_LABEL.to_owned(), label)]);
        let annotations = self
            .gossip_addr
            .map(|addr| BTreeMap::from([(GOSSIP_ADDRESS_ANNOTATION.to_owned(), addr.to_string())]))
            .unwrap_or_default();
        (labels, annotations)
    }
}

/// The name of a channel device.
pub fn device_name(channel: u32) -> String {
    domaind_kube_api::names::channel_device(channel)
}

/// The name of slice `index` of `node`'s pool. Too long a name keeps a prefix of the
/// node name and a checksum of the whole, so names stay unique and valid.
pub fn slice_name(node: &str, driver: &str, index: usize) -> String {
    let name = format!("{node}-{driver}-{index}");
    if name.len() <= NAME_LIMIT {
        return name;
    }
    let suffix = format!("-{:08x}-{driver}-{index}", crc32fast::hash(node.as_bytes()));
    let keep = NAME_LIMIT.saturating_sub(suffix.len());
    let prefix = node[..keep.min(node.len())].trim_end_matches(['-', '.']);
    format!("{prefix}{suffix}")
}

fn channel_device(channel: u32, clique: &str, taints: &[DeviceTaint]) -> Device {
    let attributes = BTreeMap::from([
        (
            "type".to_owned(),
            DeviceAttribute {
                string: Some("channel".into()),
                ..DeviceAttribute::default()
            },
        ),
        (
            "id".to_owned(),
            DeviceAttribute {
                int: Some(i64::from(channel)),
                ..DeviceAttribute::default()
            },
        ),
        (
            "cliqueID".to_owned(),
            DeviceAttribute {
                string: Some(clique.to_owned()),
                ..DeviceAttribute::default()
            },
        ),
    ]);
    Device {
        name: device_name(channel),
        attributes: Some(attributes),
        taints: (!taints.is_empty()).then(|| taints.to_vec()),
        ..Device::default()
    }
}

/// The slices `pool` should consist of at `generation`, owned by `owner` (the Node),
/// with no taints.
pub fn desired_slices(
    pool: &PoolSpec,
    generation: i64,
    owner: Option<&OwnerReference>,
) -> Vec<ResourceSlice> {
    tainted_slices(pool, &[], generation, owner)
}

/// [`desired_slices`], every device carrying `taints` (the node's own, kept apart from
/// the pool: what the node offers and whether it should be chosen now change for
/// different reasons).
pub fn tainted_slices(
    pool: &PoolSpec,
    taints: &[DeviceTaint],
    generation: i64,
    owner: Option<&OwnerReference>,
) -> Vec<ResourceSlice> {
    let channels: Vec<u32> = (0..pool.channels.clamp(1, MAX_CHANNEL_DEVICES)).collect();
    let chunks: Vec<&[u32]> = channels.chunks(MAX_DEVICES_PER_SLICE).collect();
    let count = i64::try_from(chunks.len()).expect("at most 16 slices");
    let (labels, annotations) = pool.discovery_metadata();
    chunks
        .iter()
        .enumerate()
        .map(|(index, chunk)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(&pool.node, &pool.driver, index)),
                owner_references: owner.map(|o| vec![o.clone()]),
                labels: (!labels.is_empty()).then(|| labels.clone()),
                annotations: (!annotations.is_empty()).then(|| annotations.clone()),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                driver: pool.driver.clone(),
                node_name: Some(pool.node.clone()),
                pool: ResourcePool {
                    name: pool.node.clone(),
                    generation,
                    resource_slice_count: count,
                },
                devices: Some(
                    chunk
                        .iter()
                        .map(|&channel| channel_device(channel, &pool.clique, taints))
                        .collect(),
                ),
                ..ResourceSliceSpec::default()
            },
        })
        .collect()
}

/// The writes that bring the observed slices to the desired ones.
#[derive(Debug, Clone, PartialEq)]
pub struct SlicePlan {
    /// The pool's generation after the writes.
    pub generation: i64,
    /// Slices to apply (create or replace), in name order.
    pub apply: Vec<ResourceSlice>,
    /// Slices to delete afterwards: ours by driver and node, but not wanted.
    pub delete: Vec<String>,
}

impl SlicePlan {
    pub fn is_empty(&self) -> bool {
        self.apply.is_empty() && self.delete.is_empty()
    }
}

/// Whether `observed` holds what we would write as `desired`: only the fields we set
/// are compared, so what the API server adds never makes us write again.
fn holds(observed: &ResourceSlice, desired: &ResourceSlice) -> bool {
    let spec = (&observed.spec, &desired.spec);
    // A taint's time is the API server's to fill in or round; what it says is ours.
    let devices = |s: &ResourceSliceSpec| {
        s.devices
            .iter()
            .flatten()
            .map(|d| {
                let taints: Vec<(String, Option<String>, String)> = d
                    .taints
                    .iter()
                    .flatten()
                    .map(|t| (t.key.clone(), t.value.clone(), t.effect.clone()))
                    .collect();
                (
                    d.name.clone(),
                    d.attributes.clone().unwrap_or_default(),
                    taints,
                )
            })
            .collect::<Vec<_>>()
    };
    let owned = desired
        .metadata
        .owner_references
        .iter()
        .flatten()
        .all(|wanted| {
            observed
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.uid == wanted.uid && o.kind == wanted.kind)
        });
    // Only our own keys: others' labels and annotations are theirs.
    let ours = |map: &Option<BTreeMap<String, String>>, key: &str| {
        map.as_ref().and_then(|m| m.get(key)).cloned()
    };
    let (seen, wanted) = (&observed.metadata, &desired.metadata);
    let discovery_held = ours(&seen.labels, CLIQUE_SLICE_LABEL)
        == ours(&wanted.labels, CLIQUE_SLICE_LABEL)
        && ours(&seen.annotations, GOSSIP_ADDRESS_ANNOTATION)
            == ours(&wanted.annotations, GOSSIP_ADDRESS_ANNOTATION);
    spec.0.driver == spec.1.driver
        && discovery_held
        && spec.0.node_name == spec.1.node_name
        && spec.0.pool == spec.1.pool
        && devices(spec.0) == devices(spec.1)
        && owned
}

/// What to write, given the slices of our driver on this node that the API server has
/// (`observed`) and the generation we last published; no taints.
pub fn plan(
    pool: &PoolSpec,
    owner: Option<&OwnerReference>,
    observed: &[ResourceSlice],
    last_generation: i64,
) -> SlicePlan {
    plan_tainted(pool, &[], owner, observed, last_generation)
}

/// [`plan`] for devices carrying `taints`. A taint is content like any other: putting
/// one on or taking it off writes the pool at a new generation.
///
/// - All there and as desired: nothing.
/// - Only some missing (the others as desired, at one generation): recreate those,
///   at that generation: the pool did not change, it lost slices (a kubelet that
///   starts deletes its node's).
/// - Anything else (content changed, slices of another generation or name): the
///   whole pool at a new generation, above any seen, then delete the unwanted.
pub fn plan_tainted(
    pool: &PoolSpec,
    taints: &[DeviceTaint],
    owner: Option<&OwnerReference>,
    observed: &[ResourceSlice],
    last_generation: i64,
) -> SlicePlan {
    let by_name: BTreeMap<&str, &ResourceSlice> = observed
        .iter()
        .filter_map(|s| Some((s.metadata.name.as_deref()?, s)))
        .collect();
    let seen_generation = observed
        .iter()
        .map(|s| s.spec.pool.generation)
        .max()
        .unwrap_or(0);
    let current = if observed.is_empty() {
        last_generation.max(1)
    } else {
        seen_generation
    };
    let wanted = tainted_slices(pool, taints, current, owner);
    let wanted_names: BTreeSet<String> = wanted
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    let extra: Vec<String> = by_name
        .keys()
        .filter(|name| !wanted_names.contains(**name))
        .map(|name| (*name).to_owned())
        .collect();
    let present_as_desired = wanted.iter().all(|desired| {
        let name = desired.metadata.name.as_deref().unwrap_or_default();
        by_name.get(name).is_none_or(|seen| holds(seen, desired))
    });
    if present_as_desired && extra.is_empty() {
        let missing: Vec<ResourceSlice> = wanted
            .into_iter()
            .filter(|s| !by_name.contains_key(s.metadata.name.as_deref().unwrap_or_default()))
            .collect();
        return SlicePlan {
            generation: current,
            apply: missing,
            delete: Vec::new(),
        };
    }
    let generation = seen_generation.max(last_generation) + 1;
    SlicePlan {
        generation,
        apply: tainted_slices(pool, taints, generation, owner),
        delete: extra,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DRIVER: &str = "compute-domain.nvidia.com";
    const CLIQUE: &str = "8c6d1a2f-1b1e-4d59-9b8b-3a3f8f7c2a10.32766";

    fn pool(channels: u32) -> PoolSpec {
        PoolSpec {
            node: "gb200-rack1-n01".into(),
            driver: DRIVER.into(),
            clique: CLIQUE.into(),
            channels,
            gossip_addr: None,
        }
    }

    fn node_owner() -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: "gb200-rack1-n01".into(),
            uid: "node-uid".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }
    }

    #[test]
    fn devices_look_like_the_real_api_servers_slice() {
        let reference: serde_json::Value = serde_json::from_str(include_str!(
            "../../../kube-api/fixtures/resourceslice.json"
        ))
        .unwrap();
        let ours = desired_slices(&pool(2), 1, None);
        assert_eq!(ours.len(), 1);
        let ours = serde_json::to_value(&ours[0]).unwrap();
        assert_eq!(ours["spec"], reference["spec"]);
        assert_eq!(ours["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(ours["kind"], "ResourceSlice");
        assert_eq!(
            ours["metadata"],
            json!({
                "name": "gb200-rack1-n01-compute-domain.nvidia.com-0",
                "labels": {CLIQUE_SLICE_LABEL: CLIQUE},
            })
        );
    }

    #[test]
    fn a_node_with_fabric_publishes_its_clique_label_and_gossip_address() {
        let mut spec = pool(300);
        spec.gossip_addr = Some("10.0.0.7:7946".parse().unwrap());
        for slice in desired_slices(&spec, 1, None) {
            assert_eq!(slice.metadata.labels.unwrap()[CLIQUE_SLICE_LABEL], CLIQUE);
            assert_eq!(
                slice.metadata.annotations.unwrap()[GOSSIP_ADDRESS_ANNOTATION],
                "10.0.0.7:7946"
            );
        }
        // Without fabric: nobody's peer, nothing to find.
        spec.clique = String::new();
        let bare = desired_slices(&spec, 1, None).remove(0);
        assert_eq!(
            (bare.metadata.labels, bare.metadata.annotations),
            (None, None)
        );
    }

    #[test]
    fn a_moved_gossip_address_is_written_again() {
        let mut spec = pool(2);
        spec.gossip_addr = Some("10.0.0.7:7946".parse().unwrap());
        let published = desired_slices(&spec, 1, None);
        assert!(plan(&spec, None, &published, 1).is_empty());
        spec.gossip_addr = Some("10.0.0.8:7946".parse().unwrap());
        let moved = plan(&spec, None, &published, 1);
        assert_eq!(moved.apply, desired_slices(&spec, 2, None));
    }

    #[test]
    fn clique_label_values_are_valid_and_the_same_everywhere() {
        assert_eq!(clique_label_value(""), None);
        assert_eq!(clique_label_value(CLIQUE).as_deref(), Some(CLIQUE));
        for odd in [
            format!("{CLIQUE}.{}", "9".repeat(40)),
            "clique/with:slashes".to_owned(),
            ".leading-dot".to_owned(),
        ] {
            let value = clique_label_value(&odd).unwrap();
            assert!(value.starts_with("h-") && value.len() == 10, "{value}");
            assert_eq!(clique_label_value(&odd), Some(value));
        }
        assert_ne!(clique_label_value("a/1"), clique_label_value("a/2"));
    }

    #[test]
    fn large_pools_split_at_the_apis_limit() {
        let slices = desired_slices(&pool(300), 4, Some(&node_owner()));
        let sizes: Vec<usize> = slices
            .iter()
            .map(|s| s.spec.devices.as_ref().unwrap().len())
            .collect();
        assert_eq!(sizes, [128, 128, 44]);
        assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 3
            && s.spec.pool.generation == 4
            && s.metadata.owner_references.as_ref().unwrap()[0].uid == "node-uid"));
        let last = &slices[2].spec.devices.as_ref().unwrap();
        assert_eq!(last[43].name, "channel-299");
        assert_eq!(last[43].attributes.as_ref().unwrap()["id"].int, Some(299));
        let names: BTreeSet<_> = slices
            .iter()
            .map(|s| s.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names.len(), 3);
    }

    #[test]
    fn names_stay_valid_for_long_node_names() {
        let node = format!("{}.example.com", "n".repeat(240));
        let name = slice_name(&node, DRIVER, 15);
        assert!(name.len() <= NAME_LIMIT, "{}", name.len());
        assert!(name.ends_with("-compute-domain.nvidia.com-15"));
        assert_ne!(name, slice_name(&format!("{node}x"), DRIVER, 15));
    }

    #[test]
    fn nothing_is_written_when_the_pool_is_as_desired() {
        let published = desired_slices(&pool(8), 3, Some(&node_owner()));
        let mut observed = published.clone();
        // What the API server adds does not count.
        observed[0].metadata.resource_version = Some("77".into());
        observed[0].metadata.uid = Some("slice-uid".into());
        let plan = plan(&pool(8), Some(&node_owner()), &observed, 3);
        assert!(plan.is_empty(), "{plan:?}");
        assert_eq!(plan.generation, 3);
    }

    #[test]
    fn a_first_publish_and_a_wiped_pool_are_written_whole() {
        let first = plan(&pool(8), None, &[], 0);
        assert_eq!((first.generation, first.apply.len()), (1, 1));
        let after_wipe = plan(&pool(8), None, &[], 5);
        assert_eq!(
            after_wipe.generation, 5,
            "a wipe is not a change of content"
        );
        assert_eq!(after_wipe.apply, desired_slices(&pool(8), 5, None));
    }

    #[test]
    fn a_lost_slice_is_recreated_at_the_same_generation() {
        let published = desired_slices(&pool(300), 2, None);
        let observed = vec![published[0].clone(), published[2].clone()];
        let plan = plan(&pool(300), None, &observed, 2);
        assert_eq!(plan.generation, 2);
        assert_eq!(plan.apply, vec![published[1].clone()]);
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn a_changed_pool_gets_a_new_generation_and_loses_its_extra_slices() {
        let published = desired_slices(&pool(300), 2, None);
        let mut smaller = pool(8);
        let plan_ = plan(&smaller, None, &published, 2);
        assert_eq!(plan_.generation, 3);
        assert_eq!(plan_.apply, desired_slices(&smaller, 3, None));
        assert_eq!(
            plan_.delete,
            vec![
                slice_name(&smaller.node, DRIVER, 1),
                slice_name(&smaller.node, DRIVER, 2)
            ]
        );

        smaller.clique = "other.1".into();
        let moved = plan(&smaller, None, &desired_slices(&pool(8), 3, None), 3);
        assert_eq!(moved.generation, 4);
        assert_eq!(
            moved.apply[0].spec.devices.as_ref().unwrap()[0]
                .attributes
                .as_ref()
                .unwrap()["cliqueID"]
                .string
                .as_deref(),
            Some("other.1")
        );
    }

    #[test]
    fn a_foreign_slice_in_our_pool_forces_a_new_generation_above_it() {
        let mut stranger = desired_slices(&pool(2), 9, None).remove(0);
        stranger.metadata.name = Some("gb200-rack1-n01-compute-domain.nvidia.com-x7k2p".into());
        let plan = plan(&pool(2), None, &[stranger], 1);
        assert_eq!(plan.generation, 10);
        assert_eq!(plan.apply.len(), 1);
        assert_eq!(
            plan.delete,
            vec!["gb200-rack1-n01-compute-domain.nvidia.com-x7k2p".to_owned()]
        );
    }

    fn imex_taint(value: &str, at: &str) -> DeviceTaint {
        DeviceTaint {
            key: format!("{DRIVER}/imex-failing"),
            value: Some(value.into()),
            effect: "NoSchedule".into(),
            time_added: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                at.parse().unwrap(),
            )),
        }
    }

    #[test]
    fn a_taint_goes_on_every_device_of_every_slice_and_off_again() {
        let taint = imex_taint("exited", "2026-05-01T10:00:00Z");
        let untainted = desired_slices(&pool(300), 2, None);
        let tainted = plan_tainted(
            &pool(300),
            std::slice::from_ref(&taint),
            None,
            &untainted,
            2,
        );
        assert_eq!(tainted.generation, 3, "new content, new generation");
        let devices: Vec<&Device> = tainted
            .apply
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .collect();
        assert_eq!(devices.len(), 300);
        assert!(
            devices
                .iter()
                .all(|d| d.taints.as_deref() == Some(std::slice::from_ref(&taint)))
        );
        // Published: nothing more to do, whatever time the API server wrote.
        let mut observed = tainted.apply.clone();
        for device in observed[1].spec.devices.iter_mut().flatten() {
            device.taints = Some(vec![imex_taint("exited", "2026-05-01T10:00:01Z")]);
        }
        assert!(
            plan_tainted(&pool(300), std::slice::from_ref(&taint), None, &observed, 3).is_empty()
        );
        // Another cause is another taint.
        let other = imex_taint("no-imex-binary", "2026-05-01T10:00:00Z");
        assert_eq!(
            plan_tainted(&pool(300), &[other], None, &observed, 3).generation,
            4
        );
        let untaint = plan(&pool(300), None, &observed, 3);
        assert_eq!(untaint.generation, 4);
        assert_eq!(untaint.apply, desired_slices(&pool(300), 4, None));
    }

    #[test]
    fn an_owner_learnt_later_is_written() {
        let published = desired_slices(&pool(2), 1, None);
        let plan = plan(&pool(2), Some(&node_owner()), &published, 1);
        assert_eq!(plan.generation, 2);
        assert_eq!(plan.apply.len(), 1);
    }
}
