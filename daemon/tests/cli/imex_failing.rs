//! A failing IMEX daemon backs off and says why (issue 15), with real processes: a
//! formed domain of two `domaind run`, then node-02's IMEX server port is taken by
//! another socket (this test's) and its daemon killed. node-02 tries again ever more
//! slowly, says why in `/state` (the port and who holds it), in its metrics and in one
//! ImexFailing event; the status names it. Once the port is free the domain forms
//! again.

use domaind_testkit::poll_until_true;
use std::path::PathBuf;
use std::time::Duration;

use domaind_actors::model::{ClaimRef, ReadinessPolicy};
use domaind_backends::local::{ClaimFile, LocalDir};
use domaind_kube_api::crd::{ComputeDomainStatus, Phase};
use domaind_kubelet_plugin::DraVersion;

use crate::fixtures::claim_of;
use domaind_node::run::{NodeView, RunInfo};
use domaind_testbed::rack::{
    LocalRack, RackSpec, http_get, node_view, prepare_until_ready, short_temp_dir,
};

const CD: &str = "cd-failing";
const START_LIMIT: Duration = Duration::from_secs(30);
const LIMIT: Duration = Duration::from_secs(60);

fn claim(node: &str) -> (ClaimFile, ClaimRef) {
    claim_of(
        &format!("worker-{node}"),
        &format!("claim-{node}"),
        ("failing", CD, 2),
        ReadinessPolicy::Domain,
    )
}

fn status(local: &LocalDir) -> Option<ComputeDomainStatus> {
    local.read_status(CD).ok().flatten()
}

fn message(status: &ComputeDomainStatus) -> String {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

fn failing_events(local: &LocalDir) -> Vec<String> {
    local
        .read_events(CD)
        .unwrap()
        .into_iter()
        .filter(|e| e.reason == "ImexFailing")
        .map(|e| format!("{} {}", e.node, e.message))
        .collect()
}

async fn view(info: &RunInfo) -> NodeView {
    node_view(info).await.unwrap()
}

/// The sum of a metric's samples whose line starts with `name` (labels included).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_taken_from_imex_is_backed_off_reported_and_named_in_the_status() {
    let tmp = short_temp_dir("dif").unwrap();
    let mut spec = RackSpec::self_contained(
        2,
        PathBuf::from(env!("CARGO_BIN_EXE_domaind")),
        tmp.path().into(),
    );
    spec.subnet = domaind_loopback::CLI_IMEX_FAILING;
    spec.log_filter = "info,domaind_gossip=warn".into();
    spec.extra_args = vec!["--prepare-deadline".into(), "2s".into()];
    let mut rack = LocalRack::create(spec).unwrap();
    let infos = tokio::task::block_in_place(|| {
        rack.start_all()?;
        rack.wait_all_ready(START_LIMIT)
    })
    .unwrap();
    let local = rack.local().clone();
    let mut prepares = Vec::new();
    for i in 0..2 {
        let (file, claim) = claim(rack.node(i).name());
        local.write_claim(&file).unwrap();
        let socket = rack.node(i).dra_socket();
        prepares.push(tokio::spawn(async move {
            prepare_until_ready(&socket, &claim, DraVersion::V1, LIMIT).await
        }));
    }
    for prepare in prepares {
        prepare.await.unwrap().unwrap().unwrap();
    }
    poll_until_true("the domain is Ready", LIMIT, async || {
        status(&local).is_some_and(|s| s.status == Phase::Ready)
    })
    .await;

    let held = tokio::task::block_in_place(|| rack.take_imex_port(1, &mut 0)).unwrap();
    let me = std::process::id();
    let node2 = &infos[1];
    poll_until_true("node-02 says why in /state", LIMIT, async || {
        let imex = view(node2).await.imex;
        imex.failing
            && imex.last_failure.is_some_and(|why| {
                why.contains("(SERVER_PORT)") && why.contains(&format!("held by pid {me} ("))
            })
    })
    .await;
    poll_until_true("the status names node-02", LIMIT, async || {
        status(&local).is_some_and(|s| {
            s.status == Phase::NotReady && message(&s).ends_with("IMEX failing on: node-02")
        })
    })
    .await;

    // The waits double: seen from /state, each longer than the one before.
    let mut delays: Vec<u64> = Vec::new();
    poll_until_true("the restart delay grows to 3.2 s", LIMIT, async || {
        if let Some(delay) = view(node2).await.imex.restart_delay_ms
            && delays.last() != Some(&delay)
        {
            delays.push(delay);
        }
        delays.last().is_some_and(|d| *d >= 3200)
    })
    .await;
    assert!(
        delays.windows(2).all(|w| w[1] > w[0])
            && delays
                .iter()
                .all(|d| d % 200 == 0 && (d / 200).is_power_of_two()),
        "each wait doubles the last from 200 ms: {delays:?}"
    );
    let (_, metrics) = http_get(node2.http_addr, "/metrics").await.unwrap();
    assert_eq!(metric(&metrics, "domaind_imex_failing "), 1.0, "{metrics}");
    assert!(
        metric(
            &metrics,
            "domaind_imex_restarts_total{cause=\"start_failed\"}"
        ) >= 4.0,
        "{metrics}"
    );
    assert!(metric(&metrics, "domaind_imex_port_busy_total") >= 4.0);
    let events = failing_events(&local);
    assert!(
        matches!(events.as_slice(), [one] if one.starts_with("node-02 ")),
        "one ImexFailing event, from node-02, for all its failures: {events:?}"
    );

    // Free again: the next try starts it, and the domain forms.
    drop(held);
    poll_until_true("the domain is Ready again", LIMIT, async || {
        status(&local).is_some_and(|s| s.status == Phase::Ready && message(&s) == "2/2 nodes ready")
    })
    .await;
    assert!(
        !view(node2)
            .await
            .imex
            .last_failure
            .unwrap_or_default()
            .is_empty()
    );
    assert_eq!(failing_events(&local).len(), 1);
    tokio::task::block_in_place(|| rack.stop_all(Duration::from_secs(30)));
}
