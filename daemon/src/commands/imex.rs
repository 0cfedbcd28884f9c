//! `domaind imex`: acting on this node's IMEX daemon from the command line.

use domaind_imex::processes::{kill_imex_daemons, killed_line};

use crate::cli::ImexCommand;

pub fn run(command: ImexCommand) -> anyhow::Result<()> {
    match command {
        ImexCommand::Kill { parent } => {
            for killed in kill_imex_daemons(parent)? {
                println!("{}", killed_line(&killed));
            }
            Ok(())
        }
    }
}
