//! What a chaos harness needs beyond starting and stopping daemons: a graceful stop it
//! can watch instead of wait on, the IMEX daemon of a node (to crash it alone, or take
//! its port), and certificates reissued from the rack's CA (to rotate them under a
//! running daemon).

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use domaind_gossip::NodeName;
use domaind_gossip::pki::{DevCa, NodeCertRequest};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use super::LocalRack;
use domaind_imex::processes::is_imex_daemon;
use domaind_imex::procfs::processes;

/// Where, under the rack's root, its CA (certificate and key) is kept.
pub(super) const CA_DIR: &str = "ca";

/// Tries at taking a node's IMEX port, and how long each waits for it to be free.
const TAKE_TRIES: usize = 5;
const TAKE_WAIT: Duration = Duration::from_secs(1);

impl LocalRack {
    /// The rack's CA: `ca.crt` and `ca.key`.
    pub fn ca_dir(&self) -> PathBuf {
        self.spec.root.join(CA_DIR)
    }

    /// Issues node `index` a new certificate and key from the rack's CA, written over
    /// its TLS directory as a certificate manager would; the daemon picks them up on
    /// its next reload, without a restart.
    pub fn reissue_certificate(
        &self,
        index: usize,
        valid_for: time::Duration,
    ) -> anyhow::Result<()> {
        let node = &self.nodes[index];
        let ca = DevCa::load(&self.ca_dir()).context("cannot load the rack's CA")?;
        let name = NodeName::new(node.name()).context("rack node name")?;
        ca.issue(&NodeCertRequest::new(name, valid_for))
            .and_then(|cert| cert.write(&node.dir().join("tls")))
            .with_context(|| format!("cannot reissue {}'s certificate", node.name()))?;
        Ok(())
    }

    /// IMEX's server and command ports, the same on every node's address.
    pub fn imex_ports(&self) -> (u16, u16) {
        (self.imex_port, self.imex_cmd_port)
    }

    /// Takes node `index`'s IMEX server port, as another process grabbing it would:
    /// SIGKILLs its IMEX daemon and listens on the port before domaind's restart (after
    /// its backoff, at least 200 ms) can. The port stays taken while the listener
    /// lives. Tries a few times, each bounded; `killed` counts the IMEX daemons it
    /// killed, whether or not it got the port.
    pub fn take_imex_port(
        &mut self,
        index: usize,
        killed: &mut u32,
    ) -> anyhow::Result<TcpListener> {
        let addr = SocketAddr::new(self.nodes[index].ip(), self.imex_port);
        for _ in 0..TAKE_TRIES {
            if let Ok(listener) = TcpListener::bind(addr) {
                return Ok(listener);
            }
            for pid in std::mem::take(&mut self.imex_daemons()?[index]) {
                if kill(Pid::from_raw(pid as i32), Signal::SIGKILL).is_ok() {
                    *killed += 1;
                }
            }
            let deadline = Instant::now() + TAKE_WAIT;
            while Instant::now() < deadline {
                if let Ok(listener) = TcpListener::bind(addr) {
                    return Ok(listener);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        anyhow::bail!(
            "could not take {addr} from {}'s IMEX daemon",
            self.nodes[index].name()
        )
    }

    /// SIGKILL to node `index`'s `domaind` alone, not its process group, as a
    /// supervisor that signals only the main process does; returns once it is reaped.
    /// What it started must die with it by itself.
    pub fn kill_daemon_only(&mut self, index: usize) -> anyhow::Result<()> {
        self.nodes[index].kill_process()
    }

    /// SIGTERM to node `index`, without waiting for it to exit (see [`Self::running`]).
    /// Its exit is not counted as unexpected.
    pub fn begin_stop(&mut self, index: usize) -> anyhow::Result<()> {
        self.nodes[index].begin_stop()
    }

    /// Whether node `index`'s daemon is alive (reaping it if it exited).
    pub fn running(&mut self, index: usize) -> bool {
        self.nodes[index].running()
    }

    /// Sends `signal` to node `index`'s process group and to its IMEX daemon's, which
    /// is a group of its own, if it runs: SIGSTOP and SIGCONT pause and resume the
    /// whole "container". Stopped, domaind starts no daemon the pass over /proc could
    /// miss; resumed after its daemon, it finds it answering.
    pub fn signal_group(&mut self, index: usize, signal: Signal) -> anyhow::Result<()> {
        if signal != Signal::SIGCONT {
            self.nodes[index].signal_group(signal)?;
        }
        if let Some(pid) = self.nodes[index]
            .pid()
            .filter(|_| self.nodes[index].running())
        {
            for process in processes()? {
                if process.parent == pid && is_imex_daemon(&process.args) {
                    let imex = Pid::from_raw(process.pid as i32);
                    // A daemon started without a group of its own is in domaind's.
                    if killpg(imex, signal).is_err() {
                        let _ = kill(imex, signal);
                    }
                }
            }
        }
        if signal == Signal::SIGCONT {
            self.nodes[index].signal_group(signal)?;
        }
        Ok(())
    }

    /// For every node, the pids of its IMEX daemon: children of its `domaind` (or of its
    /// IMEX runner) that run the daemon (`... -c CONFIG`), not a status query (`... ctl
    /// ...`). Normally one;
    /// none while the node or its IMEX daemon is down. One pass over /proc (Linux).
    pub fn imex_daemons(&mut self) -> anyhow::Result<Vec<Vec<u32>>> {
        // Its domaind, or its IMEX runner when it has one.
        let parents: Vec<[Option<u32>; 2]> = self
            .nodes
            .iter_mut()
            .map(|node| [node.pid().filter(|_| node.running()), node.runner_pid()])
            .collect();
        let mut found = vec![Vec::new(); parents.len()];
        for process in processes()? {
            if !is_imex_daemon(&process.args) {
                continue;
            }
            if let Some(index) = parents
                .iter()
                .position(|p| p.contains(&Some(process.parent)))
            {
                found[index].push(process.pid);
            }
        }
        Ok(found)
    }
}
