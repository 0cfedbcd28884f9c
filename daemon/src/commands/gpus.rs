//! `domaind gpus`: what this node's GPUs say about NVLink, read as `domaind run` reads
//! them, and the clique the node joins. For an operator asking why a node's daemon
//! gossips with nobody or waits for its clique (`kubectl exec` into the node daemon's
//! container, whose image has no shell and no nvidia-smi).

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use domaind_gpu::{FabricState, NodeGpus};
use serde::Serialize;

#[derive(Debug, Args)]
pub struct GpusArgs {
    /// The NVML library to load, as `domaind run --nvml-library` takes it.
    #[arg(long, env = "DOMAIND_NVML_LIBRARY", default_value = domaind_gpu::DEFAULT_NVML_LIBRARY)]
    pub nvml_library: PathBuf,
    /// Where the host's driver files are mounted, as `domaind run --driver-root`.
    #[arg(long, env = "DOMAIND_DRIVER_ROOT", default_value = domaind_gpu::DEFAULT_DRIVER_ROOT)]
    pub driver_root: PathBuf,
    /// A FAKE topology file instead of NVML (with --node-name), as `domaind run` takes it.
    #[arg(long, env = "DOMAIND_GPU_TOPOLOGY", requires = "node_name")]
    pub gpu_topology: Option<PathBuf>,
    /// The node's entry in --gpu-topology.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// What `--output json` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpusReport {
    #[serde(flatten)]
    pub inventory: NodeGpus,
    /// `<clusterUUID>.<cliqueId>`; empty when no GPU is registered with a fabric (the
    /// node joins no clique); absent when it is not known (`cliqueError` says why).
    pub clique: Option<String>,
    /// Why the clique is not known, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clique_error: Option<String>,
    /// Whether asking again later may give a clique (a registration under way).
    pub transient: bool,
}

impl GpusReport {
    pub fn of(inventory: NodeGpus) -> Self {
        let (clique, clique_error, transient) = match inventory.clique() {
            Ok(clique) => (Some(clique.to_string()), None, false),
            Err(error) => {
                let transient = error.is_transient();
                (None, Some(error.to_string()), transient)
            }
        };
        Self {
            inventory,
            clique,
            clique_error,
            transient,
        }
    }

    /// 0: the clique is known (none is an answer); 1: it is not.
    pub fn exit_code(&self) -> i32 {
        if self.clique.is_some() { 0 } else { 1 }
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "driver {}, {} GPU(s)",
            self.inventory.driver_version,
            self.inventory.gpus.len()
        );
        let _ = writeln!(
            out,
            "{:<4} {:<41} {:<24} {:<17} {:<14} {:<37} {:<6} ERROR",
            "GPU", "UUID", "NAME", "PCI BUS ID", "FABRIC", "CLUSTER UUID", "CLIQUE"
        );
        for gpu in &self.inventory.gpus {
            let registered = gpu.fabric.state == FabricState::Completed;
            let _ = writeln!(
                out,
                "{:<4} {:<41} {:<24} {:<17} {:<14} {:<37} {:<6} {}",
                gpu.index,
                gpu.uuid,
                gpu.name,
                gpu.pci_bus_id,
                gpu.fabric.state.to_string(),
                if registered && !gpu.fabric.cluster_uuid.is_empty() {
                    gpu.fabric.cluster_uuid.as_str()
                } else {
                    "-"
                },
                if registered {
                    gpu.fabric.clique_id.to_string()
                } else {
                    "-".to_string()
                },
                gpu.fabric.error.as_deref().unwrap_or("-")
            );
        }
        match (&self.clique, &self.clique_error) {
            (Some(clique), _) if !clique.is_empty() => {
                let _ = writeln!(
                    out,
                    "clique {clique}: the node gossips with the daemons of this clique and \
                     forms ComputeDomains with them"
                );
            }
            (Some(_), _) => {
                let _ = writeln!(
                    out,
                    "no clique: no GPU has completed an NVLink fabric registration, so the \
                     node's daemon gossips with nobody and joins no multi-node IMEX domain \
                     (expected without NVSwitch; on a GB200/GB300 node see the FABRIC and \
                     ERROR columns, and `nvidia-smi -q`, section Fabric)"
                );
            }
            (None, error) => {
                let _ = writeln!(
                    out,
                    "clique unknown: {}{}",
                    error.as_deref().unwrap_or("no answer"),
                    if self.transient {
                        " (a registration under way: `domaind run` waits for it)"
                    } else {
                        ""
                    }
                );
            }
        }
        out
    }
}

pub fn run(args: GpusArgs) -> anyhow::Result<()> {
    let inventory = domaind_gpu::open_inventory(
        args.gpu_topology.as_deref(),
        args.node_name.as_deref().unwrap_or_default(),
        &args.nvml_library,
        &args.driver_root,
    )?;
    let report = GpusReport::of(inventory.inventory()?);
    match args.output {
        Output::Text => print!("{}", report.text()),
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    std::process::exit(report.exit_code())
}

#[cfg(test)]
mod tests {
    use domaind_gpu::{FabricInfo, GpuInfo};

    use super::*;

    const CLUSTER: &str = "6d2c1b7e-0a4f-4e4b-9d53-2f8f5c3a9b10";

    fn node(fabrics: Vec<FabricInfo>) -> NodeGpus {
        NodeGpus {
            driver_version: "580.159.04".into(),
            gpus: fabrics
                .into_iter()
                .enumerate()
                .map(|(i, fabric)| GpuInfo {
                    index: i as u32,
                    uuid: format!("GPU-{i:08}-0000-0000-0000-000000000000"),
                    name: "NVIDIA GB200".into(),
                    pci_bus_id: format!("00000000:{:02X}:00.0", i + 1),
                    fabric,
                })
                .collect(),
        }
    }

    #[test]
    fn a_registered_node_names_its_clique() {
        let report = GpusReport::of(node(vec![FabricInfo::registered(CLUSTER, 7); 4]));
        assert_eq!(
            report.clique.as_deref(),
            Some(format!("{CLUSTER}.7").as_str())
        );
        assert_eq!(report.exit_code(), 0);
        let text = report.text();
        assert!(text.starts_with("driver 580.159.04, 4 GPU(s)\n"), "{text}");
        assert_eq!(text.matches(CLUSTER).count(), 5, "{text}");
        assert!(text.contains(&format!("clique {CLUSTER}.7: ")), "{text}");
    }

    #[test]
    fn a_node_without_fabric_has_no_clique_and_that_is_an_answer() {
        let report = GpusReport::of(node(vec![FabricInfo::not_supported()]));
        assert_eq!(report.clique.as_deref(), Some(""));
        assert_eq!(report.exit_code(), 0);
        let text = report.text();
        assert!(text.contains("not supported"), "{text}");
        assert!(text.contains("no clique: no GPU has completed"), "{text}");
    }

    #[test]
    fn gpus_that_disagree_or_are_still_registering_leave_the_clique_unknown() {
        let disagree = GpusReport::of(node(vec![
            FabricInfo::registered(CLUSTER, 7),
            FabricInfo::registered(CLUSTER, 8),
        ]));
        assert_eq!(disagree.clique, None);
        assert!(!disagree.transient);
        assert_eq!(disagree.exit_code(), 1);
        assert!(
            disagree
                .text()
                .contains("clique unknown: the GPUs of this node report different")
        );

        let registering = GpusReport::of(node(vec![FabricInfo {
            state: FabricState::InProgress,
            ..FabricInfo::not_supported()
        }]));
        assert!(registering.transient, "{registering:?}");
        assert_eq!(registering.exit_code(), 1);
        assert!(registering.text().contains("`domaind run` waits for it"));
        let json = serde_json::to_value(&registering).unwrap();
        assert_eq!(json["clique"], serde_json::Value::Null);
        assert_eq!(json["gpus"][0]["fabric"]["state"], "inProgress");
        assert_eq!(json["driverVersion"], "580.159.04");
    }
}
