//! `domaind topology`: fake GPU topologies for machines without GPUs.

use anyhow::Context;
use domaind_gpu::Topology;

use crate::cli::TopologyCommand;

pub fn run(command: TopologyCommand) -> anyhow::Result<()> {
    match command {
        TopologyCommand::Simulate { nodes, rack, out } => {
            let count = nodes.len();
            let topology = Topology::simulated_rack(rack, nodes.iter().map(|n| n.to_string()))?;
            topology
                .write(&out)
                .with_context(|| format!("cannot write {}", out.display()))?;
            println!(
                "FAKE topology of {count} nodes in clique {} written to {}",
                Topology::simulated_clique(rack),
                out.display()
            );
            Ok(())
        }
    }
}
