//! End to end: a loopback rack of three NVLink cliques of three `domaind run`
//! processes. Each clique forms its own ComputeDomain, and nothing of gossip or IMEX
//! ever reaches across cliques.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::time::Duration;

use domaind_actors::model::{AllocationMode, ClaimRef, Phase, ReadinessPolicy};
use domaind_backends::local::{ClaimFile, ComputeDomainRef};
use domaind_kube_api::crd;
use domaind_kubelet_plugin::DraVersion;
use domaind_node::run::NodeView;
use domaind_testbed::rack::{LocalRack, RackSpec, http_get, node_view, prepare_until_ready};
use domaind_testkit::poll_until_every;

const CLIQUES: usize = 3;
const PER_CLIQUE: usize = 3;
const START_LIMIT: Duration = Duration::from_secs(30);
const LIMIT: Duration = Duration::from_secs(90);

/// What a daemon logs when a Syn reaches a node of another gossip cluster: ours (the
/// receiver drops it, the sender of a BadCluster answer), and chitchat's own, in case
/// one ever reaches chitchat.
const FOREIGN_SYN_LOG_LINES: &[&str] = &[
    "from another cluster (another clique)",
    "of another cluster (another clique)",
    "received SYN message addressed to a different cluster",
    "message rejected by peer: wrong cluster",
];

/// Counters of `/metrics` that count Syns from another gossip cluster.
const FOREIGN_SYN_COUNTERS: &[&str] = &["domaind_gossip_foreign_cluster_total"];

fn domain_uid(clique: usize) -> String {
    format!("0b7c2a8e-5d1f-4c39-9a64-e2e0c11c0{clique:03}")
}

fn claim_uid(node: &str) -> String {
    format!("c-{node}")
}

fn claim_file(node: &str, clique: usize) -> ClaimFile {
    ClaimFile {
        namespace: "team-c".into(),
        name: format!("claim-{node}"),
        uid: claim_uid(node),
        compute_domain: ComputeDomainRef {
            namespace: "team-c".into(),
            name: format!("training-{clique}"),
            uid: domain_uid(clique),
            num_nodes: PER_CLIQUE as u32,
            isolation: Default::default(),
        },
        allocation_mode: AllocationMode::Single,
        readiness: Some(ReadinessPolicy::Domain),
        driver: None,
        device: None,
        admin_access: false,
    }
}

fn claim_ref(node: &str) -> ClaimRef {
    ClaimRef {
        uid: claim_uid(node),
        namespace: "team-c".into(),
        name: format!("claim-{node}"),
    }
}

/// The names of clique `clique`'s nodes.
fn clique_names(rack: &LocalRack, clique: usize) -> BTreeSet<String> {
    rack.clique_members(clique)
        .into_iter()
        .map(|i| rack.node(i).name().to_owned())
        .collect()
}

async fn views(rack: &LocalRack) -> Vec<Option<NodeView>> {
    let mut views = Vec::new();
    for node in rack.nodes() {
        views.push(node_view(node.info().expect("ready")).await.ok());
    }
    views
}

/// Node `node` is in its clique's domain, Ready with every clique-mate, and its IMEX
/// peers and gossip members are exactly its clique-mates.
fn whole(rack: &LocalRack, node: usize, view: &NodeView) -> bool {
    let mates = clique_names(rack, rack.clique_of(node));
    let [domain] = view.domains.as_slice() else {
        return false;
    };
    let members: BTreeSet<String> = domain.members.iter().cloned().collect();
    let peers: BTreeSet<String> = domain.peers.values().cloned().collect();
    let gossip: BTreeSet<String> = view.gossip.members.iter().cloned().collect();
    domain.uid == domain_uid(rack.clique_of(node))
        && domain.phase == Phase::Ready
        && domain.local_ready
        && members == mates
        && peers == mates
        && gossip == mates
}

/// Evidence of gossip frames between cliques on node `node`: the foreign-cluster log
/// lines in its log, and the foreign-cluster counters of its `/metrics`.
async fn foreign_frames(rack: &LocalRack, node: usize) -> Vec<String> {
    let log = std::fs::read_to_string(rack.node(node).log_path()).unwrap();
    let mut evidence: Vec<String> = log
        .lines()
        .filter(|line| FOREIGN_SYN_LOG_LINES.iter().any(|m| line.contains(m)))
        .map(str::to_owned)
        .collect();
    let info = rack.node(node).info().expect("ready");
    let (code, metrics) = http_get(info.http_addr, "/metrics").await.unwrap();
    assert_eq!(code, 200, "{metrics}");
    for line in metrics.lines() {
        let Some((name, value)) = line.split_once(' ') else {
            continue;
        };
        let counter = name.split('{').next().unwrap_or(name);
        if FOREIGN_SYN_COUNTERS.contains(&counter) && value.trim() != "0" {
            evidence.push(line.to_owned());
        }
    }
    evidence
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_cliques_form_three_domains_and_nothing_crosses_cliques() {
    let tmp = domaind_testbed::rack::short_temp_dir("dmq").unwrap();
    let mut spec = RackSpec::new(
        CLIQUES * PER_CLIQUE,
        domaind_e2e::binaries().domaind.clone(),
        domaind_e2e::binaries().imex_sim.clone(),
        tmp.path().into(),
    );
    spec.cliques = CLIQUES;
    spec.subnet = domaind_loopback::E2E_CLIQUES;
    // chitchat's own WARN lines must reach the log: they are the evidence.
    spec.log_filter = "info".into();
    spec.extra_args = vec!["--prepare-deadline".into(), "2s".into()];
    let mut rack = LocalRack::create(spec).unwrap();
    for clique in 0..CLIQUES {
        assert_eq!(rack.clique_members(clique).len(), PER_CLIQUE);
    }
    rack.start_all().unwrap();
    rack.wait_all_ready(START_LIMIT).unwrap();

    for (i, node) in rack.nodes().iter().enumerate() {
        rack.local()
            .write_claim(&claim_file(node.name(), rack.clique_of(i)))
            .unwrap();
    }
    let prepares = rack.nodes().iter().map(|node| {
        let (socket, claim) = (node.dra_socket(), claim_ref(node.name()));
        async move { prepare_until_ready(&socket, &claim, DraVersion::V1, LIMIT).await }
    });
    for (node, answer) in rack
        .nodes()
        .iter()
        .zip(futures::future::join_all(prepares).await)
    {
        let devices = answer
            .unwrap()
            .unwrap_or_else(|error| panic!("{} not prepared: {error}", node.name()));
        assert_eq!(devices.len(), 1, "{devices:?}");
    }

    // Each look asks every node for its /state: at a pace the rack's daemons bear.
    let last_seen = RefCell::new(None);
    let formed = poll_until_every(Duration::from_millis(100), LIMIT, || {
        let (rack, last_seen) = (&rack, &last_seen);
        async move {
            let views = views(rack).await;
            let statuses: Vec<_> = (0..CLIQUES)
                .map(|c| rack.local().read_status(&domain_uid(c)).unwrap())
                .collect();
            let nodes_whole = views
                .iter()
                .enumerate()
                .all(|(i, view)| view.as_ref().is_some_and(|v| whole(rack, i, v)));
            let statuses_whole = statuses.iter().enumerate().all(|(c, status)| {
                status.as_ref().is_some_and(|s| {
                    let listed: BTreeSet<String> = s.nodes.iter().map(|n| n.name.clone()).collect();
                    s.status == crd::Phase::Ready
                        && s.ready_nodes as usize == PER_CLIQUE
                        && listed == clique_names(rack, c)
                })
            });
            if nodes_whole && statuses_whole {
                return Some(());
            }
            last_seen.replace(Some((views, statuses)));
            None
        }
    })
    .await;
    if formed.is_none() {
        let (views, statuses) = last_seen.into_inner().expect("a look before the limit");
        panic!(
            "three domains of their cliques only did not form within {LIMIT:?}; \
             views: {views:#?}; statuses: {statuses:#?}"
        );
    }

    // One gossip cluster per clique.
    let views = views(&rack).await;
    let clusters: Vec<String> = views
        .iter()
        .map(|v| v.as_ref().unwrap().gossip.cluster_id.clone())
        .collect();
    for (i, cluster) in clusters.iter().enumerate() {
        for (j, other) in clusters.iter().enumerate() {
            assert_eq!(
                cluster == other,
                rack.clique_of(i) == rack.clique_of(j),
                "{clusters:?}"
            );
        }
    }

    // Since each daemon started, not a single Syn reached another clique: the seeds
    // name clique-mates only, and a node knowing all its seeds adds no random one.
    // The first rounds, when nobody knows anybody yet, are in these logs too: that is
    // when a seed of another clique would have been tried.
    for node in 0..rack.nodes().len() {
        let evidence = foreign_frames(&rack, node).await;
        assert!(
            evidence.is_empty(),
            "{} saw gossip frames from or to another clique: {evidence:#?}",
            rack.node(node).name()
        );
    }
    tokio::task::block_in_place(|| rack.stop_all(Duration::from_secs(20)));
    assert_eq!(rack.unexpected_exits(), Vec::<String>::new());
}
