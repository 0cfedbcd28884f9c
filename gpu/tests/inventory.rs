//! The GPU inventories through the crate's public API, as the daemon will use them.

use domaind_gpu::{GpuInventory, NvmlInventory, NvmlInventoryError, Topology, TopologyInventory};

/// Runs on whatever machine the tests run on: one without a driver must get the clear
/// error (this is the developers' and CI's case), one with a driver a whole inventory.
#[test]
fn nvml_on_this_machine_answers_or_fails_in_one_clear_line() {
    match NvmlInventory::open() {
        Ok(nvml) => {
            let node = nvml.inventory().expect("a loaded driver lists its GPUs");
            assert!(!node.driver_version.is_empty());
            for gpu in &node.gpus {
                assert!(gpu.uuid.starts_with("GPU-"), "{gpu:?}");
                assert!(!gpu.pci_bus_id.is_empty(), "{gpu:?}");
            }
            match node.clique() {
                Ok(clique) if clique.has_fabric() => {
                    let (cluster, id) = clique.0.rsplit_once('.').expect("cluster.clique");
                    assert!(domaind_gpu::is_cluster_uuid(cluster), "{clique}");
                    id.parse::<u32>().expect("a decimal clique id");
                }
                Ok(_) => {}
                Err(error) => assert!(error.is_transient(), "{error}"),
            }
        }
        Err(error) => {
            assert!(
                matches!(
                    error,
                    NvmlInventoryError::Unavailable { .. }
                        | NvmlInventoryError::DriverNotLoaded { .. }
                ),
                "{error:?}"
            );
            let chain = format!("{:#}", anyhow::Error::new(error));
            assert!(!chain.contains('\n'), "{chain}");
            assert!(chain.starts_with("NVML (libnvidia-ml.so.1) is "), "{chain}");
            assert!(
                chain.contains(
                    "pass --nvml-library PATH; for machines without GPUs use \
                     --gpu-topology FILE (a fake topology)"
                ),
                "{chain}"
            );
        }
    }
}

#[test]
fn both_inventories_serve_behind_one_trait_object() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rack.json");
    Topology::simulated_rack(0, ["node-a", "node-b"])
        .unwrap()
        .write(&path)
        .unwrap();
    let mut inventories: Vec<Box<dyn GpuInventory>> =
        vec![Box::new(TopologyInventory::open(&path, "node-b").unwrap())];
    if let Ok(nvml) = NvmlInventory::open() {
        inventories.push(Box::new(nvml));
    }
    let fake = &inventories[0];
    assert_eq!(fake.clique().unwrap(), Topology::simulated_clique(0));
    assert_eq!(fake.inventory().unwrap().gpus.len(), 4);
    for inventory in &inventories[1..] {
        inventory
            .inventory()
            .expect("a loaded driver lists its GPUs");
    }
}
