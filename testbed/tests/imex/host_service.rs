//! Host-managed IMEX: the adapter drives the host's systemd unit through `systemctl`,
//! here a fake one (`tests/fixtures/fake-systemctl`) that runs `imex-sim` detached as
//! systemd would. The unit's daemon outlives the adapter that started it, the next
//! adapter adopts it (the same process), reloads reach it, its exit is told, and a
//! unit that serves a config nobody recorded, or that cannot run ours, is kept,
//! replaced or refused by the rules of the runner's daemons.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::time::Duration;

use domaind_actors::ports::Imex;
use domaind_imex::host_service::UnitState;
use domaind_imex::{Command, HostUnit, ImexDaemon, ImexSettings};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::runner::alive;
use crate::supervisor::{alone, assert_exit_told, settings, wait_ready};
use domaind_testkit::poll_for;

const LIMIT: Duration = Duration::from_secs(20);
const FAKE_SYSTEMCTL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fake-systemctl");
const UNIT: &str = "nvidia-imex.service";

/// The address `host` of this module's own loopback subnet.
fn loopback(host: u8) -> IpAddr {
    domaind_loopback::addr(domaind_loopback::NODE_IMEX_HOST_SERVICE_TESTS, host).into()
}

/// A host of the test's own: the fake systemctl's units and their state. Its unit is
/// stopped with the test.
struct FakeHost {
    root: PathBuf,
}

impl FakeHost {
    fn new(dir: &Path) -> Self {
        let root = dir.join("fake-host");
        std::fs::create_dir_all(root.join("units")).unwrap();
        Self { root }
    }

    /// Settings for host-managed IMEX, with the unit installed to run `imex-sim` on
    /// their config, as the drop-in of docs/OPERATIONS.md makes NVIDIA's unit do.
    fn settings(&self, dir: &Path, ip: IpAddr) -> ImexSettings {
        let mut s = settings(dir, ip);
        // Longer than the fake's exit polling, so that a stop is seen within it.
        s.stop_timeout = Duration::from_secs(3);
        s.host_service = Some(HostUnit {
            unit: UNIT.into(),
            systemctl: Command::new(FAKE_SYSTEMCTL)
                .arg("--fake-root")
                .arg(self.root.display().to_string()),
        });
        self.install(&s, &s.config_path(), "simple");
        s
    }

    /// Writes the unit: `imex-sim -c config`, of systemd `Type=kind`.
    fn install(&self, s: &ImexSettings, config: &Path, kind: &str) {
        let mut unit = format!(
            "ExecStart={} -c {}\nType={kind}\n",
            env!("CARGO_BIN_EXE_imex-sim"),
            config.display()
        );
        for (key, value) in &s.daemon_env {
            unit.push_str(&format!("Environment={key}={value}\n"));
        }
        std::fs::write(self.root.join("units").join(UNIT), unit).unwrap();
    }

    fn systemctl(&self, args: &[&str]) -> String {
        let output = Process::new(FAKE_SYSTEMCTL)
            .arg("--fake-root")
            .arg(&self.root)
            .args(args)
            .output()
            .unwrap();
        assert!(output.status.success(), "{args:?}: {output:?}");
        String::from_utf8(output.stdout).unwrap()
    }

    fn main_pid(&self) -> Option<u32> {
        UnitState::parse(&self.systemctl(&["show", UNIT, "-p", "MainPID"])).main_pid
    }

    /// What the unit's daemons printed.
    fn output(&self) -> String {
        std::fs::read_to_string(self.root.join("state").join(UNIT).join("output"))
            .unwrap_or_default()
    }
}

impl Drop for FakeHost {
    fn drop(&mut self) {
        let _ = Process::new(FAKE_SYSTEMCTL)
            .arg("--fake-root")
            .arg(&self.root)
            .args(["stop", UNIT])
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unit_keeps_imex_and_a_restarted_daemon_adopts_it() {
    let dir = tempfile::tempdir().unwrap();
    let host = FakeHost::new(dir.path());
    let ip = loopback(105);
    let s = host.settings(dir.path(), ip);

    let first = ImexDaemon::new(s.clone());
    assert!(first.outlives_node_daemon());
    first.start(&alone(ip)).await.unwrap();
    wait_ready(&first).await;
    let pid = first.pid().await.unwrap();
    assert_eq!(host.main_pid(), Some(pid), "the unit runs it");
    drop(first);
    assert!(
        alive(pid),
        "the daemon outlives the adapter that started it"
    );

    let second = ImexDaemon::new(s.clone());
    second.start(&alone(ip)).await.unwrap();
    assert_eq!(second.pid().await, Some(pid), "adopted: the same process");
    wait_ready(&second).await;
    assert!(second.status().await.unwrap().adopted);

    // A reload reaches the daemon through the unit (systemctl kill), without a restart.
    second.reload().await.unwrap();
    poll_for("the reload to reach imex-sim", LIMIT, async || {
        let output = host.output();
        if output.contains("SIGUSR1") {
            Ok(())
        } else {
            Err(output)
        }
    })
    .await;
    assert_eq!(host.main_pid(), Some(pid));

    // An exit is seen through the unit, and told with how the daemon ended.
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    assert_exit_told(&second, "SIGKILL").await;

    // Started again through the unit; stopped through it when no domain needs it.
    second.start(&alone(ip)).await.unwrap();
    wait_ready(&second).await;
    let again = second.pid().await.unwrap();
    assert_ne!(again, pid);
    assert_eq!(host.main_pid(), Some(again));
    second.stop().await.unwrap();
    assert_eq!(host.main_pid(), None, "the unit is stopped");
    assert!(!alive(again));
    assert!(
        second.status().await.unwrap().exited.is_none(),
        "a stop is no exit"
    );
}

/// A unit running a daemon domaind did not record (systemd restarted it, or someone
/// did) serves a config nobody can vouch for: kept while prepared claims use it, and
/// replaced once none does; the replacement is recorded and adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_domaind_did_not_start_is_kept_while_claims_use_it_else_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let host = FakeHost::new(dir.path());
    let ip = loopback(106);
    let s = host.settings(dir.path(), ip);

    let first = ImexDaemon::new(s.clone());
    first.start(&alone(ip)).await.unwrap();
    wait_ready(&first).await;
    drop(first);
    host.systemctl(&["stop", UNIT]);
    host.systemctl(&["start", UNIT]);
    let outside = host.main_pid().unwrap();

    let kept = ImexDaemon::new(s.clone());
    kept.claims_in_use(true);
    kept.start(&alone(ip)).await.unwrap();
    assert_eq!(kept.pid().await, Some(outside), "kept");
    wait_ready(&kept).await;
    let why = kept
        .status()
        .await
        .unwrap()
        .kept
        .expect("the status says why");
    assert!(why.contains("not started by domaind"), "{why}");
    drop(kept);

    let replacing = ImexDaemon::new(s.clone());
    replacing.start(&alone(ip)).await.unwrap();
    let replaced = replacing.pid().await.unwrap();
    assert_ne!(replaced, outside, "not adopted");
    assert!(!alive(outside), "the unit's old daemon was stopped");
    assert_eq!(host.main_pid(), Some(replaced));
    wait_ready(&replacing).await;
    drop(replacing);

    let adopting = ImexDaemon::new(s);
    adopting.start(&alone(ip)).await.unwrap();
    assert_eq!(adopting.pid().await, Some(replaced), "recorded, so adopted");
    adopting.stop().await.unwrap();
}

/// A unit that cannot run the IMEX this node configures is refused, saying what to
/// change, and nothing is started: NVIDIA's stock unit (its own config, forking), and
/// a second IMEX on the node (another config dir) while the unit runs the first's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_that_cannot_run_the_config_domaind_writes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let host = FakeHost::new(dir.path());
    let ip = loopback(107);
    let s = host.settings(&dir.path().join("first"), ip);

    host.install(&s, Path::new("/etc/nvidia-imex/config.cfg"), "simple");
    let daemon = ImexDaemon::new(s.clone());
    let error = daemon.start(&alone(ip)).await.unwrap_err();
    assert!(
        error.is_permanent(),
        "a unit to fix, not to wait out: {error}"
    );
    let error = error.to_string();
    assert!(
        error.contains(&format!("-c {}", s.config_path().display()))
            && error.contains("/etc/nvidia-imex/config.cfg"),
        "{error}"
    );
    assert_eq!(host.main_pid(), None, "nothing started");

    host.install(&s, &s.config_path(), "forking");
    let error = daemon.start(&alone(ip)).await.unwrap_err().to_string();
    assert!(error.contains("Type=forking"), "{error}");
    assert_eq!(host.main_pid(), None, "nothing started");

    host.install(&s, &s.config_path(), "simple");
    daemon.start(&alone(ip)).await.unwrap();
    wait_ready(&daemon).await;
    let pid = daemon.pid().await.unwrap();

    let second = host.settings(&dir.path().join("second"), ip);
    host.install(&s, &s.config_path(), "simple");
    let error = ImexDaemon::new(second.clone())
        .start(&alone(ip))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(&second.config_path().display().to_string()),
        "{error}"
    );
    assert_eq!(
        host.main_pid(),
        Some(pid),
        "the first node's IMEX is left alone"
    );
    daemon.stop().await.unwrap();
}
