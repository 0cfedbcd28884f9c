//! The IMEX adapter driving real `imex-sim` processes on loopback: readiness means
//! the simulated daemons really connected to each other.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use domaind_actors::ports::Imex;
use domaind_actors::rules::peers::{Peer, PeerSet};
use domaind_imex::{AddressingMode, Command, ImexDaemon, ImexSettings};
use domaind_testbed::rack::imex_ports;
use domaind_testkit::poll_until_every;

use crate::supervisor::STATUS_POLL;

const LIMIT: Duration = Duration::from_secs(20);

fn ip(octet: u8) -> IpAddr {
    domaind_loopback::addr(domaind_loopback::NODE_IMEX_SIM_TESTS, octet).into()
}

struct Node {
    ip: IpAddr,
    daemon: ImexDaemon,
}

fn settings(
    dir: &Path,
    ip: IpAddr,
    server_port: u16,
    cmd_port: u16,
    mode: AddressingMode,
) -> ImexSettings {
    let sim = env!("CARGO_BIN_EXE_imex-sim");
    let node_dir = dir.join(ip.to_string());
    let mut s = ImexSettings::new(&node_dir, ip);
    s.daemon = Command::new(sim);
    s.ctl = Command::new(sim).arg("ctl");
    s.hosts_file = node_dir.join("hosts");
    s.daemon_env = vec![(
        domaind_testbed::imex_sim::HOSTS_ENV.into(),
        s.hosts_file.display().to_string(),
    )];
    s.mode = mode;
    s.server_port = server_port;
    s.cmd_port = cmd_port;
    s.max_slots = 8;
    s.stop_timeout = Duration::from_millis(500);
    s.reload_min_interval = Duration::from_millis(300);
    s
}

fn rack(dir: &Path, octets: &[u8], mode: AddressingMode) -> Vec<Node> {
    let ips: Vec<IpAddr> = octets.iter().map(|o| ip(*o)).collect();
    let (server_port, cmd_port) = imex_ports::pick(&ips).unwrap();
    ips.iter()
        .map(|ip| Node {
            ip: *ip,
            daemon: ImexDaemon::new(settings(dir, *ip, server_port, cmd_port, mode)),
        })
        .collect()
}

fn peer_set(nodes: &[&Node]) -> PeerSet {
    PeerSet {
        peers: nodes
            .iter()
            .enumerate()
            .map(|(slot, n)| {
                (
                    slot as u16,
                    Peer {
                        node: format!("node-{}", n.ip),
                        ip: n.ip,
                    },
                )
            })
            .collect(),
    }
}

async fn wait_ready(nodes: &[&Node], want: bool) {
    // Each look is a status query (a process) per node.
    poll_until_every(STATUS_POLL * 2, LIMIT, || async {
        for node in nodes {
            let status = node.daemon.status().await.unwrap_or_default();
            if !(status.running && status.ready == want) {
                return None;
            }
        }
        Some(())
    })
    .await
    .unwrap_or_else(|| panic!("not all {} ready={want} in {LIMIT:?}", nodes.len()));
}

async fn stop_all(nodes: &[Node]) {
    for node in nodes {
        node.daemon.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_daemons_connect_and_become_ready() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = rack(dir.path(), &[61, 62, 63], AddressingMode::DnsNames);
    let all: Vec<&Node> = nodes.iter().collect();
    let peers = peer_set(&all);
    for node in &nodes {
        node.daemon.start(&peers).await.unwrap();
    }
    wait_ready(&all, true).await;
    let status = nodes[0].daemon.status().await.unwrap();
    assert_eq!(status.links.len(), 2, "links to the two others: {status:?}");
    assert!(status.links.values().all(|up| *up));
    stop_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_membership_change_rewrites_hosts_and_signals_without_restarting() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = rack(dir.path(), &[64, 65, 66], AddressingMode::DnsNames);
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let two = peer_set(&[a, b]);
    a.daemon.start(&two).await.unwrap();
    b.daemon.start(&two).await.unwrap();
    wait_ready(&[a, b], true).await;
    let pids = (a.daemon.pid().await, b.daemon.pid().await);

    let three = peer_set(&[a, b, c]);
    c.daemon.start(&three).await.unwrap();
    a.daemon.apply(&three).await.unwrap();
    b.daemon.apply(&three).await.unwrap();
    wait_ready(&[a, b, c], true).await;
    assert_eq!(
        (a.daemon.pid().await, b.daemon.pid().await),
        pids,
        "IMEX was restarted"
    );
    let hosts = std::fs::read_to_string(&a.daemon.settings().hosts_file).unwrap();
    assert!(
        hosts.contains(&format!("{}\tdomaind-imex-slot-002", c.ip)),
        "{hosts}"
    );
    let nodes_config = std::fs::read_to_string(a.daemon.settings().nodes_config_path()).unwrap();
    assert_eq!(nodes_config.lines().count(), 8, "one stable name per slot");
    stop_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_peer_makes_the_others_not_ready_until_it_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = rack(dir.path(), &[67, 68, 69], AddressingMode::DnsNames);
    let all: Vec<&Node> = nodes.iter().collect();
    let peers = peer_set(&all);
    for node in &nodes {
        node.daemon.start(&peers).await.unwrap();
    }
    wait_ready(&all, true).await;

    // node C's daemon crashes.
    crash(&nodes[2]).await;
    wait_ready(&all[..2], false).await;
    let status = nodes[0].daemon.status().await.unwrap();
    assert_eq!(status.links.get(&2), Some(&false), "{status:?}");
    assert!(
        !nodes[2].daemon.status().await.unwrap().running,
        "the crash was noticed"
    );

    // Dropped from the peer set: the survivors are ready again.
    let survivors = peer_set(&all[..2]);
    nodes[0].daemon.apply(&survivors).await.unwrap();
    nodes[1].daemon.apply(&survivors).await.unwrap();
    wait_ready(&all[..2], true).await;
    stop_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_ip_mode_a_membership_change_restarts_imex() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = rack(dir.path(), &[70, 71], AddressingMode::Ips);
    let (a, b) = (&nodes[0], &nodes[1]);
    a.daemon.start(&peer_set(&[a])).await.unwrap();
    let before = a.daemon.pid().await;
    let both = peer_set(&[a, b]);
    b.daemon.start(&both).await.unwrap();
    a.daemon.apply(&both).await.unwrap();
    assert_ne!(
        a.daemon.pid().await,
        before,
        "IPs mode restarts IMEX on a change"
    );
    wait_ready(&[a, b], true).await;
    let nodes_config = std::fs::read_to_string(a.daemon.settings().nodes_config_path()).unwrap();
    assert_eq!(nodes_config, format!("{}\n{}\n", a.ip, b.ip));
    stop_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_daemon_is_killed_after_the_stop_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = rack(dir.path(), &[72], AddressingMode::DnsNames);
    let a = &nodes[0];
    a.daemon.start(&peer_set(&[a])).await.unwrap();
    wait_ready(&[a], true).await;
    ctl(a, "--hang").await;
    let status = a.daemon.status().await;
    assert!(status.is_err(), "a hung daemon does not answer: {status:?}");
    let pid = a.daemon.pid().await.unwrap();
    a.daemon.stop().await.unwrap();
    assert!(a.daemon.pid().await.is_none());
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists() || is_zombie(pid),
        "SIGKILL did not land"
    );
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

async fn ctl(node: &Node, what: &str) {
    let s = node.daemon.settings();
    let _ = tokio::process::Command::new(&s.ctl.program)
        .args(&s.ctl.args)
        .arg("-c")
        .arg(s.config_path())
        .arg(what)
        .arg("-t")
        .arg("1000")
        .output()
        .await
        .unwrap();
}

async fn crash(node: &Node) {
    ctl(node, "--crash").await;
}

#[tokio::test]
async fn a_missing_imex_binary_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = ImexSettings::new(dir.path(), ip(73));
    s.daemon = Command::new("/nonexistent/nvidia-imex");
    s.hosts_file = dir.path().join("hosts");
    let daemon = ImexDaemon::new(s);
    let node = Node { ip: ip(73), daemon };
    let err = node
        .daemon
        .start(&peer_set(&[&node]))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot start the IMEX daemon /nonexistent/nvidia-imex"),
        "{err}"
    );
    assert!(err.contains("imex-sim"), "{err}");
    assert!(!node.daemon.status().await.unwrap().running);
}

/// Whether `pid` has a handler for SIGUSR1 (`SigCgt` in /proc/PID/status).
fn catches_sigusr1(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let caught = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .map(|mask| u64::from_str_radix(mask.trim(), 16).unwrap())
        .unwrap();
    caught & (1 << (nix::sys::signal::Signal::SIGUSR1 as i32 - 1)) != 0
}

/// The real IMEX's contract: SIGUSR1 reconnects. A supervisor may send it as soon as
/// it can reach the daemon, so the simulator's handlers must be in place by the time
/// it listens: it is checked at the first moment a connection gets through, many
/// times, since the window it had was short.
#[test]
fn the_simulator_handles_sigusr1_before_it_listens() {
    let dir = tempfile::tempdir().unwrap();
    let ip = ip(74);
    let (server_port, cmd_port) = imex_ports::pick(&[ip]).unwrap();
    let s = settings(
        dir.path(),
        ip,
        server_port,
        cmd_port,
        AddressingMode::DnsNames,
    );
    std::fs::create_dir_all(&s.config_dir).unwrap();
    std::fs::write(s.config_path(), domaind_imex::config::render_config(&s)).unwrap();
    std::fs::write(s.nodes_config_path(), "").unwrap();
    let target = SocketAddr::new(ip, s.server_port);
    for _ in 0..30 {
        let mut child = std::process::Command::new(&s.daemon.program)
            .arg("-c")
            .arg(s.config_path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + LIMIT;
        while std::net::TcpStream::connect(target).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "imex-sim never listened"
            );
            if child.try_wait().unwrap().is_some() {
                let output = child.wait_with_output().unwrap();
                panic!(
                    "imex-sim exited ({}) before it listened: {}",
                    output.status,
                    String::from_utf8_lossy(&output.stderr)
                );
            }
        }
        let handled = catches_sigusr1(child.id());
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            handled,
            "imex-sim listened before it could take SIGUSR1: {stderr}"
        );
        assert!(
            output.status.success(),
            "SIGTERM is a clean shutdown: {}: {stderr}",
            output.status
        );
    }
}

/// What a job on A sees of its import from B and C (issue 28): a reload and a link
/// that drops and comes back to the same daemon break nothing; a new instance of B
/// breaks it; dropping C from A's config breaks an import of C.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_breaks_on_a_new_instance_or_a_dropped_peer_and_nothing_else() {
    use domaind_testbed::imex_sim::imports::Import;
    use domaind_testbed::imex_sim::run_ctl;
    use std::collections::BTreeMap;

    let dir = tempfile::tempdir().unwrap();
    let nodes = rack(dir.path(), &[101, 102, 103], AddressingMode::DnsNames);
    let all: Vec<&Node> = nodes.iter().collect();
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    for node in &nodes {
        node.daemon.start(&peer_set(&all)).await.unwrap();
    }
    wait_ready(&all, true).await;
    let ask = async |node: &Node, command: &str| {
        run_ctl(&node.daemon.settings().config_path(), command, LIMIT)
            .await
            .unwrap()
            .trim()
            .to_owned()
    };
    let import = async |from: &[&Node]| {
        let peers: Vec<String> = from.iter().map(|n| n.ip.to_string()).collect();
        let reply = ask(a, &format!("import {}", peers.join(","))).await;
        reply
            .strip_prefix("IMPORT ")
            .unwrap_or_else(|| panic!("{reply}"))
            .parse::<u64>()
            .unwrap()
    };
    let imports = async || -> BTreeMap<u64, Import> {
        serde_json::from_str(&ask(a, "imports").await).unwrap()
    };
    let of_b = import(&[b]).await;
    let of_c = import(&[c]).await;
    assert!(
        ask(a, &format!("import {}", ip(104)))
            .await
            .starts_with("ERROR not linked"),
        "an import from a peer it is not linked to is refused"
    );

    // A reload drops every link and dials again: to the same instances.
    a.daemon.reload().await.unwrap();
    wait_ready(&all, true).await;
    assert!(imports().await.values().all(|i| i.broken.is_none()));

    // B restarts: a new instance.
    crash(b).await;
    wait_ready(&[a, c], false).await;
    b.daemon.start(&peer_set(&all)).await.unwrap();
    wait_ready(&all, true).await;
    let now = imports().await;
    let why = now[&of_b]
        .broken
        .clone()
        .expect("B's memory was cleaned up");
    assert!(why.contains("new IMEX instance"), "{why}");
    assert_eq!(now[&of_c].broken, None, "C did not restart");

    // C dropped from A's config.
    let of_c_again = of_c;
    a.daemon.apply(&peer_set(&[a, b])).await.unwrap();
    let imports = &imports;
    let broken = poll_until_every(STATUS_POLL, LIMIT, || async move {
        imports().await[&of_c_again].broken.clone()
    })
    .await;
    let Some(why) = broken else {
        panic!("C's import never broke: {:?}", imports().await);
    };
    assert!(why.contains("dropped from the IMEX config"), "{why}");
    stop_all(&nodes).await;
}

/// A peer that goes silent without closing anything (here SIGSTOPped; a partition or a
/// dead host alike) is seen disconnected; once it speaks again the link comes back to
/// the same instance, and nothing imported from it broke.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_peer_is_seen_disconnected_and_comes_back_the_same() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    let dir = tempfile::tempdir().unwrap();
    let nodes = rack(dir.path(), &[105, 106], AddressingMode::DnsNames);
    let all: Vec<&Node> = nodes.iter().collect();
    for node in &nodes {
        node.daemon.start(&peer_set(&all)).await.unwrap();
    }
    wait_ready(&all, true).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let config = a.daemon.settings().config_path();
    let reply = domaind_testbed::imex_sim::run_ctl(&config, &format!("import {}", b.ip), LIMIT)
        .await
        .unwrap();
    assert!(reply.starts_with("IMPORT "), "{reply}");

    let pid = Pid::from_raw(b.daemon.pid().await.unwrap() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    wait_ready(&[a], false).await;
    kill(pid, Signal::SIGCONT).unwrap();
    wait_ready(&all, true).await;
    let imports = domaind_testbed::imex_sim::run_ctl(&config, "imports", LIMIT)
        .await
        .unwrap();
    assert!(!imports.contains("broken"), "{imports}");
    stop_all(&nodes).await;
}

/// Our own reload restarts IMEX's outgoing links (as SIGUSR1 does to IMEX): a link down
/// until it is up again says nothing of the peer, and a node that was ready stays ready
/// for the relink hold. Peer `b` is stopped, so `a`'s link to it cannot come back;
/// without the rule `a` would list `b` down at once (a peer-health rule drops a silent
/// peer on that) and turn not ready on our reload.
/// A status tool slower than the hold (a loaded node) answers about the moment it was
/// asked: asked within the hold after our reload, a link the reload restarted is no
/// evidence, however late the answer comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_status_answer_is_judged_when_it_was_asked() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    let dir = tempfile::tempdir().unwrap();
    let mut nodes = rack(dir.path(), &[111, 112], AddressingMode::DnsNames);
    let hold = Duration::from_secs(2);
    let mut settings = nodes[0].daemon.settings().clone();
    settings.relink_hold = hold;
    let all: Vec<&Node> = nodes.iter().collect();
    for node in &all {
        node.daemon.start(&peer_set(&all)).await.unwrap();
    }
    wait_ready(&all, true).await;
    // Node a's tool now takes longer than the hold to answer: a not-ready status asks
    // twice (ready, then the links), so its answer comes after 2.4 s.
    let real = settings.ctl.clone();
    let mut slow = Command::new("/bin/sh")
        .arg("-c")
        .arg("sleep 1.2; exec \"$0\" \"$@\"")
        .arg(real.program.display().to_string());
    slow.args.extend(real.args.iter().cloned());
    settings.ctl = slow;
    nodes[0].daemon.stop().await.unwrap();
    nodes[0].daemon = ImexDaemon::new(settings);
    let all: Vec<&Node> = nodes.iter().collect();
    nodes[0].daemon.start(&peer_set(&all)).await.unwrap();
    wait_ready(&all, true).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let pid = Pid::from_raw(b.daemon.pid().await.unwrap() as i32);

    kill(pid, Signal::SIGSTOP).unwrap();
    a.daemon.reload().await.unwrap();
    let status = a.daemon.status().await.unwrap();
    kill(pid, Signal::SIGCONT).unwrap();
    assert!(status.ready, "asked within the hold: {status:?}");
    assert_eq!(status.links.get(&1), None, "{status:?}");
    stop_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_our_reload_restarted_is_no_evidence_and_the_node_stays_ready_for_the_hold() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    let dir = tempfile::tempdir().unwrap();
    let mut nodes = rack(dir.path(), &[109, 110], AddressingMode::DnsNames);
    // Long enough that a loaded machine's status questions see it.
    let hold = Duration::from_secs(3);
    let mut settings = nodes[0].daemon.settings().clone();
    settings.relink_hold = hold;
    nodes[0].daemon = ImexDaemon::new(settings);
    let all: Vec<&Node> = nodes.iter().collect();
    for node in &nodes {
        node.daemon.start(&peer_set(&all)).await.unwrap();
    }
    wait_ready(&all, true).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let b_slot = 1;
    let pid = Pid::from_raw(b.daemon.pid().await.unwrap() as i32);

    kill(pid, Signal::SIGSTOP).unwrap();
    a.daemon.reload().await.unwrap();
    // Until the hold is over: ready, and b's link unlisted (once the reload is sent).
    let deadline = tokio::time::Instant::now() + LIMIT;
    let mut held = false;
    loop {
        let status = a.daemon.status().await.unwrap();
        if status.ready {
            assert_ne!(status.links.get(&b_slot), Some(&false), "{status:?}");
        } else {
            assert!(held, "not ready before the hold: {status:?}");
            assert_eq!(
                status.links.get(&b_slot),
                None,
                "never up since: {status:?}"
            );
            break;
        }
        held |= !status.links.contains_key(&b_slot);
        assert!(tokio::time::Instant::now() < deadline, "{status:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Back, then silent with no reload of ours: now its link down is evidence.
    kill(pid, Signal::SIGCONT).unwrap();
    wait_ready(&all, true).await;
    kill(pid, Signal::SIGSTOP).unwrap();
    let link_down = poll_until_every(STATUS_POLL, LIMIT, || async {
        let status = a.daemon.status().await.unwrap();
        (status.links.get(&b_slot) == Some(&false)).then_some(status)
    })
    .await;
    let Some(status) = link_down else {
        panic!("b's link never down: {:?}", a.daemon.status().await);
    };
    assert!(!status.ready, "{status:?}");
    kill(pid, Signal::SIGCONT).unwrap();
    stop_all(&nodes).await;
}
