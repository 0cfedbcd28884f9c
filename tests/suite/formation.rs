//! A figure, not a check: how long a ComputeDomain of 18 daemons takes to read Ready
//! on a real API server after its last claim is prepared. Ignored by `cargo test`; run
//! it by hand against `../shared/kube` (docs/BENCHMARKS.md):
//!
//! ```sh
//! eval "$(../shared/kube/up.sh)"
//! cargo build --profile dist --bin domaind
//! DOMAIND_BENCH_BIN=$PWD/target/dist/domaind \
//!   cargo test -p domaind-e2e --test e2e -- formation:: --ignored --nocapture
//! ```
//!
//! `DOMAIND_BENCH_NODES` changes the size (default 18); `DOMAIND_BENCH_BIN` runs another
//! `domaind` binary than the test's debug one (e.g. `target/dist/domaind`: 18 debug
//! daemons and their IMEX simulators overload 2 cores). The daemons run on 127.0.47.x
//! (`domaind_loopback::E2E_FORMATION`) with `--backend kube`; the test plays the
//! scheduler and the kubelets (allocations through the status subresource, prepares
//! through each node's DRA socket, all at once) and watches the ComputeDomain.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use domaind_actors::model::ClaimRef;
use domaind_kube_api::crd::ComputeDomain;
use domaind_kube_api::crd::Phase;
use domaind_kubelet_plugin::DraVersion;
use domaind_loopback::{E2E_FORMATION, addr};
use domaind_testbed::rack::{
    LocalRack, RackBackend, RackSpec, prepare_until_ready, short_temp_dir,
};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use domaind_e2e::cluster::{
    LIMIT, allocate_claim, create_namespace, install_crd_and_device_classes, spawn_controller,
    wait_every, wait_for,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: prints the formation time on a real API server"]
async fn formation_on_a_real_api_server() {
    let client = Client::try_default()
        .await
        .expect("KUBECONFIG names a real API server");
    let size: usize = std::env::var("DOMAIND_BENCH_NODES")
        .ok()
        .map(|n| n.parse().unwrap())
        .unwrap_or(18);
    install_crd_and_device_classes(&client).await;
    let namespace = format!("domaind-formation-{}", std::process::id());
    let _cleared_on_panic = create_namespace(&client, &namespace).await;
    let cds = Api::<ComputeDomain>::namespaced(client.clone(), &namespace);
    let cd: ComputeDomain = serde_json::from_value(json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": "bench"},
        "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "bench-channel"}}},
    }))
    .unwrap();
    cds.create(&PostParams::default(), &cd).await.unwrap();

    let domaind: std::path::PathBuf = std::env::var_os("DOMAIND_BENCH_BIN")
        .map(Into::into)
        .unwrap_or_else(|| domaind_e2e::binaries().domaind.clone());
    let tmp = short_temp_dir("dmform").unwrap();
    let controller = spawn_controller(&domaind_e2e::binaries().domaind, &namespace, tmp.path());
    let templates = Api::<ResourceClaimTemplate>::namespaced(client.clone(), &namespace);
    let template = wait_for("the controller creates the template", || async {
        let t = templates.get_opt("bench-channel").await.unwrap();
        (t.is_some(), t)
    })
    .await
    .unwrap();

    let names: Vec<String> = (1..=size).map(|i| format!("bench-{i:02}")).collect();
    let mut spec = RackSpec::self_contained(size, domaind.clone(), tmp.path().join("rack"));
    spec.names = Some(names.clone());
    spec.ips = Some(
        (1..=size)
            .map(|i| IpAddr::from(addr(E2E_FORMATION, i as u8)))
            .collect(),
    );
    spec.backend = RackBackend::Kube;
    let mut rack = LocalRack::create(spec).unwrap();
    rack.start_all().unwrap();
    tokio::task::block_in_place(|| rack.wait_all_ready(LIMIT)).unwrap();

    let mut claims = Vec::new();
    for name in &names {
        let claim =
            allocate_claim(&client, &namespace, &template, &format!("c-{name}"), name).await;
        claims.push(ClaimRef {
            uid: claim.uid().unwrap(),
            namespace: namespace.clone(),
            name: claim.name_any(),
        });
    }

    let started = Instant::now();
    let prepares = claims.iter().enumerate().map(|(i, claim)| {
        let socket = rack.node(i).dra_socket();
        async move {
            let answer = prepare_until_ready(&socket, claim, DraVersion::V1, LIMIT).await;
            (answer, started.elapsed())
        }
    });
    let seen = std::cell::RefCell::new(None);
    let watch = wait_every("Ready on every node", Duration::from_millis(10), || async {
        let status = cds.get("bench").await.unwrap().status;
        let summary = status
            .as_ref()
            .map(|s| (s.status, s.ready_nodes, s.nodes.len()));
        if *seen.borrow() != summary {
            println!("{:>6} ms status {summary:?}", started.elapsed().as_millis());
            seen.replace(summary);
        }
        let ready = status.as_ref().is_some_and(|s| {
            s.status == Phase::Ready && s.ready_nodes as usize == size && s.nodes.len() == size
        });
        (ready, (started.elapsed(), status))
    });
    let (answers, (ready_at, _)) = tokio::join!(futures::future::join_all(prepares), watch);
    let last_prepared = answers
        .into_iter()
        .map(|(answer, at)| {
            answer.unwrap().unwrap();
            at
        })
        .max()
        .unwrap();
    println!(
        "FIGURE real API server, {size} daemons: prepares sent -> last answered {} ms, -> ComputeDomain Ready {size}/{size} {} ms; last prepare -> Ready {} ms",
        last_prepared.as_millis(),
        ready_at.as_millis(),
        ready_at.saturating_sub(last_prepared).as_millis(),
    );

    rack.stop_all(Duration::from_secs(20));
    drop(controller);
    Api::<Namespace>::all(client.clone())
        .delete(&namespace, &DeleteParams::default())
        .await
        .unwrap();
}
