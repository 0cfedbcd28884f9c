//! End to end: a node whose NVLink fabric registers in another clique while its daemon
//! runs. A loopback rack of two cliques of two, the fake topology file rewritten under
//! the running daemons: the node leaves its domain in the old clique (its old mate
//! sees it leave, never lose it), gossips in the new clique's cluster only, and forms
//! the domain with the new clique's member, its IMEX daemon never restarted.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::time::Duration;

use domaind_actors::model::{AllocationMode, ClaimRef, Phase, ReadinessPolicy};
use domaind_backends::local::{ClaimFile, ComputeDomainRef};
use domaind_kubelet_plugin::DraVersion;
use domaind_node::run::NodeView;
use domaind_testbed::rack::{LocalRack, RackSpec, http_get, node_view, prepare_until_ready};
use domaind_testkit::poll_until_every;

const START_LIMIT: Duration = Duration::from_secs(30);
const LIMIT: Duration = Duration::from_secs(90);
const DOMAIN_UID: &str = "5e0c7a7e-1d3f-4b1a-8c2e-c11c0e00f001";
/// The node that moves (node-02), from clique 0 to clique 1.
const MOVER: usize = 1;

fn claim_uid(node: &str) -> String {
    format!("c-{node}")
}

fn claim_file(node: &str) -> ClaimFile {
    ClaimFile {
        namespace: "team-m".into(),
        name: format!("claim-{node}"),
        uid: claim_uid(node),
        compute_domain: ComputeDomainRef {
            namespace: "team-m".into(),
            name: "training".into(),
            uid: DOMAIN_UID.into(),
            num_nodes: 0,
            isolation: Default::default(),
        },
        allocation_mode: AllocationMode::Single,
        readiness: Some(ReadinessPolicy::Local),
        driver: None,
        device: None,
        admin_access: false,
    }
}

fn names(rack: &LocalRack, nodes: &[usize]) -> BTreeSet<String> {
    nodes
        .iter()
        .map(|i| rack.node(*i).name().to_owned())
        .collect()
}

async fn view(rack: &LocalRack, node: usize) -> Option<NodeView> {
    node_view(rack.node(node).info()?).await.ok()
}

/// Node `node`'s domain is Ready with exactly `members` as members and IMEX peers,
/// nobody lost.
fn formed_with(view: &NodeView, members: &BTreeSet<String>) -> bool {
    let [domain] = view.domains.as_slice() else {
        return false;
    };
    let listed: BTreeSet<String> = domain.members.iter().cloned().collect();
    let peers: BTreeSet<String> = domain.peers.values().cloned().collect();
    domain.uid == DOMAIN_UID
        && domain.phase == Phase::Ready
        && domain.local_ready
        && domain.lost.is_empty()
        && &listed == members
        && &peers == members
}

/// Waits until `check` holds for every node's view; panics with the last views.
async fn wait_for(rack: &LocalRack, what: &str, check: impl Fn(&[Option<NodeView>]) -> bool) {
    let last = RefCell::new(Vec::new());
    let held = poll_until_every(Duration::from_millis(100), LIMIT, || {
        let (last, check) = (&last, &check);
        async move {
            let mut views = Vec::new();
            for node in 0..rack.nodes().len() {
                views.push(view(rack, node).await);
            }
            if check(&views) {
                return Some(());
            }
            last.replace(views);
            None
        }
    })
    .await;
    if held.is_none() {
        panic!("{what} within {LIMIT:?}; views: {:#?}", last.into_inner());
    }
}

async fn metric(rack: &LocalRack, node: usize, name: &str) -> Option<String> {
    let info = rack.node(node).info().expect("ready");
    let (code, metrics) = http_get(info.http_addr, "/metrics").await.unwrap();
    assert_eq!(code, 200, "{metrics}");
    metrics
        .lines()
        .find(|line| line.starts_with(name))
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_fabric_registers_in_another_clique_moves_there_and_reforms() {
    let tmp = domaind_testbed::rack::short_temp_dir("dmm").unwrap();
    let mut spec = RackSpec::new(
        4,
        domaind_e2e::binaries().domaind.clone(),
        domaind_e2e::binaries().imex_sim.clone(),
        tmp.path().into(),
    );
    spec.cliques = 2;
    spec.subnet = domaind_loopback::E2E_CLIQUE_MOVE;
    spec.seeds_across_cliques = true;
    spec.extra_args = vec![
        "--prepare-deadline".into(),
        "2s".into(),
        "--clique-check-interval".into(),
        "1s".into(),
    ];
    let mut rack = LocalRack::create(spec).unwrap();
    assert_eq!(rack.clique_members(0), [0, 1]);
    assert_eq!(rack.clique_members(1), [2, 3]);
    rack.start_all().unwrap();
    rack.wait_all_ready(START_LIMIT).unwrap();

    // One ComputeDomain with pods on node-01, node-02 (clique 0) and node-03 (clique
    // 1): one IMEX domain in each clique. node-04 holds nothing.
    let holders = [0, 1, 2];
    for node in holders {
        rack.local()
            .write_claim(&claim_file(rack.node(node).name()))
            .unwrap();
    }
    for node in holders {
        let node = rack.node(node);
        let claim = ClaimRef {
            uid: claim_uid(node.name()),
            namespace: "team-m".into(),
            name: format!("claim-{}", node.name()),
        };
        let devices = prepare_until_ready(&node.dra_socket(), &claim, DraVersion::V1, LIMIT)
            .await
            .unwrap()
            .unwrap_or_else(|error| panic!("{} not prepared: {error}", node.name()));
        assert_eq!(devices.len(), 1, "{devices:?}");
    }
    let (old_pair, new_alone) = (names(&rack, &[0, 1]), names(&rack, &[2]));
    wait_for(&rack, "a domain in each clique", |views| {
        views[0].as_ref().is_some_and(|v| formed_with(v, &old_pair))
            && views[1].as_ref().is_some_and(|v| formed_with(v, &old_pair))
            && views[2]
                .as_ref()
                .is_some_and(|v| formed_with(v, &new_alone))
    })
    .await;
    let before = view(&rack, MOVER).await.unwrap();
    let new_cluster = view(&rack, 2).await.unwrap().gossip.cluster_id;
    assert_ne!(before.gossip.cluster_id, new_cluster);

    // The fabric manager puts node-02 in clique 1.
    rack.register_in_clique(MOVER, 1).unwrap();

    let (alone, new_pair) = (names(&rack, &[0]), names(&rack, &[1, 2]));
    let new_clique = names(&rack, &[1, 2, 3]);
    wait_for(&rack, "node-02 moved and the domain re-formed", |views| {
        let (Some(old_mate), Some(mover), Some(new_mate)) = (&views[0], &views[1], &views[2])
        else {
            return false;
        };
        let gossip: BTreeSet<String> = mover.gossip.members.iter().cloned().collect();
        formed_with(old_mate, &alone)
            && formed_with(mover, &new_pair)
            && formed_with(new_mate, &new_pair)
            && mover.gossip.cluster_id == new_cluster
            && gossip == new_clique
    })
    .await;

    let mover = view(&rack, MOVER).await.unwrap();
    // The IMEX daemon ran on: handed to the new clique's domain, not restarted.
    assert!(mover.imex.running, "{:?}", mover.imex);
    assert_eq!(
        (mover.imex.starts, mover.imex.restarts),
        (before.imex.starts, 0),
        "{:?}",
        mover.imex
    );
    assert_eq!(mover.prepared, [claim_uid(rack.node(MOVER).name())]);
    // Left, not lost: its old mate never listed it lost (a loss is kept listed).
    let old_mate = view(&rack, 0).await.unwrap();
    assert!(old_mate.domains[0].lost.is_empty(), "{old_mate:#?}");

    let events = rack.local().read_events(DOMAIN_UID).unwrap();
    let moved: Vec<_> = events
        .iter()
        .filter(|e| e.reason == "CliqueMoved")
        .collect();
    assert_eq!(moved.len(), 1, "{events:#?}");
    assert_eq!(moved[0].node, rack.node(MOVER).name());
    assert!(
        moved[0].message.contains(&RackSpec::clique_id(0).0)
            && moved[0].message.contains(&RackSpec::clique_id(1).0),
        "{}",
        moved[0].message
    );
    assert!(
        !events.iter().any(|e| e.reason == "NodeLost"),
        "{events:#?}"
    );
    assert_eq!(
        metric(&rack, MOVER, "domaind_clique_moves_total").await,
        Some("domaind_clique_moves_total 1".into())
    );
    assert_eq!(
        metric(&rack, 0, "domaind_clique_moves_total").await,
        None,
        "no other node moved"
    );

    tokio::task::block_in_place(|| rack.stop_all(Duration::from_secs(20)));
    assert_eq!(rack.unexpected_exits(), Vec::<String>::new());
}
