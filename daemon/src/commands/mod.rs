//! One module per subcommand.

mod certs;
pub mod gpus;
mod imex;
mod kubelet_sim;
pub mod migrate;
mod topology;

use crate::cli::Command;

pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Bench(bench) => crate::bench::run(bench),
        Command::Certs(certs) => certs::run(certs),
        Command::Controller(args) => domaind_controller::run(*args),
        Command::Crdgen => {
            print!("{}", domaind_kube_api::crd::crd_yaml());
            Ok(())
        }
        Command::Demo(args) => crate::demo::run(args),
        Command::Gpus(args) => gpus::run(args),
        Command::ImexRunner { socket } => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(domaind_imex::runner::run(&socket)),
        Command::Imex(command) => imex::run(command),
        Command::KubeletSim(command) => kubelet_sim::run(command),
        Command::Migrate(args) => migrate::run(args),
        Command::Run(args) => domaind_node::run::run(*args),
        Command::Topology(topology) => topology::run(topology),
        Command::ImexSim { .. } | Command::ImexGuard { .. } => {
            unreachable!("dispatched before logging starts")
        }
    }
}
