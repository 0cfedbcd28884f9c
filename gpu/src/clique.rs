//! The node's clique from its GPUs: the one rule both inventories share.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use domaind_actors::model::CliqueId;

use super::{FabricState, GpuInfo};

const NIL_UUID: &str = "00000000-0000-0000-0000-000000000000";

/// Why a node's GPUs give no clique.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CliqueError {
    #[error(
        "the GPUs of this node report different NVLink cliques ({groups}); a node belongs to \
         one clique: check the NVLink partition of this node (fabric manager, `nvidia-smi -q`)"
    )]
    Disagree { groups: String },
    #[error(
        "NVLink fabric registration is still in progress on {gpus}: the clique is not known \
         yet; ask again once it completes (`nvidia-smi -q` shows the fabric state)"
    )]
    InProgress { gpus: String },
}

impl CliqueError {
    /// Asking again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::InProgress { .. })
    }
}

/// The clique of a node with these GPUs: `<clusterUUID>.<cliqueId>` when every GPU
/// registered with the fabric agrees, the empty clique when none did.
///
/// A GPU counts when its registration completed without error and gave it a cluster:
/// like NVIDIA's own driver, GPUs without fabric (not supported, not started, failed,
/// nil cluster) are left out, so a node with none is a member that does nothing rather
/// than an error. A registration still in progress is an error worth retrying: taking
/// the empty clique then would make the node change clique moments later.
pub fn node_clique(gpus: &[GpuInfo]) -> Result<CliqueId, CliqueError> {
    let mut cliques: BTreeMap<String, Vec<&GpuInfo>> = BTreeMap::new();
    for gpu in gpus.iter().filter(|gpu| is_registered(gpu)) {
        let clique = format!("{}.{}", gpu.fabric.cluster_uuid, gpu.fabric.clique_id);
        cliques.entry(clique).or_default().push(gpu);
    }
    if cliques.len() > 1 {
        let mut groups = String::new();
        for (clique, members) in &cliques {
            if !groups.is_empty() {
                groups.push_str("; ");
            }
            let _ = write!(groups, "{} in {clique}", list(members.iter().copied()));
        }
        return Err(CliqueError::Disagree { groups });
    }
    let pending: Vec<&GpuInfo> = gpus
        .iter()
        .filter(|gpu| gpu.fabric.state == FabricState::InProgress)
        .collect();
    if !pending.is_empty() {
        return Err(CliqueError::InProgress {
            gpus: list(pending.into_iter()),
        });
    }
    Ok(cliques.into_keys().next().map(CliqueId).unwrap_or_default())
}

fn is_registered(gpu: &GpuInfo) -> bool {
    let fabric = &gpu.fabric;
    fabric.state == FabricState::Completed
        && fabric.error.is_none()
        && !fabric.cluster_uuid.is_empty()
        && fabric.cluster_uuid != NIL_UUID
}

/// In index order, so the same GPUs give the same message.
fn list<'a>(gpus: impl Iterator<Item = &'a GpuInfo>) -> String {
    let mut gpus: Vec<&GpuInfo> = gpus.collect();
    gpus.sort_by(|a, b| (a.index, &a.uuid).cmp(&(b.index, &b.uuid)));
    gpus.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// NVML's 16 cluster UUID bytes as the lowercase hyphenated text cliques are made of
/// (what NVIDIA's driver writes, so cliques compare across both daemons).
pub fn format_cluster_uuid(bytes: &[u8; 16]) -> String {
    let mut text = String::with_capacity(36);
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            text.push('-');
        }
        let _ = write!(text, "{byte:02x}");
    }
    text
}

/// Whether `text` is a lowercase hyphenated UUID, the only form a cluster UUID takes.
pub fn is_cluster_uuid(text: &str) -> bool {
    text.len() == 36
        && text.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_digit() || ('a'..='f').contains(&c),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FabricInfo;

    const CLUSTER_A: &str = "6d2c1b7e-0a4f-4e4b-9d53-2f8f5c3a9b10";
    const CLUSTER_B: &str = "0b9e7a55-31d2-4c8e-8a77-5e1f0c2d4b66";

    fn gpu(index: u32, fabric: FabricInfo) -> GpuInfo {
        GpuInfo {
            index,
            uuid: format!("GPU-{index:08x}-0000-4000-8000-000000000000"),
            name: "NVIDIA GB200".into(),
            pci_bus_id: format!("0000000{index}:01:00.0"),
            fabric,
        }
    }

    fn with_state(state: FabricState) -> FabricInfo {
        FabricInfo {
            state,
            ..FabricInfo::registered(CLUSTER_A, 3)
        }
    }

    fn four(fabric: FabricInfo) -> Vec<GpuInfo> {
        (0..4).map(|i| gpu(i, fabric.clone())).collect()
    }

    /// Every rotation of the GPUs gives the same answer: order carries no meaning.
    fn clique_any_order(gpus: &[GpuInfo]) -> Result<CliqueId, CliqueError> {
        let first = node_clique(gpus);
        for shift in 1..gpus.len() {
            let mut rotated = gpus.to_vec();
            rotated.rotate_left(shift);
            assert_eq!(node_clique(&rotated), first, "rotated by {shift}");
        }
        first
    }

    #[test]
    fn agreeing_gpus_give_cluster_dot_clique() {
        let clique = clique_any_order(&four(FabricInfo::registered(CLUSTER_A, 3))).unwrap();
        assert_eq!(clique, CliqueId(format!("{CLUSTER_A}.3")));
        assert!(clique.has_fabric());
    }

    #[test]
    fn clique_id_is_written_in_decimal() {
        let clique = node_clique(&four(FabricInfo::registered(CLUSTER_A, 32767))).unwrap();
        assert_eq!(clique.0, format!("{CLUSTER_A}.32767"));
    }

    #[test]
    fn no_gpus_is_the_empty_clique() {
        assert_eq!(node_clique(&[]), Ok(CliqueId::default()));
    }

    #[test]
    fn gpus_without_fabric_give_the_empty_clique() {
        for state in [FabricState::NotSupported, FabricState::NotStarted] {
            let clique = clique_any_order(&four(with_state(state))).unwrap();
            assert_eq!(clique, CliqueId::default(), "{state}");
            assert!(!clique.has_fabric());
        }
    }

    #[test]
    fn failed_registration_or_no_cluster_counts_as_no_fabric() {
        let failed = FabricInfo {
            error: Some("Unknown Error".into()),
            ..FabricInfo::registered(CLUSTER_A, 3)
        };
        for fabric in [
            failed,
            FabricInfo::registered(NIL_UUID, 0),
            FabricInfo::registered("", 0),
        ] {
            assert_eq!(
                node_clique(&four(fabric.clone())),
                Ok(CliqueId::default()),
                "{fabric:?}"
            );
        }
    }

    #[test]
    fn gpus_without_fabric_beside_registered_ones_are_left_out() {
        let gpus = vec![
            gpu(0, FabricInfo::registered(CLUSTER_A, 3)),
            gpu(1, FabricInfo::not_supported()),
            gpu(2, with_state(FabricState::NotStarted)),
            gpu(3, FabricInfo::registered(NIL_UUID, 9)),
        ];
        assert_eq!(
            clique_any_order(&gpus),
            Ok(CliqueId(format!("{CLUSTER_A}.3")))
        );
    }

    #[test]
    fn different_clique_ids_are_an_error_naming_the_gpus() {
        let gpus = vec![
            gpu(0, FabricInfo::registered(CLUSTER_A, 3)),
            gpu(1, FabricInfo::registered(CLUSTER_A, 3)),
            gpu(2, FabricInfo::registered(CLUSTER_A, 4)),
            gpu(3, FabricInfo::not_supported()),
        ];
        let error = clique_any_order(&gpus).unwrap_err();
        assert!(!error.is_transient());
        let message = error.to_string();
        assert!(
            message.contains(&format!(
                "GPU 0 ({}), GPU 1 ({}) in {CLUSTER_A}.3",
                gpus[0].uuid, gpus[1].uuid
            )),
            "{message}"
        );
        assert!(
            message.contains(&format!("GPU 2 ({}) in {CLUSTER_A}.4", gpus[2].uuid)),
            "{message}"
        );
        assert!(!message.contains("GPU 3"), "{message}");
    }

    #[test]
    fn different_clusters_are_an_error_even_with_equal_clique_ids() {
        let gpus = vec![
            gpu(0, FabricInfo::registered(CLUSTER_A, 0)),
            gpu(1, FabricInfo::registered(CLUSTER_B, 0)),
        ];
        let message = clique_any_order(&gpus).unwrap_err().to_string();
        assert!(message.contains(&format!("GPU 0 ({}) in {CLUSTER_A}.0", gpus[0].uuid)));
        assert!(message.contains(&format!("GPU 1 ({}) in {CLUSTER_B}.0", gpus[1].uuid)));
    }

    #[test]
    fn registration_in_progress_is_a_transient_error_naming_the_gpus() {
        let gpus = vec![
            gpu(0, FabricInfo::registered(CLUSTER_A, 3)),
            gpu(1, with_state(FabricState::InProgress)),
            gpu(2, with_state(FabricState::InProgress)),
        ];
        let error = clique_any_order(&gpus).unwrap_err();
        assert!(error.is_transient());
        assert!(matches!(error, CliqueError::InProgress { .. }));
        let message = error.to_string();
        assert!(
            message.contains(&format!("{}, {}", gpus[1], gpus[2])),
            "{message}"
        );
        assert!(!message.contains(&gpus[0].to_string()), "{message}");
    }

    #[test]
    fn a_disagreement_outranks_a_registration_in_progress() {
        let gpus = vec![
            gpu(0, FabricInfo::registered(CLUSTER_A, 3)),
            gpu(1, FabricInfo::registered(CLUSTER_B, 3)),
            gpu(2, with_state(FabricState::InProgress)),
        ];
        let error = node_clique(&gpus).unwrap_err();
        assert!(matches!(error, CliqueError::Disagree { .. }), "{error}");
        assert!(!error.is_transient());
    }

    #[test]
    fn cluster_uuid_bytes_format_like_nvidias_driver() {
        let bytes = [
            0x6d, 0x2c, 0x1b, 0x7e, 0x0a, 0x4f, 0x4e, 0x4b, 0x9d, 0x53, 0x2f, 0x8f, 0x5c, 0x3a,
            0x9b, 0x10,
        ];
        assert_eq!(format_cluster_uuid(&bytes), CLUSTER_A);
        assert_eq!(format_cluster_uuid(&[0; 16]), NIL_UUID);
        assert_eq!(
            format_cluster_uuid(&[0xff; 16]),
            "ffffffff-ffff-ffff-ffff-ffffffffffff"
        );
    }

    #[test]
    fn only_lowercase_hyphenated_uuids_are_cluster_uuids() {
        assert!(is_cluster_uuid(CLUSTER_A));
        assert!(is_cluster_uuid(NIL_UUID));
        for bad in [
            "",
            "6D2C1B7E-0A4F-4E4B-9D53-2F8F5C3A9B10",
            "6d2c1b7e0a4f4e4b9d532f8f5c3a9b10",
            "6d2c1b7e-0a4f-4e4b-9d53-2f8f5c3a9b1",
            "6d2c1b7e-0a4f-4e4b-9d53-2f8f5c3a9b100",
            "6d2c1b7e-0a4f-4e4b-9d53.2f8f5c3a9b10",
            "6d2c1b7e-0a4f-4e4b-9d53-2f8f5c3a9bxz",
        ] {
            assert!(!is_cluster_uuid(bad), "{bad:?}");
        }
    }
}
