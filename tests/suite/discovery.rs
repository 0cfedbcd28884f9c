//! Gossip seeds from the real API server: daemons of two cliques, given no seeds, find
//! their clique-mates in each other's ResourceSlices and only them.
//!
//! Three `domaind run --backend kube` on loopback as nodes `k-a1`, `k-a2` (clique A)
//! and `k-b1` (clique B), started with no `--seed`:
//!
//! 1. each publishes its slices labelled with its clique and carrying its gossip
//!    address; A's two daemons each know one clique-mate from the API server and
//!    exchange gossip; B's knows none and receives no gossip frame at all; nobody
//!    counts a foreign Syn;
//! 2. clique A's daemons are killed and started again at once: their slices stayed,
//!    discovery seeds them again, and they gossip again;
//! 3. `k-a2`'s fabric registers in clique B (the topology file rewritten under it):
//!    its slices are republished under B's label, B's daemon finds it there and they
//!    gossip, and A's daemon has no clique-mate left in the API server.
//!
//! Needs `KUBECONFIG`. No kubelet is
//! needed: discovery reads only what the daemons publish. Environment (optional):
//! `DOMAIND_E2E_NODE_KUBECONFIG` (the chart's node ServiceAccount: its RBAC is what
//! the daemons get), `DOMAIND_E2E_DISCOVERY_IPS` (default 127.0.131.1-3:
//! `domaind_loopback::E2E_DISCOVERY`).

use std::net::IpAddr;
use std::time::Duration;

use domaind_backends::kube::delete_node_slices;
use domaind_backends::kube::slices::{CLIQUE_SLICE_LABEL, GOSSIP_ADDRESS_ANNOTATION};
use domaind_gpu::Topology;
use domaind_loopback::{E2E_DISCOVERY, addr};
use domaind_testbed::rack::{LocalRack, RackBackend, RackSpec, http_get, short_temp_dir};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use domaind_e2e::cluster::{
    DRIVER, LIMIT, env_list, install_crd_and_device_classes, require, wait_for,
};
use domaind_e2e::tokens::node_tokens_for_rack;

/// Rack numbers no other test uses: the simulated cliques they make are this test's
/// alone, whatever other tests left in the cluster.
const RACK_A: u32 = 0x131a;
const RACK_B: u32 = 0x131b;

/// A counter or gauge of one daemon's /metrics, summed over its label sets; 0 when
/// absent.
async fn metric(rack: &LocalRack, index: usize, name: &str) -> f64 {
    let http = rack.node(index).info().expect("started").http_addr;
    let (_, body) = http_get(http, "/metrics").await.unwrap_or_default();
    body.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Whether clique A (nodes 0 and 1) formed: each knows one clique-mate from the API
/// server and has received gossip. With what each node shows: (peers, frames).
async fn formed(rack: &LocalRack) -> (bool, Vec<(f64, f64)>) {
    let mut seen = Vec::new();
    for index in 0..3 {
        seen.push((
            metric(rack, index, "domaind_gossip_discovery_peers").await,
            metric(rack, index, "domaind_gossip_frames_received_total").await,
        ));
    }
    let a_formed = seen[..2]
        .iter()
        .all(|(peers, frames)| *peers == 1.0 && *frames > 0.0);
    (a_formed, seen)
}

/// Nothing crossed cliques: no foreign Syn anywhere, and clique B's only node (node
/// 2) knows no peer and received no gossip frame at all.
async fn check_isolation(rack: &LocalRack) {
    for index in 0..3 {
        assert_eq!(
            metric(rack, index, "domaind_gossip_foreign_cluster_total").await,
            0.0,
            "{}: a Syn crossed cliques",
            rack.node(index).name()
        );
    }
    assert_eq!(
        metric(rack, 2, "domaind_gossip_frames_received_total").await,
        0.0,
        "clique B's only node heard from someone"
    );
    assert_eq!(metric(rack, 2, "domaind_gossip_discovery_peers").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: KUBECONFIG of a real API server (../shared/kube; docs/TESTING.md)"]
async fn daemons_find_only_their_clique_mates_in_the_api_server() {
    require(&[]);
    let client = Client::try_default().await.unwrap();
    // The daemons watch ComputeDomains too; without the CRD they cannot stop cleanly.
    install_crd_and_device_classes(&client).await;
    let names: Vec<String> = ["k-a1", "k-a2", "k-b1"].map(String::from).to_vec();
    let ips: Vec<IpAddr> = env_list("DOMAIND_E2E_DISCOVERY_IPS")
        .map(|ips| ips.iter().map(|ip| ip.parse().unwrap()).collect())
        .unwrap_or_else(|| {
            (1..=3)
                .map(|i| IpAddr::from(addr(E2E_DISCOVERY, i)))
                .collect()
        });
    let tmp = short_temp_dir("dmdisc").unwrap();
    let mut spec = RackSpec::self_contained(
        3,
        domaind_e2e::binaries().domaind.clone(),
        tmp.path().join("rack"),
    );
    spec.names = Some(names.clone());
    spec.ips = Some(ips);
    spec.backend = RackBackend::Kube;
    spec.static_seeds = false;
    spec.extra_args = vec![
        "--slices-on-exit".into(),
        "delete".into(),
        "--clique-check-interval".into(),
        "1s".into(),
    ];
    let tokens = node_tokens_for_rack(
        &mut spec.node_env,
        &client,
        &names,
        tmp.path(),
        &format!("k-discovery-{}", std::process::id()),
    )
    .await;
    let mut rack = LocalRack::create(spec).unwrap();
    // The rack writes one clique for all; this test wants two.
    let mut topology = Topology::simulated_rack(RACK_A, names[..2].iter().cloned()).unwrap();
    topology
        .add_simulated_rack(RACK_B, names[2..].iter().cloned())
        .unwrap();
    topology
        .write(&tmp.path().join("rack").join("topology.json"))
        .unwrap();
    let (clique_a, clique_b) = (
        Topology::simulated_clique(RACK_A).0,
        Topology::simulated_clique(RACK_B).0,
    );
    rack.start_all().unwrap();
    tokio::task::block_in_place(|| rack.wait_all_ready(LIMIT)).unwrap();

    // 1. Each node's slice names its clique and its gossip address.
    let slices = Api::<ResourceSlice>::all(client.clone());
    for (index, clique) in [(0, &clique_a), (1, &clique_a), (2, &clique_b)] {
        let node = rack.node(index);
        let gossip = node.info().unwrap().gossip_addr.to_string();
        let selector = format!("{CLIQUE_SLICE_LABEL}={clique}");
        wait_for(
            "the node's slice carries its clique and address",
            || async {
                let listed = slices
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .unwrap();
                let found = listed.items.iter().any(|s| {
                    s.spec.driver == DRIVER
                        && s.spec.node_name.as_deref() == Some(node.name())
                        && s.annotations().get(GOSSIP_ADDRESS_ANNOTATION) == Some(&gossip)
                });
                (found, listed.items.len())
            },
        )
        .await;
    }

    // Clique A gossips within itself; B hears from nobody; nothing crosses cliques.
    wait_for("clique A's daemons find each other and gossip", || {
        formed(&rack)
    })
    .await;
    check_isolation(&rack).await;

    // 2. Clique A restarts at once: its slices stayed (SIGKILL deletes nothing), so
    //    each daemon is seeded with the other at start, up or not yet; discovery's
    //    re-seeding covers the one that was not.
    rack.kill(0).unwrap();
    rack.kill(1).unwrap();
    rack.start(0).unwrap();
    rack.start(1).unwrap();
    tokio::task::block_in_place(|| {
        rack.wait_ready(0, LIMIT)?;
        rack.wait_ready(1, LIMIT)
    })
    .unwrap();
    wait_for("clique A gossips again after restarting at once", || {
        formed(&rack)
    })
    .await;
    check_isolation(&rack).await;

    // 3. k-a2 moves to clique B while it runs.
    assert!(topology.move_to_simulated_rack(&names[1], RACK_B));
    topology
        .write(&tmp.path().join("rack").join("topology.json"))
        .unwrap();
    let moved = rack.node(1);
    let gossip = moved.info().unwrap().gossip_addr.to_string();
    let selector = format!("{CLIQUE_SLICE_LABEL}={clique_b}");
    wait_for("k-a2's slice carries clique B and its address", || async {
        let listed = slices
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap();
        let found = listed.items.iter().any(|s| {
            s.spec.node_name.as_deref() == Some(moved.name())
                && s.annotations().get(GOSSIP_ADDRESS_ANNOTATION) == Some(&gossip)
        });
        (found, listed.items.len())
    })
    .await;
    wait_for(
        "clique B's two daemons find each other and gossip",
        || async {
            let mut seen = Vec::new();
            for index in 0..3 {
                seen.push((
                    metric(&rack, index, "domaind_gossip_discovery_peers").await,
                    metric(&rack, index, "domaind_clique_moves_total").await,
                ));
            }
            let b_frames = metric(&rack, 2, "domaind_gossip_frames_received_total").await;
            let found = seen == [(0.0, 0.0), (1.0, 1.0), (1.0, 0.0)] && b_frames > 0.0;
            (found, (seen, b_frames))
        },
    )
    .await;

    rack.stop_all(Duration::from_secs(20));
    drop(tokens);
    // --slices-on-exit delete took them; a daemon killed by a failure above would not.
    for name in &names {
        let _ = delete_node_slices(client.clone(), name, DRIVER, Duration::from_secs(10)).await;
    }
}
