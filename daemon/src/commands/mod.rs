//! One module per subcommand.

mod certs;
mod kubelet_sim;
mod topology;

use crate::cli::Command;

pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Certs(certs) => certs::run(certs),
        Command::Controller(args) => domaind::controller::run(*args),
        Command::Crdgen => {
            print!("{}", domaind::crd::crd_yaml());
            Ok(())
        }
        Command::Demo(args) => domaind::demo::run(args),
        Command::KubeletSim(command) => kubelet_sim::run(command),
        Command::Run(args) => domaind::run::run(*args),
        Command::Topology(topology) => topology::run(topology),
        Command::ImexSim { .. } => unreachable!("dispatched before logging starts"),
    }
}
