//! A FAKE inventory for machines without GPUs: a JSON topology file says what GPUs each
//! node has and which cluster and clique they are in.
//!
//! ```json
//! { "nodes": { "node-0": { "driverVersion": "0.0.0-fake", "gpus": [
//!     { "index": 0, "uuid": "GPU-…", "name": "NVIDIA GB200", "pciBusId": "00000008:01:00.0",
//!       "fabric": { "state": "completed", "clusterUuid": "…", "cliqueId": 0 } } ] } } }
//! ```
//!
//! `fabric` may be left out (no fabric); its `state` is `notSupported`, `notStarted`,
//! `inProgress` or `completed`, and an `error` beside `completed` says registration
//! failed. The demo and the chaos harness make files for whole racks with
//! [`Topology::simulated_rack`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use domaind_actors::model::CliqueId;
use serde::{Deserialize, Serialize};

use super::clique::is_cluster_uuid;
use super::{FabricInfo, FabricState, GpuError, GpuInfo, GpuInventory, NodeGpus};

/// What every GPU of a simulated rack is called.
pub const FAKE_GPU_NAME: &str = "NVIDIA GB200";
/// The driver version of simulated nodes: plainly not a real one.
pub const FAKE_DRIVER_VERSION: &str = "0.0.0-fake";
/// A GB200 compute tray has 4 GPUs.
pub const GPUS_PER_SIMULATED_NODE: u32 = 4;
/// The PCI domains of a GB200 tray's GPUs, so simulated bus ids look like real ones.
const SIMULATED_PCI_DOMAINS: [u32; GPUS_PER_SIMULATED_NODE as usize] = [0x8, 0x9, 0x18, 0x19];

/// Why a topology cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("cannot read the GPU topology file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the GPU topology file {} is not valid JSON for a topology: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("the GPU topology file {} is not valid: {problem}", path.display())]
    Invalid { path: PathBuf, problem: String },
    #[error(
        "node {node:?} is not in the GPU topology file {} (it has {known}): add the node to \
         the file, or fix the node name",
        path.display()
    )]
    UnknownNode {
        path: PathBuf,
        node: String,
        known: String,
    },
    #[error("node {node:?} is in the topology twice: node names must be unique")]
    DuplicateNode { node: String },
    #[error("cannot write the GPU topology file {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Nodes and their GPUs: the content of a topology file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    pub nodes: BTreeMap<String, NodeGpus>,
}

impl Topology {
    /// Read and check a topology file.
    pub fn load(path: &Path) -> Result<Self, TopologyError> {
        let text = fs::read_to_string(path).map_err(|source| TopologyError::Read {
            path: path.to_owned(),
            source,
        })?;
        let topology: Self =
            serde_json::from_str(&text).map_err(|source| TopologyError::Parse {
                path: path.to_owned(),
                source,
            })?;
        topology.check().map_err(|problem| TopologyError::Invalid {
            path: path.to_owned(),
            problem,
        })?;
        Ok(topology)
    }

    /// Write the topology where [`Topology::load`] reads it. The file is replaced
    /// whole and durably, so an inventory reading it meanwhile sees
    /// the old topology or the new one, never half of one.
    pub fn write(&self, path: &Path) -> Result<(), TopologyError> {
        let write_error = |source| TopologyError::Write {
            path: path.to_owned(),
            source,
        };
        let mut text = serde_json::to_string_pretty(self)
            .map_err(|error| write_error(io::Error::other(error)))?;
        text.push('\n');
        domaind_atomic_file::replace_at(path, text.as_bytes(), 0o644).map_err(write_error)
    }

    /// A rack of `nodes`, each with [`GPUS_PER_SIMULATED_NODE`] GPUs, all in one
    /// cluster and clique ([`Topology::simulated_clique`] of `rack`). UUIDs follow from
    /// `rack` and each node's position, so the same call gives the same file.
    pub fn simulated_rack<I>(rack: u32, nodes: I) -> Result<Self, TopologyError>
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        let mut topology = Self::default();
        topology.add_simulated_rack(rack, nodes)?;
        Ok(topology)
    }

    /// Add a rack beside those already here (racks with different numbers are
    /// different cliques).
    pub fn add_simulated_rack<I>(&mut self, rack: u32, nodes: I) -> Result<(), TopologyError>
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        let cluster_uuid = simulated_cluster_uuid(rack);
        let mut added = Vec::new();
        for (position, node) in nodes.into_iter().enumerate() {
            let node: String = node.into();
            if self.nodes.contains_key(&node) {
                // Leave the topology as it was: half a rack is no use to anyone.
                for name in added {
                    self.nodes.remove(&name);
                }
                return Err(TopologyError::DuplicateNode { node });
            }
            let gpus = (0..GPUS_PER_SIMULATED_NODE)
                .map(|index| GpuInfo {
                    index,
                    uuid: format!("GPU-{rack:08x}-0000-4000-8000-{position:08x}{index:04x}"),
                    name: FAKE_GPU_NAME.into(),
                    pci_bus_id: format!("{:08X}:01:00.0", SIMULATED_PCI_DOMAINS[index as usize]),
                    fabric: FabricInfo::registered(cluster_uuid.clone(), rack),
                })
                .collect();
            self.nodes.insert(
                node.clone(),
                NodeGpus {
                    driver_version: FAKE_DRIVER_VERSION.into(),
                    gpus,
                },
            );
            added.push(node);
        }
        Ok(())
    }

    /// The clique every node of simulated rack `rack` is in.
    pub fn simulated_clique(rack: u32) -> CliqueId {
        CliqueId(format!("{}.{rack}", simulated_cluster_uuid(rack)))
    }

    /// The GPUs of `node`, if the topology has it.
    pub fn node(&self, node: &str) -> Option<&NodeGpus> {
        self.nodes.get(node)
    }

    /// Registers every GPU of `node` in simulated rack `rack`'s clique, as a fabric
    /// that registered again elsewhere would; false if there is no such node.
    pub fn move_to_simulated_rack(&mut self, node: &str, rack: u32) -> bool {
        let Some(gpus) = self.nodes.get_mut(node) else {
            return false;
        };
        for gpu in &mut gpus.gpus {
            gpu.fabric = FabricInfo::registered(simulated_cluster_uuid(rack), rack);
        }
        true
    }

    /// What makes the file unusable, said so that its author can fix it. GPUs that
    /// disagree on their clique are allowed: that is a state to test, not a typo.
    fn check(&self) -> Result<(), String> {
        let mut owners: HashMap<&str, &str> = HashMap::new();
        for (node, gpus) in &self.nodes {
            if node.is_empty() {
                return Err("a node has an empty name".into());
            }
            let mut indexes = HashSet::new();
            for gpu in &gpus.gpus {
                let at = format!("GPU {} of node {node:?}", gpu.index);
                if !indexes.insert(gpu.index) {
                    return Err(format!(
                        "{at} appears twice: GPU indexes are unique per node"
                    ));
                }
                if gpu.uuid.is_empty() {
                    return Err(format!("{at} has an empty uuid"));
                }
                if let Some(other) = owners.insert(&gpu.uuid, node) {
                    return Err(format!(
                        "GPU uuid {:?} is on node {other:?} and node {node:?}: a GPU is in one node",
                        gpu.uuid
                    ));
                }
                check_fabric(&gpu.fabric).map_err(|problem| format!("{at}: {problem}"))?;
            }
        }
        Ok(())
    }
}

fn check_fabric(fabric: &FabricInfo) -> Result<(), String> {
    if !fabric.cluster_uuid.is_empty() && !is_cluster_uuid(&fabric.cluster_uuid) {
        return Err(format!(
            "clusterUuid {:?} is not a lowercase hyphenated UUID (like \
             6d2c1b7e-0a4f-4e4b-9d53-2f8f5c3a9b10)",
            fabric.cluster_uuid
        ));
    }
    if fabric.state == FabricState::Completed
        && fabric.error.is_none()
        && fabric.cluster_uuid.is_empty()
    {
        return Err(
            "fabric state completed needs a clusterUuid (or an error saying why registration \
             failed)"
                .into(),
        );
    }
    if fabric.state != FabricState::Completed && fabric.error.is_some() {
        return Err(format!(
            "an error goes with fabric state completed only, not {}",
            fabric.state
        ));
    }
    Ok(())
}

fn simulated_cluster_uuid(rack: u32) -> String {
    format!("{rack:08x}-d0a1-4000-8000-000000000000")
}

/// FAKE inventory: one node's GPUs from a topology file, for machines without GPUs.
///
/// The file is read again on every call, so a test or the chaos harness can change a
/// node's GPUs (a fabric failing, a GPU leaving its clique) by rewriting it with
/// [`Topology::write`].
#[derive(Debug, Clone)]
pub struct TopologyInventory {
    path: PathBuf,
    node: String,
}

impl TopologyInventory {
    /// The inventory of `node` in the file at `path`; fails now, not at the first
    /// call, if the file is unusable or lacks the node.
    pub fn open(path: impl Into<PathBuf>, node: impl Into<String>) -> Result<Self, TopologyError> {
        let inventory = Self {
            path: path.into(),
            node: node.into(),
        };
        inventory.read()?;
        Ok(inventory)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    fn read(&self) -> Result<NodeGpus, TopologyError> {
        let mut topology = Topology::load(&self.path)?;
        topology
            .nodes
            .remove(&self.node)
            .ok_or_else(|| TopologyError::UnknownNode {
                path: self.path.clone(),
                node: self.node.clone(),
                known: if topology.nodes.is_empty() {
                    "no nodes".into()
                } else {
                    format!("{:?}", topology.nodes.keys().collect::<Vec<_>>())
                },
            })
    }
}

impl GpuInventory for TopologyInventory {
    fn inventory(&self) -> Result<NodeGpus, GpuError> {
        Ok(self.read()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: &str = "6d2c1b7e-0a4f-4e4b-9d53-2f8f5c3a9b10";

    fn names(count: usize) -> Vec<String> {
        (0..count).map(|i| format!("gb200-{i:02}")).collect()
    }

    fn write_text(dir: &Path, text: &str) -> PathBuf {
        let path = dir.join("topology.json");
        fs::write(&path, text).unwrap();
        path
    }

    fn load_text(text: &str) -> Result<Topology, TopologyError> {
        let dir = tempfile::tempdir().unwrap();
        Topology::load(&write_text(dir.path(), text))
    }

    #[test]
    fn a_simulated_rack_is_one_clique_of_four_gpu_nodes() {
        let rack = Topology::simulated_rack(7, names(18)).unwrap();
        assert_eq!(rack.nodes.len(), 18);
        let mut uuids = HashSet::new();
        for node in names(18) {
            let gpus = rack.node(&node).unwrap();
            assert_eq!(gpus.driver_version, FAKE_DRIVER_VERSION);
            assert_eq!(gpus.gpus.len(), GPUS_PER_SIMULATED_NODE as usize);
            assert_eq!(gpus.clique().unwrap(), Topology::simulated_clique(7));
            for (i, gpu) in gpus.gpus.iter().enumerate() {
                assert_eq!(gpu.index as usize, i);
                assert_eq!(gpu.name, FAKE_GPU_NAME);
                assert!(gpu.uuid.starts_with("GPU-"), "{}", gpu.uuid);
                assert!(uuids.insert(gpu.uuid.clone()), "{} twice", gpu.uuid);
            }
            let buses: Vec<&str> = gpus.gpus.iter().map(|g| g.pci_bus_id.as_str()).collect();
            assert_eq!(
                buses,
                [
                    "00000008:01:00.0",
                    "00000009:01:00.0",
                    "00000018:01:00.0",
                    "00000019:01:00.0"
                ]
            );
        }
        assert!(rack.check().is_ok());
    }

    #[test]
    fn simulated_racks_are_deterministic_and_racks_differ() {
        let a = Topology::simulated_rack(1, names(3)).unwrap();
        assert_eq!(a, Topology::simulated_rack(1, names(3)).unwrap());
        assert_ne!(Topology::simulated_clique(1), Topology::simulated_clique(2));
        assert!(Topology::simulated_clique(1).has_fabric());

        let mut two = Topology::simulated_rack(1, ["a-0", "a-1"]).unwrap();
        two.add_simulated_rack(2, ["b-0", "b-1"]).unwrap();
        assert_eq!(
            two.node("a-1").unwrap().clique(),
            Ok(Topology::simulated_clique(1))
        );
        assert_eq!(
            two.node("b-0").unwrap().clique(),
            Ok(Topology::simulated_clique(2))
        );
        // Node positions repeat across racks; GPU UUIDs must not.
        assert!(two.check().is_ok(), "{:?}", two.check());
    }

    #[test]
    fn a_duplicate_node_leaves_the_topology_as_it_was() {
        let mut topology = Topology::simulated_rack(1, ["a", "b"]).unwrap();
        let before = topology.clone();
        let error = topology
            .add_simulated_rack(2, ["c", "d", "a", "e"])
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("node \"a\" is in the topology twice")
        );
        assert_eq!(topology, before);
        assert!(Topology::simulated_rack(1, ["x", "x"]).is_err());
    }

    #[test]
    fn a_written_rack_loads_back_and_serves_each_node() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rack.json");
        let rack = Topology::simulated_rack(3, names(4)).unwrap();
        rack.write(&path).unwrap();
        assert_eq!(Topology::load(&path).unwrap(), rack);
        assert!(!dir.path().join("rack.json.partial").exists());
        for node in names(4) {
            let inventory = TopologyInventory::open(&path, &node).unwrap();
            assert_eq!(inventory.node(), node);
            assert_eq!(inventory.path(), path);
            assert_eq!(&inventory.inventory().unwrap(), rack.node(&node).unwrap());
            assert_eq!(inventory.clique().unwrap(), Topology::simulated_clique(3));
        }
    }

    #[test]
    fn a_node_moved_to_another_rack_is_read_in_its_clique_at_the_next_call() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rack.json");
        let mut topology = Topology::simulated_rack(1, ["a-0", "a-1"]).unwrap();
        topology.add_simulated_rack(2, ["b-0"]).unwrap();
        topology.write(&path).unwrap();
        let inventory = TopologyInventory::open(&path, "a-1").unwrap();
        assert_eq!(inventory.clique().unwrap(), Topology::simulated_clique(1));

        assert!(topology.move_to_simulated_rack("a-1", 2));
        assert!(!topology.move_to_simulated_rack("nobody", 2));
        topology.write(&path).unwrap();
        assert_eq!(inventory.clique().unwrap(), Topology::simulated_clique(2));
        // Its GPUs keep their identity: only the fabric moved.
        assert_eq!(
            Topology::load(&path).unwrap().node("a-1").unwrap().gpus[0].uuid,
            Topology::simulated_rack(1, ["a-0", "a-1"]).unwrap().nodes["a-1"].gpus[0].uuid
        );
    }

    #[test]
    fn a_hand_written_file_may_leave_fabric_out() {
        let topology = load_text(
            r#"{ "nodes": {
                "h100": { "driverVersion": "570.86.15", "gpus": [
                    { "index": 0, "uuid": "GPU-1", "name": "NVIDIA H100 80GB HBM3",
                      "pciBusId": "00000000:19:00.0" } ] },
                "cpu-only": { "driverVersion": "570.86.15", "gpus": [] },
                "gb200": { "driverVersion": "570.86.15", "gpus": [
                    { "index": 0, "uuid": "GPU-2", "name": "NVIDIA GB200",
                      "pciBusId": "00000008:01:00.0",
                      "fabric": { "state": "completed",
                                  "clusterUuid": "6d2c1b7e-0a4f-4e4b-9d53-2f8f5c3a9b10",
                                  "cliqueId": 32766 } } ] } } }"#,
        )
        .unwrap();
        let h100 = topology.node("h100").unwrap();
        assert_eq!(h100.gpus[0].fabric, FabricInfo::not_supported());
        assert_eq!(h100.clique(), Ok(CliqueId::default()));
        assert_eq!(
            topology.node("cpu-only").unwrap().clique(),
            Ok(CliqueId::default())
        );
        assert_eq!(
            topology.node("gb200").unwrap().clique(),
            Ok(CliqueId(format!("{CLUSTER}.32766")))
        );
    }

    #[test]
    fn gpus_that_disagree_load_and_fail_at_the_clique() {
        let mut topology = Topology::simulated_rack(1, ["n"]).unwrap();
        topology.nodes.get_mut("n").unwrap().gpus[3]
            .fabric
            .clique_id = 99;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        topology.write(&path).unwrap();
        let inventory = TopologyInventory::open(&path, "n").unwrap();
        let error = inventory.clique().unwrap_err();
        assert!(matches!(error, GpuError::Clique(_)), "{error}");
        assert!(error.to_string().contains("GPU 3"), "{error}");
    }

    #[test]
    fn the_file_is_read_again_on_every_call() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        let mut topology = Topology::simulated_rack(1, ["n"]).unwrap();
        topology.write(&path).unwrap();
        let inventory = TopologyInventory::open(&path, "n").unwrap();
        assert!(inventory.clique().unwrap().has_fabric());

        for gpu in &mut topology.nodes.get_mut("n").unwrap().gpus {
            gpu.fabric.state = FabricState::InProgress;
        }
        topology.write(&path).unwrap();
        let error = inventory.clique().unwrap_err();
        assert!(error.is_transient(), "{error}");

        fs::remove_file(&path).unwrap();
        assert!(matches!(
            inventory.inventory(),
            Err(GpuError::Topology(TopologyError::Read { .. }))
        ));
    }

    #[test]
    fn a_missing_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.json");
        let message = TopologyInventory::open(&path, "n").unwrap_err().to_string();
        assert!(
            message.starts_with(&format!(
                "cannot read the GPU topology file {}",
                path.display()
            )),
            "{message}"
        );
    }

    #[test]
    fn a_missing_node_is_named_with_those_the_file_has() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        Topology::simulated_rack(1, ["a", "b"])
            .unwrap()
            .write(&path)
            .unwrap();
        let message = TopologyInventory::open(&path, "c").unwrap_err().to_string();
        assert!(
            message.contains("node \"c\" is not in the GPU topology file"),
            "{message}"
        );
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains(r#"it has ["a", "b"]"#), "{message}");

        Topology::default().write(&path).unwrap();
        let message = TopologyInventory::open(&path, "c").unwrap_err().to_string();
        assert!(message.contains("it has no nodes"), "{message}");
    }

    #[test]
    fn parse_errors_name_the_file_and_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        for (text, expected) in [
            ("{ \"nodes\": ", "EOF while parsing"),
            ("\"rack\"", "invalid type: string"),
            (r#"{ "node": {} }"#, "unknown field `node`"),
            (
                r#"{ "nodes": { "n": { "gpus": [] } } }"#,
                "missing field `driverVersion`",
            ),
            (
                r#"{ "nodes": { "n": { "driverVersion": "1", "gpus": [
                    { "index": 0, "uuid": "GPU-1", "name": "x", "pciBusId": "y",
                      "fabric": { "state": "done" } } ] } } }"#,
                "unknown variant `done`",
            ),
            (
                r#"{ "nodes": { "n": { "driverVersion": "1", "gpus": [
                    { "index": 0, "uuid": "GPU-1", "name": "x", "pciBusId": "y",
                      "fabric": { "state": "completed", "cluster": "z" } } ] } } }"#,
                "unknown field `cluster`",
            ),
        ] {
            let path = write_text(dir.path(), text);
            let error = Topology::load(&path).unwrap_err();
            let message = error.to_string();
            assert!(matches!(error, TopologyError::Parse { .. }), "{message}");
            assert!(
                message.starts_with(&format!("the GPU topology file {}", path.display())),
                "{message}"
            );
            assert!(message.contains(expected), "{text}: {message}");
            assert!(message.contains("line"), "{message}");
        }
    }

    fn one_gpu(fabric: &str) -> String {
        format!(
            r#"{{ "nodes": {{ "n": {{ "driverVersion": "1", "gpus": [
                {{ "index": 0, "uuid": "GPU-1", "name": "x", "pciBusId": "y",
                   "fabric": {fabric} }} ] }} }} }}"#
        )
    }

    #[test]
    fn invalid_content_is_named_by_node_and_gpu() {
        let cases = [
            (
                one_gpu(
                    r#"{ "state": "completed", "clusterUuid": "6D2C1B7E-0A4F-4E4B-9D53-2F8F5C3A9B10" }"#,
                ),
                "GPU 0 of node \"n\": clusterUuid \"6D2C1B7E-0A4F-4E4B-9D53-2F8F5C3A9B10\" is not a lowercase hyphenated UUID",
            ),
            (
                one_gpu(r#"{ "state": "completed" }"#),
                "GPU 0 of node \"n\": fabric state completed needs a clusterUuid",
            ),
            (
                one_gpu(r#"{ "state": "inProgress", "error": "Unknown Error" }"#),
                "an error goes with fabric state completed only, not in progress",
            ),
            (
                r#"{ "nodes": { "n": { "driverVersion": "1", "gpus": [
                    { "index": 0, "uuid": "GPU-1", "name": "x", "pciBusId": "y" },
                    { "index": 0, "uuid": "GPU-2", "name": "x", "pciBusId": "z" } ] } } }"#
                    .to_owned(),
                "GPU 0 of node \"n\" appears twice",
            ),
            (
                r#"{ "nodes": {
                    "m": { "driverVersion": "1", "gpus": [
                        { "index": 0, "uuid": "GPU-1", "name": "x", "pciBusId": "y" } ] },
                    "n": { "driverVersion": "1", "gpus": [
                        { "index": 0, "uuid": "GPU-1", "name": "x", "pciBusId": "y" } ] } } }"#
                    .to_owned(),
                "GPU uuid \"GPU-1\" is on node \"m\" and node \"n\"",
            ),
            (
                r#"{ "nodes": { "n": { "driverVersion": "1", "gpus": [
                    { "index": 0, "uuid": "", "name": "x", "pciBusId": "y" } ] } } }"#
                    .to_owned(),
                "GPU 0 of node \"n\" has an empty uuid",
            ),
            (
                r#"{ "nodes": { "": { "driverVersion": "1", "gpus": [] } } }"#.to_owned(),
                "a node has an empty name",
            ),
        ];
        for (text, expected) in cases {
            let error = load_text(&text).unwrap_err();
            let message = error.to_string();
            assert!(matches!(error, TopologyError::Invalid { .. }), "{message}");
            assert!(
                message.contains("topology.json is not valid: "),
                "{message}"
            );
            assert!(message.contains(expected), "{expected}\n{message}");
        }
        // A failed registration needs no cluster.
        load_text(&one_gpu(
            r#"{ "state": "completed", "error": "Unknown Error" }"#,
        ))
        .unwrap();
    }

    #[test]
    fn writing_where_no_directory_can_be_made_is_named() {
        let dir = tempfile::tempdir().unwrap();
        // A missing directory is made; one under a regular file cannot be.
        fs::write(dir.path().join("a-file"), b"").unwrap();
        let path = dir.path().join("a-file").join("t.json");
        let message = Topology::default().write(&path).unwrap_err().to_string();
        assert!(
            message.starts_with(&format!(
                "cannot write the GPU topology file {}",
                path.display()
            )),
            "{message}"
        );
    }
}
