//! A rack on loopback: N `domaind run` processes on 127.0.0.x, each with its own
//! certificates, `imex-sim`, a fake GPU topology of one or more cliques and the local
//! backend. The demo, the chaos harness and the end-to-end tests run the product
//! through it.
//!
//! With K cliques the nodes are split in contiguous blocks (node i is in clique
//! `i * K / N`, so block sizes differ by one at most): the first nodes are clique 0
//! whatever K is, which lets a caller treat them as a rack of their own. Each node's
//! GPUs report its block's clique and its `--seed` list names only its clique-mates,
//! as the kube backend's clique-scoped discovery does.
//!
//! Every node gets its own loopback address, so the IMEX port can be the same on all
//! of them, as IMEX requires; gossip and HTTP ports are chosen by the OS, the IMEX
//! ports outside the OS's ephemeral range ([`imex_ports`]).

mod control;
mod imports;
pub use imports::HeldImport;
pub mod cpu;
pub mod imex_ports;
mod node;
pub mod ports;
mod probe;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use domaind_gossip::NodeName;
use domaind_gossip::pki::{DevCa, NodeCertRequest};

pub use node::RackNode;

pub use probe::{PrepareAnswer, http_get, http_get_over, node_view, prepare_until_ready};

use domaind_actors::model::CliqueId;
use domaind_backends::local::LocalDir;
use domaind_gpu::Topology;
use domaind_node::run::RunInfo;

/// A made-up major for `nvidia-caps-imex-channels`: machines without the driver have
/// none, and the CDI specs need one.
pub const FAKE_IMEX_CHANNELS_MAJOR: u32 = 511;

/// What rack to run.
#[derive(Debug, Clone)]
pub struct RackSpec {
    /// Nodes in the rack, every clique together.
    pub nodes: usize,
    /// NVLink cliques the nodes are split into, 1 to `nodes`.
    pub cliques: usize,
    /// Nodes get 127.0.<subnet>.1, .2, ...: racks with different subnets can run side
    /// by side.
    pub subnet: u8,
    /// The `domaind` binary.
    pub domaind: PathBuf,
    /// The `imex-sim` binary; `None` runs the simulator built into `domaind`.
    pub imex_sim: Option<PathBuf>,
    /// Everything of the rack lives here (keep the path short: unix socket paths are
    /// limited to 107 bytes).
    pub root: PathBuf,
    pub gossip_interval: Duration,
    /// Passed to every daemon: `--log`.
    pub log_filter: String,
    /// More `domaind run` flags for every daemon (e.g. `--prepare-deadline 2s`).
    pub extra_args: Vec<String>,
    /// Node names instead of `node-01`...: to pretend to be a cluster's nodes.
    pub names: Option<Vec<String>>,
    /// Loopback addresses instead of 127.0.<subnet>.1...
    pub ips: Option<Vec<IpAddr>>,
    pub backend: RackBackend,
    /// Each node's kubelet root directory (`--root-dir`): the daemon serves
    /// `plugins/<driver>/dra.sock` and `plugins_registry/<driver>-reg.sock` in it, where
    /// a real kubelet looks. `None`: sockets in the node's own directory.
    pub kubelet_dirs: Option<Vec<PathBuf>>,
    /// Environment for every daemon, e.g. `KUBECONFIG` of a ServiceAccount.
    pub env: Vec<(String, String)>,
    /// Environment for daemon `i` only, after `env`: e.g. a `KUBECONFIG` whose token is
    /// bound to a pod on node `i`, which the chart's admission policy asks of a node
    /// daemon. Daemons past its end get none.
    pub node_env: Vec<Vec<(String, String)>>,
    /// Every daemon is given the others' gossip addresses (`--seed`); false leaves
    /// seeding to `--seed-discovery` (the API server's, with the Kubernetes backend).
    pub static_seeds: bool,
    /// With static seeds: each daemon's list names every node of the rack, not only
    /// its clique-mates, so that a node whose fabric registers in another clique
    /// ([`LocalRack::register_in_clique`]) can find its new mates. Syns that cross
    /// cliques are dropped by their receivers and counted.
    pub seeds_across_cliques: bool,
    /// Each node's IMEX is kept by an IMEX runner of its own (`domaind imex-runner`,
    /// `run --imex-runner`), a process beside the daemon as a cluster's runner pod is:
    /// killing the daemon leaves IMEX running ([`LocalRack::kill`]); killing the node
    /// takes both ([`LocalRack::kill_node`]).
    pub imex_runner: bool,
}

/// Where the rack's claims come from and status goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RackBackend {
    /// A local backend directory shared by the rack.
    #[default]
    Local,
    /// The Kubernetes API of the `KUBECONFIG` in the environment.
    Kube,
}

impl RackSpec {
    /// The clique (0-based) of node `index`: contiguous blocks.
    pub fn clique_of(&self, index: usize) -> usize {
        index * self.cliques.max(1) / self.nodes.max(1)
    }

    /// The clique id the GPUs of clique `clique` (0-based) report.
    pub fn clique_id(clique: usize) -> CliqueId {
        Topology::simulated_clique(clique as u32 + 1)
    }

    pub fn new(nodes: usize, domaind: PathBuf, imex_sim: PathBuf, root: PathBuf) -> Self {
        Self {
            imex_sim: Some(imex_sim),
            ..Self::self_contained(nodes, domaind, root)
        }
    }

    /// A rack that needs only the `domaind` binary: it runs its built-in simulator.
    pub fn self_contained(nodes: usize, domaind: PathBuf, root: PathBuf) -> Self {
        Self {
            nodes,
            cliques: 1,
            subnet: 0,
            domaind,
            imex_sim: None,
            root,
            gossip_interval: Duration::from_secs(10),
            log_filter: "info".into(),
            extra_args: Vec::new(),
            names: None,
            ips: None,
            backend: RackBackend::Local,
            kubelet_dirs: None,
            env: Vec::new(),
            node_env: Vec::new(),
            static_seeds: true,
            seeds_across_cliques: false,
            imex_runner: false,
        }
    }
}

/// A rack's files and processes. Dropping it kills every daemon it started.
#[derive(Debug)]
pub struct LocalRack {
    spec: RackSpec,
    local: LocalDir,
    imex_port: u16,
    imex_cmd_port: u16,
    nodes: Vec<RackNode>,
}

impl LocalRack {
    /// Writes the rack's files (CA, node certificates, topology, fake /proc/devices);
    /// starts nothing.
    pub fn create(spec: RackSpec) -> anyhow::Result<Self> {
        if spec.nodes == 0 || spec.nodes > 250 {
            bail!("a rack has 1 to 250 nodes, not {}", spec.nodes);
        }
        if spec.cliques == 0 || spec.cliques > spec.nodes {
            bail!(
                "a rack of {} nodes has 1 to {} cliques, not {}",
                spec.nodes,
                spec.nodes,
                spec.cliques
            );
        }
        std::fs::create_dir_all(&spec.root)
            .with_context(|| format!("cannot create {}", spec.root.display()))?;
        let names: Vec<String> = spec
            .names
            .clone()
            .unwrap_or_else(|| (1..=spec.nodes).map(|i| format!("node-{i:02}")).collect());
        let ips: Vec<IpAddr> = spec.ips.clone().unwrap_or_else(|| {
            (1..=spec.nodes)
                .map(|i| IpAddr::from([127, 0, spec.subnet, i as u8]))
                .collect()
        });
        let kubelet_dirs: Vec<Option<PathBuf>> = match &spec.kubelet_dirs {
            Some(dirs) if dirs.len() == spec.nodes => dirs.iter().cloned().map(Some).collect(),
            Some(dirs) => bail!(
                "a rack of {} nodes needs as many kubelet directories, not {}",
                spec.nodes,
                dirs.len()
            ),
            None => vec![None; spec.nodes],
        };
        if names.len() != spec.nodes || ips.len() != spec.nodes {
            bail!(
                "a rack of {} nodes needs as many names and addresses, not {} and {}",
                spec.nodes,
                names.len(),
                ips.len()
            );
        }
        if let Some(ip) = ips.iter().find(|ip| !ip.is_loopback()) {
            bail!("{ip} is not a loopback address: a local rack runs on 127.0.0.0/8 only");
        }

        let ca = DevCa::generate("domaind local rack CA", time::Duration::days(2))
            .context("cannot make the rack's CA")?;
        let topology_path = spec.root.join("topology.json");
        let mut topology = Topology::default();
        for clique in 0..spec.cliques {
            let members = names
                .iter()
                .enumerate()
                .filter(|(i, _)| spec.clique_of(*i) == clique)
                .map(|(_, name)| name.clone());
            // Simulated rack numbers start at 1: one clique is the topology it always was.
            topology
                .add_simulated_rack(clique as u32 + 1, members)
                .context("cannot make the rack's GPU topology")?;
        }
        topology
            .write(&topology_path)
            .context("cannot write the rack's GPU topology")?;
        let proc_devices = spec.root.join("proc-devices");
        std::fs::write(
            &proc_devices,
            format!(
                "Character devices:\n{FAKE_IMEX_CHANNELS_MAJOR} nvidia-caps-imex-channels\n\nBlock devices:\n"
            ),
        )
        .context("cannot write the rack's fake /proc/devices")?;

        let (imex_port, imex_cmd_port) = imex_ports::pick(&ips)?;
        let mut nodes = Vec::new();
        for ((name, ip), kubelet_dir) in names.into_iter().zip(ips).zip(kubelet_dirs) {
            let dir = spec.root.join(&name);
            let node_name = NodeName::new(&name).context("rack node name")?;
            ca.issue(&NodeCertRequest::new(node_name, time::Duration::days(1)))
                .and_then(|cert| cert.write(&dir.join("tls")))
                .with_context(|| format!("cannot issue {name}'s certificate"))?;
            nodes.push(RackNode::new(
                name,
                ip,
                dir,
                ports::free_port(&[ip])?,
                topology_path.clone(),
                proc_devices.clone(),
                kubelet_dir,
            ));
        }
        std::fs::write(spec.root.join("ca.crt"), ca.cert_pem()).context("cannot write ca.crt")?;
        // Kept (mode 0600, removed with the rack) so that certificates can be reissued
        // while the rack runs: the chaos harness rotates them.
        ca.write(&spec.root.join(control::CA_DIR))
            .context("cannot keep the rack's CA")?;
        Ok(Self {
            local: LocalDir::new(spec.root.join("local")),
            spec,
            imex_port,
            imex_cmd_port,
            nodes,
        })
    }

    pub fn spec(&self) -> &RackSpec {
        &self.spec
    }

    pub fn local(&self) -> &LocalDir {
        &self.local
    }

    pub fn nodes(&self) -> &[RackNode] {
        &self.nodes
    }

    pub fn node(&self, index: usize) -> &RackNode {
        &self.nodes[index]
    }

    /// The clique (0-based) of node `index`.
    pub fn clique_of(&self, index: usize) -> usize {
        self.spec.clique_of(index)
    }

    /// The indices of the nodes of clique `clique`, in order.
    pub fn clique_members(&self, clique: usize) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|i| self.clique_of(*i) == clique)
            .collect()
    }

    /// The gossip addresses of node `index`'s clique-mates (or of every other node,
    /// with [`RackSpec::seeds_across_cliques`]): its seeds (none without static seeds).
    fn seeds_for(&self, index: usize) -> Vec<String> {
        if !self.spec.static_seeds {
            return Vec::new();
        }
        let clique = self.clique_of(index);
        self.nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| {
                *i != index && (self.spec.seeds_across_cliques || self.clique_of(*i) == clique)
            })
            .map(|(_, n)| SocketAddr::new(n.ip(), n.gossip_port()).to_string())
            .collect()
    }

    /// Node `index`'s GPUs register with the fabric again, in clique `clique` (0-based,
    /// as [`RackSpec::clique_id`] numbers them): the topology file is rewritten, and a
    /// running daemon finds it at its next read. [`Self::clique_of`] still says the
    /// clique the node started in.
    pub fn register_in_clique(&self, index: usize, clique: usize) -> anyhow::Result<()> {
        let path = self.spec.root.join("topology.json");
        let mut topology = Topology::load(&path)?;
        let name = self.nodes[index].name();
        if !topology.move_to_simulated_rack(name, clique as u32 + 1) {
            bail!("{name} is not in the rack's topology {}", path.display());
        }
        topology.write(&path)?;
        Ok(())
    }

    /// Starts (or restarts) node `index`'s daemon; returns once it forked. Its state
    /// directory is kept across restarts: the checkpoint survives.
    pub fn start(&mut self, index: usize) -> anyhow::Result<()> {
        let seeds = self.seeds_for(index);
        let env: Vec<(String, String)> = self
            .spec
            .env
            .iter()
            .chain(self.spec.node_env.get(index).into_iter().flatten())
            .cloned()
            .collect();
        let args = node::DaemonArgs {
            domaind: &self.spec.domaind,
            imex_sim: self.spec.imex_sim.as_deref(),
            local_dir: (self.spec.backend == RackBackend::Local).then(|| self.local.root()),
            seeds: &seeds,
            imex_port: self.imex_port,
            imex_cmd_port: self.imex_cmd_port,
            gossip_interval: self.spec.gossip_interval,
            log_filter: &self.spec.log_filter,
            extra_args: &self.spec.extra_args,
            env: &env,
            imex_runner: self.spec.imex_runner,
        };
        self.nodes[index].spawn(&args)
    }

    pub fn start_all(&mut self) -> anyhow::Result<()> {
        for index in 0..self.nodes.len() {
            self.start(index)?;
        }
        Ok(())
    }

    /// Waits until node `index` wrote its run.json (it is ready), or fails if the
    /// process exits or `limit` passes.
    pub fn wait_ready(&mut self, index: usize, limit: Duration) -> anyhow::Result<RunInfo> {
        self.nodes[index].wait_ready(limit)
    }

    pub fn wait_all_ready(&mut self, limit: Duration) -> anyhow::Result<Vec<RunInfo>> {
        (0..self.nodes.len())
            .map(|i| self.wait_ready(i, limit))
            .collect()
    }

    /// SIGKILL to the daemon's container: the daemon and what it started die with no
    /// chance to retract anything; an IMEX runner's daemon lives on.
    pub fn kill(&mut self, index: usize) -> anyhow::Result<()> {
        self.nodes[index].kill()
    }

    /// SIGKILL to the whole node: the daemon and its IMEX, the runner's too.
    pub fn kill_node(&mut self, index: usize) -> anyhow::Result<()> {
        self.nodes[index].kill()?;
        self.nodes[index].kill_runner()
    }

    /// SIGTERM, then waits up to `limit` for a clean exit; returns its exit code.
    pub fn stop(&mut self, index: usize, limit: Duration) -> anyhow::Result<Option<i32>> {
        self.nodes[index].stop(limit)
    }

    /// Stops every daemon gracefully, all at once (SIGKILL after `limit`).
    pub fn stop_all(&mut self, limit: Duration) {
        for node in &mut self.nodes {
            let _ = node.begin_stop();
        }
        for node in &mut self.nodes {
            let _ = node.stop(limit);
        }
        for node in &mut self.nodes {
            let _ = node.stop_runner(limit);
        }
    }

    /// Whether every daemon this rack started and did not stop is still running; the
    /// names of those that died on their own.
    pub fn unexpected_exits(&mut self) -> Vec<String> {
        self.nodes
            .iter_mut()
            .filter_map(|n| n.exited_on_its_own().then(|| n.name().to_owned()))
            .collect()
    }
}

/// A short temporary directory for a rack: unix socket paths must stay short.
pub fn short_temp_dir(prefix: &str) -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(Path::new("/tmp"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rack(nodes: usize, cliques: usize, root: &Path) -> anyhow::Result<LocalRack> {
        let mut spec = RackSpec::self_contained(nodes, PathBuf::from("domaind"), root.into());
        spec.cliques = cliques;
        spec.subnet = domaind_loopback::NODE_RACK_UNIT_TESTS;
        LocalRack::create(spec)
    }

    fn seed_ips(rack: &LocalRack, index: usize) -> Vec<IpAddr> {
        rack.seeds_for(index)
            .iter()
            .map(|s| s.parse::<SocketAddr>().unwrap().ip())
            .collect()
    }

    #[test]
    fn cliques_are_contiguous_blocks_each_seeded_with_its_own_nodes_only() {
        let tmp = short_temp_dir("dmrq").unwrap();
        let rack = rack(7, 3, tmp.path()).unwrap();
        let cliques: Vec<usize> = (0..7).map(|i| rack.clique_of(i)).collect();
        assert_eq!(cliques, [0, 0, 0, 1, 1, 2, 2]);
        assert_eq!(rack.clique_members(1), [3, 4]);

        let topology = Topology::load(&tmp.path().join("topology.json")).unwrap();
        for (i, node) in rack.nodes().iter().enumerate() {
            let gpus = topology.node(node.name()).unwrap();
            assert_eq!(gpus.clique(), Ok(RackSpec::clique_id(cliques[i])));
        }
        let ip = |i: usize| rack.node(i).ip();
        assert_eq!(seed_ips(&rack, 0), [ip(1), ip(2)]);
        assert_eq!(seed_ips(&rack, 4), [ip(3)]);
        assert_eq!(seed_ips(&rack, 5), [ip(6)]);
    }

    #[test]
    fn seeds_across_cliques_name_every_other_node_and_a_node_re_registers() {
        let tmp = short_temp_dir("dmrq").unwrap();
        let mut spec =
            RackSpec::self_contained(4, PathBuf::from("domaind"), tmp.path().to_path_buf());
        spec.cliques = 2;
        spec.seeds_across_cliques = true;
        spec.subnet = domaind_loopback::NODE_RACK_UNIT_TESTS;
        let rack = LocalRack::create(spec).unwrap();
        let ip = |i: usize| rack.node(i).ip();
        assert_eq!(seed_ips(&rack, 1), [ip(0), ip(2), ip(3)]);

        rack.register_in_clique(1, 1).unwrap();
        let topology = Topology::load(&tmp.path().join("topology.json")).unwrap();
        let clique = |i: usize| topology.node(rack.node(i).name()).unwrap().clique();
        assert_eq!(clique(1), Ok(RackSpec::clique_id(1)));
        assert_eq!(clique(0), Ok(RackSpec::clique_id(0)));
        assert_eq!(clique(2), Ok(RackSpec::clique_id(1)));
    }

    #[test]
    fn one_clique_is_the_rack_it_always_was() {
        let tmp = short_temp_dir("dmrq").unwrap();
        let rack = rack(3, 1, tmp.path()).unwrap();
        let topology = Topology::load(&tmp.path().join("topology.json")).unwrap();
        let names: Vec<&str> = rack.nodes().iter().map(RackNode::name).collect();
        assert_eq!(topology, Topology::simulated_rack(1, names).unwrap());
        assert_eq!(RackSpec::clique_id(0), Topology::simulated_clique(1));
        let ip = |i: usize| rack.node(i).ip();
        assert_eq!(seed_ips(&rack, 1), [ip(0), ip(2)]);
    }

    #[test]
    fn a_rack_has_one_to_as_many_cliques_as_nodes() {
        let tmp = short_temp_dir("dmrq").unwrap();
        for cliques in [0, 4] {
            let error = rack(3, cliques, tmp.path()).unwrap_err().to_string();
            assert!(
                error.contains(&format!(
                    "a rack of 3 nodes has 1 to 3 cliques, not {cliques}"
                )),
                "{error}"
            );
        }
    }
}
