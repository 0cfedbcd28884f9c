//! One daemon of a local rack: its directories, flags and process.

use std::fs::File;
use std::net::IpAddr;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use domaind_node::run::RunInfo;

/// How often a waiting caller looks again.
const POLL: Duration = Duration::from_millis(25);
/// How long an IMEX runner may take to serve its socket.
const RUNNER_START_LIMIT: Duration = Duration::from_secs(10);

pub(super) struct DaemonArgs<'a> {
    pub domaind: &'a Path,
    pub imex_sim: Option<&'a Path>,
    /// The local backend's directory; `None` for the Kubernetes backend.
    pub local_dir: Option<&'a Path>,
    pub seeds: &'a [String],
    pub imex_port: u16,
    pub imex_cmd_port: u16,
    pub gossip_interval: Duration,
    pub log_filter: &'a str,
    pub extra_args: &'a [String],
    pub env: &'a [(String, String)],
    /// Through an IMEX runner of the node's own (`RackSpec::imex_runner`).
    pub imex_runner: bool,
}

#[derive(Debug)]
pub struct RackNode {
    name: String,
    ip: IpAddr,
    dir: PathBuf,
    gossip_port: u16,
    topology: PathBuf,
    proc_devices: PathBuf,
    /// A real kubelet's root directory, whose plugin directories the daemon serves.
    kubelet_dir: Option<PathBuf>,
    child: Option<Child>,
    /// The node's IMEX runner, when the rack has them: a process group of its own.
    runner: Option<Child>,
    /// Set when the rack stopped or killed the process on purpose.
    stopped_on_purpose: bool,
    info: Option<RunInfo>,
}

impl RackNode {
    pub(super) fn new(
        name: String,
        ip: IpAddr,
        dir: PathBuf,
        gossip_port: u16,
        topology: PathBuf,
        proc_devices: PathBuf,
        kubelet_dir: Option<PathBuf>,
    ) -> Self {
        Self {
            name,
            ip,
            dir,
            gossip_port,
            topology,
            proc_devices,
            kubelet_dir,
            child: None,
            runner: None,
            stopped_on_purpose: false,
            info: None,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    pub fn gossip_port(&self) -> u16 {
        self.gossip_port
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    pub fn cdi_dir(&self) -> PathBuf {
        self.dir.join("cdi")
    }

    pub fn imex_dir(&self) -> PathBuf {
        self.state_dir().join("imex")
    }

    /// The daemon's stdout and stderr.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("domaind.log")
    }

    fn plugins_dir(&self) -> PathBuf {
        match &self.kubelet_dir {
            Some(kubelet) => kubelet.join("plugins"),
            None => self.dir.join("plugins"),
        }
    }

    fn registry_dir(&self) -> PathBuf {
        match &self.kubelet_dir {
            Some(kubelet) => kubelet.join("plugins_registry"),
            None => self.dir.join("registry"),
        }
    }

    pub fn dra_socket(&self) -> PathBuf {
        self.plugins_dir()
            .join(domaind_kube_api::names::DEFAULT_DRIVER_NAME)
            .join("dra.sock")
    }

    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir().join(format!(
            "{}-reg.sock",
            domaind_kube_api::names::DEFAULT_DRIVER_NAME
        ))
    }

    /// What the running daemon wrote to run.json, once it was ready.
    /// The IMEX runner's socket (in a directory of its own, which the runner makes
    /// root's alone).
    pub fn runner_socket(&self) -> PathBuf {
        self.dir.join("imex-runner").join("runner.sock")
    }

    /// The IMEX runner's pid, while it runs.
    pub fn runner_pid(&mut self) -> Option<u32> {
        let runner = self.runner.as_mut()?;
        matches!(runner.try_wait(), Ok(None)).then(|| runner.id())
    }

    pub fn info(&self) -> Option<&RunInfo> {
        self.info.as_ref()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The flags a daemon of this rack runs with.
    pub(super) fn command(&self, args: &DaemonArgs<'_>) -> Command {
        let mut command = Command::new(args.domaind);
        command
            .arg("--log")
            .arg(args.log_filter)
            .arg("run")
            .arg("--node-name")
            .arg(&self.name)
            .arg("--pod-ip")
            .arg(self.ip.to_string())
            .arg("--gossip-port")
            .arg(self.gossip_port.to_string())
            .arg("--gossip-interval")
            .arg(humantime::format_duration(args.gossip_interval).to_string())
            .arg("--tls-dir")
            .arg(self.dir.join("tls"))
            .arg("--kubelet-plugins-dir")
            .arg(self.plugins_dir())
            .arg("--kubelet-registry-dir")
            .arg(self.registry_dir())
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--cdi-dir")
            .arg(self.cdi_dir())
            .arg("--gpu-topology")
            .arg(&self.topology)
            .arg("--imex-port")
            .arg(args.imex_port.to_string())
            .arg("--imex-cmd-port")
            .arg(args.imex_cmd_port.to_string())
            .arg("--channel-nodes")
            .arg("skip")
            .arg("--proc-devices")
            .arg(&self.proc_devices)
            .arg("--http-addr")
            .arg(format!("{}:0", self.ip))
            .arg("--state-addr")
            .arg(format!("{}:0", self.ip));
        match args.local_dir {
            Some(dir) => command
                .arg("--backend")
                .arg("local")
                .arg("--local-dir")
                .arg(dir),
            None => command.arg("--backend").arg("kube"),
        };
        match args.imex_sim {
            Some(sim) => command.arg("--imex-sim").arg(sim),
            None => command.arg("--imex-sim-builtin"),
        };
        if args.imex_runner {
            command.arg("--imex-runner").arg(self.runner_socket());
        }
        for seed in args.seeds {
            command.arg("--seed").arg(seed);
        }
        command.args(args.extra_args);
        // Nothing of the user's environment may change the rack's flags.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("DOMAIND_") {
                command.env_remove(key);
            }
        }
        command.env_remove("NODE_NAME").env_remove("POD_IP");
        command.envs(args.env.iter().map(|(k, v)| (k, v)));
        command
    }

    pub(super) fn spawn(&mut self, args: &DaemonArgs<'_>) -> anyhow::Result<()> {
        if self.running() {
            bail!("{} is already running", self.name);
        }
        std::fs::create_dir_all(self.state_dir())?;
        if args.imex_runner && self.runner_pid().is_none() {
            self.spawn_runner(args.domaind)?;
        }
        // A run.json left by a killed run must not be taken for this run's.
        RunInfo::remove(&self.state_dir());
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path())
            .with_context(|| format!("cannot open {}", self.log_path().display()))?;
        let child = self
            .command(args)
            // Its own process group: killing it is a container dying (its IMEX daemon,
            // in a group of its own, dies with domaind of its parent-death signal), and
            // the terminal's Ctrl-C reaches only the rack owner.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", args.domaind.display()))?;
        self.child = Some(child);
        self.stopped_on_purpose = false;
        self.info = None;
        Ok(())
    }

    /// Starts the node's IMEX runner and waits until it answers: in a process group of
    /// its own, as a pod of its own is, so that killing the daemon's leaves it.
    fn spawn_runner(&mut self, domaind: &Path) -> anyhow::Result<()> {
        let log_path = self.dir.join("imex-runner.log");
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("cannot open {}", log_path.display()))?;
        let socket = self.runner_socket();
        let mut runner = Command::new(domaind)
            .arg("imex-runner")
            .arg("--socket")
            .arg(&socket)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}'s IMEX runner", self.name))?;
        let deadline = Instant::now() + RUNNER_START_LIMIT;
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            if runner.try_wait()?.is_some() || Instant::now() > deadline {
                let _ = killpg(Pid::from_raw(runner.id() as i32), Signal::SIGKILL);
                let _ = runner.wait();
                bail!(
                    "{}'s IMEX runner did not serve {}; see {}",
                    self.name,
                    socket.display(),
                    log_path.display()
                );
            }
            std::thread::sleep(POLL);
        }
        self.runner = Some(runner);
        Ok(())
    }

    /// SIGKILL to the IMEX runner's group: its daemons die with it.
    pub(super) fn kill_runner(&mut self) -> anyhow::Result<()> {
        if let Some(mut runner) = self.runner.take() {
            let _ = killpg(Pid::from_raw(runner.id() as i32), Signal::SIGKILL);
            runner.wait()?;
        }
        Ok(())
    }

    /// SIGTERM to the IMEX runner, which stops its daemons; SIGKILL after `limit`.
    pub(super) fn stop_runner(&mut self, limit: Duration) -> anyhow::Result<()> {
        let Some(mut runner) = self.runner.take() else {
            return Ok(());
        };
        let _ = kill(Pid::from_raw(runner.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + limit;
        while runner.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = killpg(Pid::from_raw(runner.id() as i32), Signal::SIGKILL);
                runner.wait()?;
                bail!(
                    "{}'s IMEX runner did not stop within {limit:?}; killed",
                    self.name
                );
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }

    /// Whether the process is alive (reaping it if it exited).
    pub fn running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub(super) fn exited_on_its_own(&mut self) -> bool {
        self.child.is_some() && !self.stopped_on_purpose && !self.running()
    }

    pub(super) fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<RunInfo> {
        let deadline = Instant::now() + limit;
        let pid = self.pid().context("not started")?;
        loop {
            if let Some(info) = RunInfo::read(&self.state_dir())?.filter(|i| i.pid == pid) {
                self.info = Some(info.clone());
                return Ok(info);
            }
            if !self.running() {
                bail!(
                    "{} exited before it was ready; see {}",
                    self.name,
                    self.log_path().display()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{} was not ready within {limit:?}; see {}",
                    self.name,
                    self.log_path().display()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Sends `signal` to the daemon, if it runs.
    pub fn signal(&mut self, signal: Signal) -> anyhow::Result<()> {
        if let Some(pid) = self.pid().filter(|_| self.running()) {
            kill(Pid::from_raw(pid as i32), signal)
                .with_context(|| format!("cannot send {signal} to {}", self.name))?;
        }
        Ok(())
    }

    /// Sends `signal` to the daemon's process group (its IMEX daemon has one of its
    /// own: see `LocalRack::signal_group`), if it runs.
    pub fn signal_group(&mut self, signal: Signal) -> anyhow::Result<()> {
        if let Some(pid) = self.pid().filter(|_| self.running()) {
            killpg(Pid::from_raw(pid as i32), signal)
                .with_context(|| format!("cannot send {signal} to {}'s processes", self.name))?;
        }
        Ok(())
    }

    /// SIGKILL to the daemon and everything in its group, as when a container dies;
    /// its IMEX daemon, in a group of its own, dies of its parent-death signal.
    pub(super) fn kill(&mut self) -> anyhow::Result<()> {
        self.stopped_on_purpose = true;
        if let Some(child) = &mut self.child {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            child.wait()?;
        }
        Ok(())
    }

    /// SIGKILL to the daemon alone; returns once it is reaped.
    pub(super) fn kill_process(&mut self) -> anyhow::Result<()> {
        self.stopped_on_purpose = true;
        if let Some(child) = &mut self.child {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            child.wait()?;
        }
        Ok(())
    }

    /// SIGTERM, without waiting.
    pub(super) fn begin_stop(&mut self) -> anyhow::Result<()> {
        self.stopped_on_purpose = true;
        self.signal(Signal::SIGTERM)
    }

    /// SIGTERM (again, harmlessly, after [`Self::begin_stop`]), then waits for the exit.
    pub(super) fn stop(&mut self, limit: Duration) -> anyhow::Result<Option<i32>> {
        self.stopped_on_purpose = true;
        if !self.running() {
            return Ok(self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten()?.code()));
        }
        self.signal(Signal::SIGTERM)?;
        let deadline = Instant::now() + limit;
        let child = self.child.as_mut().expect("running");
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status.code());
            }
            if Instant::now() > deadline {
                let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
                child.wait()?;
                bail!("{} did not stop within {limit:?}; killed", self.name);
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for RackNode {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            // The group too: a status query may outlive a daemon that already exited
            // (its IMEX daemon dies with it, of its parent-death signal).
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
        let _ = self.kill_runner();
    }
}
