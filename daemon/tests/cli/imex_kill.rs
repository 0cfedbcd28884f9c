//! `domaind imex kill` as an operator runs it: against a real `domaind run` (the local
//! backend, its built-in IMEX simulator), it SIGKILLs the node's IMEX daemon, says
//! which, and the node starts a new one, which its `/state` counts. Where there is no
//! IMEX daemon to kill, it exits 1 and says why.
//!
//! Every call names the node with `--parent`: other tests of this binary run racks of
//! their own on this machine at the same time, and their IMEX daemons are not ours.

use domaind_testkit::poll_until;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use domaind_actors::model::{ClaimRef, ReadinessPolicy};
use domaind_backends::local::ClaimFile;
use domaind_imex::processes::parse_killed;
use domaind_kubelet_plugin::DraVersion;

use crate::fixtures::claim_of;
use domaind_node::run::{ImexView, RunInfo};
use domaind_testbed::rack::{
    LocalRack, RackSpec, http_get, node_view, prepare_until_ready, short_temp_dir,
};

const START_LIMIT: Duration = Duration::from_secs(30);
const LIMIT: Duration = Duration::from_secs(60);

fn claim() -> (ClaimFile, ClaimRef) {
    claim_of(
        "worker",
        "kill-claim",
        ("kill", "cd-kill", 1),
        ReadinessPolicy::Local,
    )
}

fn imex_kill(parent: u32) -> Output {
    Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args(["imex", "kill", "--parent", &parent.to_string()])
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether `pid` is a process that has not ended (a zombie has).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat[stat.rfind(')')? + 1..].split_whitespace().next()?;
            Some(!matches!(state, "Z" | "X"))
        })
        .unwrap_or(false)
}

/// The sum of a metric's samples whose line starts with `name` (labels included).
async fn metric(info: &RunInfo, name: &str) -> f64 {
    let (_, text) = http_get(info.http_addr, "/metrics").await.unwrap();
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn imex_view(info: &RunInfo) -> ImexView {
    node_view(info).await.unwrap().imex
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imex_kill_kills_the_nodes_imex_daemon_and_the_node_starts_another() {
    let tmp = short_temp_dir("dik").unwrap();
    let mut spec = RackSpec::self_contained(
        1,
        PathBuf::from(env!("CARGO_BIN_EXE_domaind")),
        tmp.path().into(),
    );
    spec.subnet = domaind_loopback::CLI_IMEX_KILL;
    spec.log_filter = "info,domaind_gossip=warn".into();
    let mut rack = LocalRack::create(spec).unwrap();
    let info = tokio::task::block_in_place(|| {
        rack.start(0)?;
        rack.wait_ready(0, START_LIMIT)
    })
    .unwrap();
    let node = rack.node(0).pid().unwrap();

    // No domain yet, so no IMEX daemon: nothing to kill, and it says so.
    let idle = imex_kill(node);
    assert_eq!(idle.status.code(), Some(1), "{idle:?}");
    let said = text(&idle.stderr);
    assert!(
        said.contains(&format!(
            "no IMEX daemon runs under `domaind run` pid {node}:"
        )),
        "{said}"
    );
    assert!(idle.stdout.is_empty(), "{idle:?}");

    // A process that is not a `domaind run` is refused by name.
    let me = std::process::id();
    let other = imex_kill(me);
    assert_eq!(other.status.code(), Some(1), "{other:?}");
    let said = text(&other.stderr);
    assert!(
        said.contains(&format!("process {me} is not a running `domaind run`")),
        "{said}"
    );

    // A claim of a one-node domain: the node starts its IMEX daemon.
    let (file, claim) = claim();
    rack.local().write_claim(&file).unwrap();
    prepare_until_ready(&rack.node(0).dra_socket(), &claim, DraVersion::V1, LIMIT)
        .await
        .unwrap()
        .unwrap();
    let first = poll_until("the node's IMEX daemon runs", LIMIT, async || {
        let daemons = rack.imex_daemons().unwrap().remove(0);
        let view = imex_view(&info).await;
        (view.running && daemons.len() == 1).then(|| (daemons[0], view))
    })
    .await;
    let (imex, before) = first;
    let restarts_counted = metric(&info, "domaind_imex_restarts_total").await;
    // The node daemon describes its metrics (the book's metrics page lists the same).
    let (_, exposed) = http_get(info.http_addr, "/metrics").await.unwrap();
    assert!(
        exposed.contains("# HELP domaind_imex_status_queries_total Status questions"),
        "{exposed}"
    );

    let killed = imex_kill(node);
    let stdout = text(&killed.stdout);
    assert!(
        killed.status.success(),
        "{killed:?}\n{}",
        text(&killed.stderr)
    );
    assert_eq!(parse_killed(&stdout), [imex], "{stdout}");
    assert!(
        stdout.starts_with(&format!(
            "killed IMEX daemon {imex} (child of domaind run {node}): "
        )),
        "{stdout}"
    );

    poll_until("the killed IMEX daemon is gone", LIMIT, async || {
        (!alive(imex)).then_some(())
    })
    .await;
    let (again, after) = poll_until("the node runs a new IMEX daemon", LIMIT, async || {
        let daemons = rack.imex_daemons().unwrap().remove(0);
        let view = imex_view(&info).await;
        let new = daemons.len() == 1 && daemons[0] != imex && alive(daemons[0]);
        (new && view.running && view.starts > before.starts).then(|| (daemons[0], view))
    })
    .await;
    assert_ne!(again, imex);
    assert_eq!(after.restarts, before.restarts + 1, "{before:?} {after:?}");
    assert_eq!(after.starts, before.starts + 1, "{before:?} {after:?}");
    assert!(after.last_failure.is_some(), "{after:?}");
    assert_eq!(
        metric(&info, "domaind_imex_restarts_total").await,
        restarts_counted + 1.0
    );

    rack.stop(0, START_LIMIT).unwrap();
}
