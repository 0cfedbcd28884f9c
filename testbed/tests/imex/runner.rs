//! IMEX kept by the runner (`imex-sim imex-runner`): the daemon outlives the adapter
//! that started it, and the next adapter adopts it (the same process) when it serves
//! the config that adapter would write, and replaces it when it does not, unless
//! prepared claims use it.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process};
use std::time::Duration;

use domaind_actors::ports::Imex;
use domaind_actors::rules::peers::{Peer, slot_hostname};
use domaind_imex::hosts::{self, Resolution};
use domaind_imex::runner::RunnerClient;
use domaind_imex::{ImexDaemon, ImexSettings};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::supervisor::{alone, assert_exit_told, settings, wait_ready};
use domaind_testkit::poll_until_true;

const LIMIT: Duration = Duration::from_secs(20);

/// The address `host` of this module's own loopback subnet.
fn loopback(host: u8) -> IpAddr {
    domaind_loopback::addr(domaind_loopback::NODE_IMEX_RUNNER_TESTS, host).into()
}

/// A runner process of the test's own, killed with the test.
struct Runner {
    process: Child,
    socket: PathBuf,
}

impl Runner {
    async fn start(dir: &Path) -> Self {
        let socket = dir.join("runner").join("imex-runner.sock");
        let process = Process::new(env!("CARGO_BIN_EXE_imex-sim"))
            .args(["imex-runner", "--socket"])
            .arg(&socket)
            .spawn()
            .unwrap();
        let client = RunnerClient::new(&socket);
        poll_until_true("the runner to answer", LIMIT, async || {
            client.instances().await.is_ok()
        })
        .await;
        Self { process, socket }
    }

    fn settings(&self, dir: &Path, ip: IpAddr) -> ImexSettings {
        let mut s = settings(dir, ip);
        s.runner = Some(self.socket.clone());
        s
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.process.id() as i32), Signal::SIGTERM);
        let _ = self.process.wait();
    }
}

pub(crate) fn alive(pid: u32) -> bool {
    kill(Pid::from_raw(pid as i32), None).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_adapter_adopts_the_daemon_the_last_one_left_running() {
    let dir = tempfile::tempdir().unwrap();
    let runner = Runner::start(dir.path()).await;
    let ip = loopback(90);
    let s = runner.settings(dir.path(), ip);

    let first = ImexDaemon::new(s.clone());
    first.start(&alone(ip)).await.unwrap();
    wait_ready(&first).await;
    let pid = first.pid().await.unwrap();
    assert!(first.outlives_node_daemon());
    drop(first);
    assert!(
        alive(pid),
        "the daemon outlives the adapter that started it"
    );

    let second = ImexDaemon::new(s);
    second.start(&alone(ip)).await.unwrap();
    assert_eq!(second.pid().await, Some(pid), "adopted: the same process");
    wait_ready(&second).await;

    // Exits are seen through the runner, and told with how the daemon ended.
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    assert_exit_told(&second, "SIGKILL").await;

    // Started again through the runner, and stopped through it.
    second.start(&alone(ip)).await.unwrap();
    wait_ready(&second).await;
    let again = second.pid().await.unwrap();
    assert_ne!(again, pid);
    second.stop().await.unwrap();
    let instances = RunnerClient::new(&runner.socket).instances().await.unwrap();
    assert!(instances.iter().all(|i| i.ended.is_some()), "{instances:?}");
    assert!(!alive(again));
}

/// A restarted node knows few of its peers at first: the daemon it adopts keeps the
/// peers it served until the hold is over, and only then serves those asked for. It is
/// catching up (what `/readyz` waits on) from the adoption to the hold's end; with no
/// daemon of ours at the runner, there is nothing to catch up with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_daemon_keeps_the_peers_it_served_until_its_hold_is_over() {
    let dir = tempfile::tempdir().unwrap();
    let runner = Runner::start(dir.path()).await;
    let ip = loopback(93);
    let mut s = runner.settings(dir.path(), ip);
    s.adoption_hold = Duration::from_millis(500);
    let mut two = alone(ip);
    two.peers.insert(
        1,
        Peer {
            node: "node-b".into(),
            ip: loopback(94),
        },
    );
    let slot_1 = |s: &ImexSettings| {
        let text = std::fs::read_to_string(&s.hosts_file).unwrap();
        hosts::parse(&text)[&slot_hostname(1)].clone()
    };

    let first = ImexDaemon::new(s.clone());
    let mut caught_up = first.catching_up();
    tokio::time::timeout(LIMIT, caught_up.wait_for(|catching_up| !catching_up))
        .await
        .expect("nothing at the runner to adopt: not catching up")
        .unwrap();
    first.start(&two).await.unwrap();
    let pid = first.pid().await.unwrap();
    drop(first);
    assert_eq!(slot_1(&s), Resolution::Ip(loopback(94)));

    let second = ImexDaemon::new(s.clone());
    second.start(&alone(ip)).await.unwrap();
    assert_eq!(second.pid().await, Some(pid));
    assert!(*second.catching_up().borrow(), "adopted: catching up");
    assert_eq!(
        slot_1(&s),
        Resolution::Ip(loopback(94)),
        "kept while the node catches up"
    );
    poll_until_true("the hold to end", LIMIT, async || {
        slot_1(&s) == Resolution::Parked
    })
    .await;
    assert_eq!(second.pid().await, Some(pid), "a reload, not a restart");
    assert!(!*second.catching_up().borrow(), "the hold is over");
    second.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_serving_another_config_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let runner = Runner::start(dir.path()).await;
    let ip = loopback(91);
    let s = runner.settings(dir.path(), ip);

    let first = ImexDaemon::new(s.clone());
    first.start(&alone(ip)).await.unwrap();
    wait_ready(&first).await;
    let pid = first.pid().await.unwrap();
    drop(first);

    // The next version renders another config: its daemon is not the one running.
    let mut changed = s;
    changed.disconnected_grace += Duration::from_secs(1);
    let second = ImexDaemon::new(changed);
    second.start(&alone(ip)).await.unwrap();
    let replaced = second.pid().await.unwrap();
    assert_ne!(replaced, pid, "not adopted");
    assert!(!alive(pid), "the old daemon was stopped");
    wait_ready(&second).await;
    second.stop().await.unwrap();
}

/// Issue 28 item 3: the same, but prepared claims use that daemon (their jobs import
/// through it): it is kept, not replaced, and every status says why; once the domain
/// stops it, the next start serves this release's config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_serving_another_config_that_claims_use_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let runner = Runner::start(dir.path()).await;
    let ip = loopback(104);
    let s = runner.settings(dir.path(), ip);

    let first = ImexDaemon::new(s.clone());
    first.start(&alone(ip)).await.unwrap();
    wait_ready(&first).await;
    let pid = first.pid().await.unwrap();
    drop(first);

    let mut changed = s;
    changed.disconnected_grace += Duration::from_secs(1);
    let second = ImexDaemon::new(changed);
    second.claims_in_use(true);
    second.start(&alone(ip)).await.unwrap();
    assert_eq!(second.pid().await, Some(pid), "kept");
    wait_ready(&second).await;
    let why = second
        .status()
        .await
        .unwrap()
        .kept
        .expect("the status says why");
    assert!(why.contains("another config.cfg"), "{why}");

    // The domain released it: stopped; the next start is this release's daemon.
    second.stop().await.unwrap();
    assert!(
        !alive(pid)
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(") Z "))
    );
    second.claims_in_use(false);
    second.start(&alone(ip)).await.unwrap();
    assert_ne!(second.pid().await, Some(pid));
    wait_ready(&second).await;
    assert_eq!(second.status().await.unwrap().kept, None);
    second.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runners_daemons_stop_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let runner = Runner::start(dir.path()).await;
    let ip = loopback(92);
    let daemon = ImexDaemon::new(runner.settings(dir.path(), ip));
    daemon.start(&alone(ip)).await.unwrap();
    wait_ready(&daemon).await;
    let pid = daemon.pid().await.unwrap();
    drop(runner);
    tokio::time::timeout(LIMIT, daemon.exited())
        .await
        .expect("the daemon ended with its runner");
    assert!(!alive(pid));
}
