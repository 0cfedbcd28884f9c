//! The ImexProcess actor supervising a real `imex-sim` through the IMEX adapter: a
//! crashed daemon is restarted with backoff, reloads coalesce, and a daemon a killed
//! domaind left running is stopped before the next one starts.

use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use domaind_actors::NodeConfig;
use domaind_actors::actors::imex_process::{
    ApplyPeers, Detach, GetImexLifecycle, ImexProcessActor, ImexReport,
};
use domaind_actors::model::CliqueId;
use domaind_actors::ports::Imex;
use domaind_actors::rules::peers::{Peer, PeerSet};
use domaind_imex::{Command, ImexDaemon, ImexSettings};
use domaind_testbed::rack::imex_ports;
use domaind_testkit::{poll_until_every, poll_until_true};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

const LIMIT: Duration = Duration::from_secs(20);

/// The address `host` of this module's own loopback subnet.
fn loopback(host: u8) -> IpAddr {
    domaind_loopback::addr(domaind_loopback::NODE_IMEX_SUPERVISOR_TESTS, host).into()
}

pub(crate) fn settings(dir: &std::path::Path, ip: IpAddr) -> ImexSettings {
    let sim = env!("CARGO_BIN_EXE_imex-sim");
    let mut s = ImexSettings::new(dir, ip);
    s.daemon = Command::new(sim);
    s.ctl = Command::new(sim).arg("ctl");
    s.hosts_file = dir.join("hosts");
    s.daemon_env = vec![(
        domaind_testbed::imex_sim::HOSTS_ENV.into(),
        s.hosts_file.display().to_string(),
    )];
    (s.server_port, s.cmd_port) = imex_ports::pick(&[ip]).unwrap();
    s.stop_timeout = Duration::from_millis(500);
    s
}

pub(crate) fn alone(ip: IpAddr) -> PeerSet {
    PeerSet {
        peers: [(
            0,
            Peer {
                node: "node-a".into(),
                ip,
            },
        )]
        .into(),
    }
}

/// Collects the supervisor's reports.
struct Reports(Arc<Mutex<Vec<ImexReport>>>);
impl Actor for Reports {
    type Context = Context<Self>;
}
impl Handler<ImexReport> for Reports {
    type Result = ();
    fn handle(&mut self, report: ImexReport, _: &mut Self::Context) {
        self.0.lock().unwrap().push(report);
    }
}

#[test]
fn a_crashed_daemon_is_restarted_with_backoff() {
    let system = actix::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    });
    system.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let ip = loopback(80);
        let daemon = ImexDaemon::new(settings(dir.path(), ip));
        let mut config = NodeConfig::new("node-a", ip, CliqueId("c.0".into()));
        config.imex_poll.unready = Duration::from_millis(100);
        // Once it is ready, no poll comes within the test's limit: only the adapter's
        // exit watch can notice the crash.
        config.imex_poll.quick = LIMIT * 10;
        config.imex_poll.steady = LIMIT * 10;
        let supervisor = ImexProcessActor::new(Arc::new(daemon.clone()), &config).start();
        let reports = Arc::new(Mutex::new(Vec::new()));
        let owner = Reports(reports.clone()).start();
        supervisor.do_send(ApplyPeers {
            owner: owner.clone().recipient().downgrade(),
            version: 1,
            peers: alone(ip),
            claims_in_use: false,
        });
        let ready = || {
            reports
                .lock()
                .unwrap()
                .last()
                .is_some_and(|r| r.ready && r.version == Some(1))
        };
        wait(ready).await;
        let first_pid = daemon.pid().await.unwrap();

        // Crash it: the adapter sees the child end, the supervisor asks at once and
        // starts it again.
        let s = daemon.settings();
        tokio::process::Command::new(&s.ctl.program)
            .args(&s.ctl.args)
            .args(["-c", &s.config_path().display().to_string(), "--crash"])
            .output()
            .await
            .unwrap();
        wait(|| !reports.lock().unwrap().last().is_some_and(|r| r.running)).await;
        reports.lock().unwrap().clear();
        wait(ready).await;
        let lifecycle = supervisor.send(GetImexLifecycle).await.unwrap();
        assert_eq!(
            (lifecycle.starts, lifecycle.restarts),
            (2, 1),
            "{lifecycle:?}"
        );
        assert_ne!(daemon.pid().await.unwrap(), first_pid);
        let why = lifecycle.last_failure.unwrap_or_default();
        assert!(
            why.contains("exit status: 134") && why.contains("crashing on request"),
            "the restart says why: {why}"
        );
        supervisor.do_send(Detach { stop_daemon: true });
        wait_async(|| async { daemon.pid().await.is_none() }).await;
        drop(owner);
    });
}

/// The adapter tells of a daemon's own exit without being asked, and of nothing else:
/// not of a stop, not of a daemon still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adapter_tells_of_an_exit_as_it_happens() {
    let dir = tempfile::tempdir().unwrap();
    let ip = loopback(86);
    let daemon = ImexDaemon::new(settings(dir.path(), ip));
    daemon.start(&alone(ip)).await.unwrap();
    wait_ready(&daemon).await;

    let watcher = tokio::spawn({
        let daemon = daemon.clone();
        async move { daemon.exited().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!watcher.is_finished(), "a running daemon did not exit");
    let pid = daemon.pid().await.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    tokio::time::timeout(LIMIT, watcher)
        .await
        .expect("the exit is told without a status query")
        .unwrap();
    assert_eq!(daemon.pid().await, None);
    // Still unreported: told again at once, until a status says why.
    assert_exit_told(&daemon, "SIGKILL").await;

    // A stop is no exit to tell of.
    daemon.start(&alone(ip)).await.unwrap();
    wait_ready(&daemon).await;
    let watcher = tokio::spawn({
        let daemon = daemon.clone();
        async move { daemon.exited().await }
    });
    daemon.stop().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!watcher.is_finished(), "a stop was told as an exit");
    watcher.abort();
    assert!(daemon.status().await.unwrap().exited.is_none());
}

/// How often a wait asks the daemon: an IMEX status query runs a process each time.
pub(crate) const STATUS_POLL: Duration = Duration::from_millis(50);

async fn wait(mut condition: impl FnMut() -> bool) {
    poll_until_true("the condition", LIMIT, async || condition()).await;
}

/// `daemon`'s exit is told (`exited` resolves) and its status says it ended, naming
/// `how`.
pub(crate) async fn assert_exit_told(daemon: &ImexDaemon, how: &str) {
    tokio::time::timeout(LIMIT, daemon.exited())
        .await
        .expect("the exit is told without a status query");
    let status = daemon.status().await.unwrap();
    assert!(!status.running);
    assert!(
        status
            .exited
            .as_deref()
            .is_some_and(|why| why.contains(how)),
        "{status:?}"
    );
}

/// Waits until `daemon` says it is ready; on timeout, fails with what it last said
/// (an exit names its status, and the simulator's error is in the adapter's log).
pub(crate) async fn wait_ready(daemon: &ImexDaemon) {
    let last_status = RefCell::new(None);
    let ready = poll_until_every(STATUS_POLL, LIMIT, || {
        let last_status = &last_status;
        async move {
            let status = daemon.status().await;
            if status.as_ref().is_ok_and(|s| s.ready) {
                return Some(());
            }
            last_status.replace(Some(status));
            None
        }
    })
    .await;
    if ready.is_none() {
        let status = last_status.into_inner().expect("a look before the limit");
        panic!("not ready in {LIMIT:?}; last status: {status:?}");
    }
}

async fn wait_async<F: std::future::Future<Output = bool>>(mut condition: impl FnMut() -> F) {
    poll_until_every(STATUS_POLL, LIMIT, || {
        let met = condition();
        async { met.await.then_some(()) }
    })
    .await
    .unwrap_or_else(|| panic!("condition not met in {LIMIT:?}"));
}

/// Reloads within IMEX's ~5 s throttle coalesce: one SIGUSR1 now, one when the
/// interval has passed, however many were asked for. In paused time, once the daemon
/// has answered (no reload is sent before).
#[tokio::test(flavor = "current_thread")]
async fn reloads_coalesce() {
    let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(recorder);
    let mut reloads = 0u64;
    let mut count = || {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            if key.key().name() == domaind_imex::daemon::IMEX_RELOADS
                && let DebugValue::Counter(n) = value
            {
                reloads += n;
            }
        }
        reloads
    };

    let dir = tempfile::tempdir().unwrap();
    let ip = loopback(81);
    let mut s = settings(dir.path(), ip);
    s.reload_min_interval = Duration::from_millis(500);
    let daemon = ImexDaemon::new(s);
    daemon.start(&alone(ip)).await.unwrap();
    wait_async(|| async { daemon.status().await.is_ok() }).await;
    tokio::time::pause();
    for _ in 0..5 {
        daemon.reload().await.unwrap();
    }
    assert_eq!(
        count(),
        1,
        "the first reload is sent at once, the rest wait"
    );
    tokio::time::sleep(Duration::from_millis(499)).await;
    assert_eq!(count(), 1, "nothing before the interval has passed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(count(), 2, "the waiting ones become one");
    daemon.stop().await.unwrap();
}

fn ended(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| domaind_imex::leftover::stat_says_ended(&stat))
        .unwrap_or(true)
}

/// A daemon started without the guard (as an older domaind started it) outlives a
/// SIGKILLed domaind, holding the IMEX ports. The next domaind on the same state
/// directory finds it by its command line and stops it before starting its own, which
/// then owns the ports and comes up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_left_by_a_killed_domaind_is_stopped_before_the_next_starts() {
    let dir = tempfile::tempdir().unwrap();
    let ip = loopback(90);
    let settings = settings(dir.path(), ip);

    let killed = ImexDaemon::new(settings.clone());
    killed.start(&alone(ip)).await.unwrap();
    let left = killed.pid().await.unwrap();
    wait_ready(&killed).await;
    std::mem::forget(killed);

    let next = ImexDaemon::new(settings);
    next.start(&alone(ip)).await.unwrap();
    let started = next.pid().await.unwrap();
    assert_ne!(started, left);
    assert!(ended(left), "the leftover daemon {left} still runs");
    wait_ready(&next).await;

    next.stop().await.unwrap();
    assert!(ended(started));
}

/// The same leftover, run from another working directory with a relative config path
/// (as a daemon run by hand with a relative `--state-dir` starts it), is ours too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leftover_named_by_a_relative_path_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let ip = loopback(87);
    let settings = settings(&dir.path().join("state/imex"), ip);
    std::fs::create_dir_all(&settings.config_dir).unwrap();
    std::fs::write(
        settings.config_path(),
        domaind_imex::config::render_config(&settings),
    )
    .unwrap();
    std::fs::write(settings.nodes_config_path(), "").unwrap();
    let mut left = std::process::Command::new(&settings.daemon.program)
        .args(["-c", "state/imex/config.cfg"])
        .current_dir(dir.path())
        .envs(settings.daemon_env.iter().map(|(k, v)| (k, v)))
        .spawn()
        .unwrap();
    wait(|| std::net::TcpStream::connect((ip, settings.server_port)).is_ok()).await;

    let daemon = ImexDaemon::new(settings);
    daemon.start(&alone(ip)).await.unwrap();
    // It was serving its port until the start: the start stopped it, and waited.
    assert!(
        left.try_wait().unwrap().is_some(),
        "the leftover still runs"
    );
    wait_ready(&daemon).await;
    daemon.stop().await.unwrap();
}

/// Processes that are not our IMEX daemon are left alone, even when their command
/// line names our config: a status query (more arguments after the config), a daemon
/// on another node's config, anything else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_not_ours_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let ip = loopback(82);
    let settings = settings(dir.path(), ip);
    let config = settings.config_path().display().to_string();
    let other = dir.path().join("other/config.cfg").display().to_string();
    let bystander = |extra: &[&str]| {
        std::process::Command::new("sh")
            .args(["-c", "sleep 30", "sh"])
            .args(extra)
            .spawn()
            .unwrap()
    };
    let mut bystanders = [
        bystander(&["-c", &config, "-q"]),
        bystander(&["-c", &other]),
        bystander(&[&config]),
    ];

    let daemon = ImexDaemon::new(settings);
    daemon.start(&alone(ip)).await.unwrap();
    for b in &bystanders {
        assert!(!ended(b.id()), "a process not ours was stopped");
    }
    daemon.stop().await.unwrap();
    for b in &mut bystanders {
        b.kill().unwrap();
        b.wait().unwrap();
    }
}

/// The adapter forks the daemon from a thread of its own. The guard's parent-death
/// signal follows the thread that forked, so a daemon forked by the caller's thread
/// would die when that thread ends: here the caller is a thread that ends at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_daemon_outlives_the_thread_that_asked_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let ip = loopback(88);
    let mut s = settings(dir.path(), ip);
    s.guard =
        Some(Command::new(env!("CARGO_BIN_EXE_imex-sim")).arg(domaind_imex::guard::SUBCOMMAND));
    let daemon = ImexDaemon::new(s);
    let runtime = tokio::runtime::Handle::current();
    let asking = daemon.clone();
    std::thread::spawn(move || runtime.block_on(asking.start(&alone(ip))))
        .join()
        .unwrap()
        .unwrap();
    let pid = daemon.pid().await.unwrap();
    wait_ready(&daemon).await;
    assert!(
        !ended(pid),
        "the daemon died with the thread that asked for it"
    );
    // The guard became the daemon: same pid, the daemon's command line, a parent-death
    // signal, a process group of its own.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(
        !String::from_utf8_lossy(&cmdline).contains("imex-guard"),
        "{cmdline:?}"
    );
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let group: u32 = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(2)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(group, pid, "the daemon leads a process group of its own");
    daemon.stop().await.unwrap();
    assert!(ended(pid));
}

/// A port held by a process that is not ours is named in the refusal, holder and all,
/// and the holder is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_held_by_another_process_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let ip = loopback(89);
    let mut s = settings(dir.path(), ip);
    let listener = std::net::TcpListener::bind(SocketAddr::new(ip, 0)).unwrap();
    s.cmd_port = listener.local_addr().unwrap().port();
    let daemon = ImexDaemon::new(s);
    let error = daemon.start(&alone(ip)).await.unwrap_err().to_string();
    let me = std::process::id();
    assert!(
        error.contains("(IMEX_CMD_PORT)") && error.contains(&format!("held by pid {me} (")),
        "{error}"
    );
    assert!(listener.local_addr().is_ok(), "the holder is left alone");
}

/// Writes an executable shell script.
fn script(path: &std::path::Path, body: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.to_path_buf()
}

/// A fake IMEX daemon with the real one's window: it takes a moment before its
/// SIGUSR1 handler is in place (until then the signal's default action kills it), and
/// its command service answers only after that. The fake ctl answers READY once the
/// daemon does. Both are shell scripts; `-c CONFIG` is `$2`.
fn slow_to_handle_signals(dir: &std::path::Path, ip: IpAddr) -> ImexSettings {
    let daemon = script(
        &dir.join("fake-imex"),
        r#"dir=$(dirname "$2")
sleep 0.3
trap 'echo reload >> "$dir/reloads"' USR1
trap 'exit 0' TERM
touch "$dir/answering"
while :; do sleep 0.05; done
"#,
    );
    let ctl = script(
        &dir.join("fake-imex-ctl"),
        r#"dir=$(dirname "$2")
[ -e "$dir/answering" ] || exit 1
echo READY
"#,
    );
    let mut s = settings(&dir.join("imex"), ip);
    s.daemon = Command::new(daemon);
    s.ctl = Command::new(ctl);
    s
}

/// A reload asked for before the daemon answered is not sent then (it would have
/// killed the daemon) but once it has answered, and then exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_waits_until_the_daemon_has_answered() {
    let dir = tempfile::tempdir().unwrap();
    let ip = loopback(83);
    let s = slow_to_handle_signals(dir.path(), ip);
    let answering = s.config_dir.join("answering");
    let reloads = s.config_dir.join("reloads");
    let daemon = ImexDaemon::new(s);
    daemon.start(&alone(ip)).await.unwrap();
    let pid = daemon.pid().await.unwrap();
    daemon.reload().await.unwrap();
    daemon.reload().await.unwrap();

    wait(|| answering.exists()).await;
    assert!(!ended(pid), "the daemon died of a reload sent too early");
    assert!(
        !reloads.exists(),
        "a reload was sent before the daemon answered"
    );

    let status = daemon.status().await.unwrap();
    assert!(status.running && status.ready, "{status:?}");
    // The shell creates the file before it writes the line: wait for the whole line.
    wait(|| std::fs::read_to_string(&reloads).is_ok_and(|r| r.ends_with('\n'))).await;
    assert_eq!(daemon.pid().await, Some(pid));
    // Once stopped, no reload can still be on its way: the two asked for were one.
    daemon.stop().await.unwrap();
    assert_eq!(std::fs::read_to_string(&reloads).unwrap(), "reload\n");
}

/// The loop of issue 11: IMEX's port held by a connection of another process (the
/// kernel gave it out as an ephemeral source port while IMEX was down). The start is
/// refused with the port named and counted, instead of a daemon that dies at once.
#[tokio::test(flavor = "current_thread")]
async fn a_start_on_a_held_port_is_refused_with_the_port_named() {
    let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(recorder);

    let dir = tempfile::tempdir().unwrap();
    let ip = loopback(84);
    let mut s = settings(dir.path(), ip);
    let (holder, _server) = hold_port(ip).await;
    s.server_port = holder.local_addr().unwrap().port();
    let daemon = ImexDaemon::new(s);
    let error = daemon.start(&alone(ip)).await.unwrap_err().to_string();
    assert!(
        error.contains(&format!("{}", holder.local_addr().unwrap()))
            && error.contains("SERVER_PORT"),
        "{error}"
    );
    assert!(daemon.pid().await.is_none(), "no daemon was spawned");
    let busy: u64 = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, _, _, _)| key.key().name() == domaind_imex::listen_check::IMEX_PORT_BUSY)
        .map(|(_, _, _, value)| match value {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum();
    assert_eq!(busy, 1);
}

/// A connected socket whose local address is `ip` and an ephemeral port, as an
/// outgoing connection from this address is; and its peer, which must live as long.
async fn hold_port(ip: IpAddr) -> (tokio::net::TcpStream, tokio::net::TcpStream) {
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, 0))
        .await
        .unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(ip, 0)).unwrap();
    let (client, accepted) = tokio::join!(
        socket.connect(listener.local_addr().unwrap()),
        listener.accept()
    );
    (client.unwrap(), accepted.unwrap().0)
}

/// Supervised, a daemon whose port is held is retried with backoff, each failure
/// saying why, and comes up once the port is free.
#[test]
fn a_held_port_delays_the_daemon_until_it_is_free() {
    let system = actix::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    });
    system.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let ip = loopback(85);
        let mut s = settings(dir.path(), ip);
        let held = hold_port(ip).await;
        let port = held.0.local_addr().unwrap().port();
        s.server_port = port;
        let daemon = ImexDaemon::new(s);
        let mut config = NodeConfig::new("node-a", ip, CliqueId("c.0".into()));
        config.imex_poll.unready = Duration::from_millis(100);
        config.imex_restart_backoff_min = Duration::from_millis(20);
        config.imex_restart_backoff_max = Duration::from_millis(200);
        let supervisor = ImexProcessActor::new(Arc::new(daemon.clone()), &config).start();
        let reports = Arc::new(Mutex::new(Vec::new()));
        let owner = Reports(reports.clone()).start();
        supervisor.do_send(ApplyPeers {
            owner: owner.clone().recipient().downgrade(),
            version: 1,
            peers: alone(ip),
            claims_in_use: false,
        });
        wait_async(|| async { supervisor.send(GetImexLifecycle).await.unwrap().failures >= 3 })
            .await;
        let lifecycle = supervisor.send(GetImexLifecycle).await.unwrap();
        assert_eq!(lifecycle.starts, 0, "{lifecycle:?}");
        let why = lifecycle.last_failure.unwrap_or_default();
        assert!(why.contains(&format!("{ip}:{port}")), "{why}");
        assert!(lifecycle.restart_delay.is_some());

        // The holder's peer closes first, so that the holder's socket, which has no
        // SO_REUSEADDR, does not linger in TIME_WAIT on the port.
        let (mut holder, server) = held;
        drop(server);
        let _ = tokio::io::AsyncReadExt::read(&mut holder, &mut [0u8; 1]).await;
        drop(holder);
        wait(|| reports.lock().unwrap().last().is_some_and(|r| r.ready)).await;
        let lifecycle = supervisor.send(GetImexLifecycle).await.unwrap();
        assert_eq!(lifecycle.starts, 1, "{lifecycle:?}");
        supervisor.do_send(Detach { stop_daemon: true });
        wait_async(|| async { daemon.pid().await.is_none() }).await;
        drop(owner);
    });
}
