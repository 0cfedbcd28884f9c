//! Figures, not checks: the model of NVIDIA's coordination (`domaind_e2e::nvidia_model`,
//! its rules there) on a real API server, measured as `scale.rs` measures our daemons:
//! N nodes register at once (formation), one leaves and comes back (node loss), with
//! the API server's requests, conflicts, bytes and CPU around each step. Ignored; run
//! by hand against `../shared/kube` (docs/BENCHMARKS.md, "144 daemons on a real API
//! server"):
//!
//! ```sh
//! eval "$(../shared/kube/up.sh)"
//! DOMAIND_SCALE_NODES=144 \
//!   cargo test -p domaind-e2e --test e2e -- scale_model:: --ignored --nocapture
//! ```
//!
//! Environment: `DOMAIND_SCALE_NODES` (18), `DOMAIND_SCALE_CLIQUES` (one per 18),
//! `DOMAIND_SCALE_RUNS` (3), `DOMAIND_MODEL_OBJECTS` (`one`: every node in one object,
//! the default; `per-clique`), `DOMAIND_MODEL_WATCH` (`0`: no node holds a watch),
//! `DOMAIND_SCALE_LIMIT_S` (every wait, 600). The model's nodes are tasks of this
//! process, each with its own client and connection; no daemon runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject};
use tokio::time::Instant;

use domaind_e2e::apiserver::{Meter, load_average};
use domaind_e2e::cluster::{create_namespace, install_crd_and_device_classes, require};
use domaind_e2e::figures::{distribution, env_number};
use domaind_e2e::nvidia_model::{
    Draws, ModelSpec, Objects, aggregate_until, all_at_once, create_objects, end_watches,
    hold_watch, with_entry, without_entry, write_nodes,
};

/// A window closes this long after its step's condition held, so that the step's tail
/// (claims' status writes, events) is counted in it. Fixed rather than "until quiet":
/// every read of the API server's metrics costs it CPU that the window would count.
const TAIL: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: a model of NVIDIA's coordination on a real API server (KUBECONFIG)"]
async fn nvidia_model_on_a_real_api_server() {
    require(&[]);
    let admin = Client::try_default().await.unwrap();
    let size = env_number("DOMAIND_SCALE_NODES", 18);
    let cliques = env_number("DOMAIND_SCALE_CLIQUES", size.div_ceil(18));
    let runs = env_number("DOMAIND_SCALE_RUNS", 3);
    let limit = Duration::from_secs(env_number("DOMAIND_SCALE_LIMIT_S", 600) as u64);
    let objects = match std::env::var("DOMAIND_MODEL_OBJECTS").as_deref() {
        Ok("one") | Err(_) => Objects::One,
        Ok("per-clique") => Objects::PerClique,
        Ok(other) => panic!("DOMAIND_MODEL_OBJECTS={other}: `one` or `per-clique`"),
    };
    let mut spec = ModelSpec::new(size, cliques, objects);
    spec.watch = std::env::var("DOMAIND_MODEL_WATCH").as_deref() != Ok("0");
    let spec = Arc::new(spec);
    let meter = Meter::new(admin.clone());
    println!(
        "MODEL {size} nodes in {cliques} cliques, {objects:?} object(s), watches {}, {runs} runs; load {}",
        spec.watch,
        load_average()
    );

    install_crd_and_device_classes(&admin).await;
    let namespace = format!("domaind-model-{}", std::process::id());
    let _cleared_on_panic = create_namespace(&admin, &namespace).await;
    // One client per node, as each node is its own process with its own connection.
    let mut clients = Vec::new();
    for _ in 0..size {
        clients.push(Client::try_default().await.unwrap());
    }

    // Idle: the API server at rest beside this process, for its CPU net of idle.
    let mark = meter.mark().await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let idle = meter.since(&mark).await;
    println!(
        "FIGURE model idle: API server {:.1}% of a core, etcd {:.1}%; load {}",
        idle.apiserver / idle.seconds * 100.0,
        idle.etcd / idle.seconds * 100.0,
        load_average()
    );

    let (mut formations, mut losses, mut rejoins) = (Vec::new(), Vec::new(), Vec::new());
    for run in 1..=runs {
        let names = Arc::new(spec.object_names(&format!("r{run}")));
        create_objects(&admin, &namespace, &names).await;
        let received = Arc::new(AtomicU64::new(0));
        let watches: Vec<_> = if spec.watch {
            clients
                .iter()
                .enumerate()
                .map(|(i, client)| {
                    tokio::spawn(hold_watch(
                        client.clone(),
                        namespace.clone(),
                        names[spec.object_of(i)].clone(),
                        limit.as_secs() as u32,
                        received.clone(),
                    ))
                })
                .collect()
        } else {
            Vec::new()
        };
        // Every node's connection is open before the start, as a started daemon's is.
        let resource = ApiResource::erase::<domaind_kube_api::crd::ComputeDomain>(&());
        let warm = clients.iter().enumerate().map(|(i, client)| {
            let api = Api::<DynamicObject>::namespaced_with(client.clone(), &namespace, &resource);
            let name = names[spec.object_of(i)].clone();
            async move { api.get(&name).await.unwrap() }
        });
        futures::future::join_all(warm).await;
        tokio::time::sleep(TAIL).await;

        // Formation: every node registers at once; the aggregator reads every 2 s.
        let mark = meter.mark().await;
        let received_before = received.load(Ordering::Relaxed);
        let started = Instant::now();
        let aggregator = {
            let (admin, namespace, names, poll) =
                (admin.clone(), namespace.clone(), names.clone(), spec.poll);
            tokio::spawn(async move {
                aggregate_until(&admin, &namespace, &names, poll, limit, "Ready", |n| {
                    n == size
                })
                .await
            })
        };
        let (registered_at, writes) = all_at_once(&clients, |i, client| {
            let (spec, namespace, names) = (spec.clone(), namespace.clone(), names.clone());
            async move {
                let me = spec.entry(i);
                let mut draws = Draws::new(i as u64 + 1);
                write_nodes(
                    &client,
                    &namespace,
                    &names[spec.object_of(i)],
                    spec.backoff,
                    &mut draws,
                    limit,
                    |nodes| with_entry(nodes, &me),
                )
                .await
            }
        })
        .await;
        let (ready_at, reads) = aggregator.await.unwrap();
        tokio::time::sleep(TAIL).await;
        let window = meter.since(&mark).await;
        let formed_in = ready_at.duration_since(started);
        formations.push(formed_in);
        println!(
            "FIGURE model run {run} formation: started -> all {size} registered {} ms -> aggregator wrote Ready {} ms; {} PUTs, {} conflicts, {} other errors, {reads} aggregator reads; the nodes' watches received {} bytes; load {}; {}",
            registered_at.duration_since(started).as_millis(),
            formed_in.as_millis(),
            writes.puts,
            writes.conflicts,
            writes.errors,
            received.load(Ordering::Relaxed) - received_before,
            load_average(),
            window.describe(size as f64, Some(&idle))
        );

        // Node loss: the first node leaves (deletes its entry, as a stopping daemon
        // does), then registers again.
        let mark = meter.mark().await;
        let victim = spec.entry(0);
        let victim_object = names[spec.object_of(0)].clone();
        let left = Instant::now();
        let aggregator = {
            let (admin, namespace, names, poll) =
                (admin.clone(), namespace.clone(), names.clone(), spec.poll);
            tokio::spawn(async move {
                aggregate_until(&admin, &namespace, &names, poll, limit, "NotReady", |n| {
                    n < size
                })
                .await
            })
        };
        let mut draws = Draws::new(9_999);
        write_nodes(
            &clients[0],
            &namespace,
            &victim_object,
            spec.backoff,
            &mut draws,
            limit,
            |nodes| without_entry(nodes, &victim.name),
        )
        .await;
        let (not_ready_at, _) = aggregator.await.unwrap();
        let back = Instant::now();
        let aggregator = {
            let (admin, namespace, names, poll) =
                (admin.clone(), namespace.clone(), names.clone(), spec.poll);
            tokio::spawn(async move {
                aggregate_until(&admin, &namespace, &names, poll, limit, "Ready", |n| {
                    n == size
                })
                .await
            })
        };
        write_nodes(
            &clients[0],
            &namespace,
            &victim_object,
            spec.backoff,
            &mut draws,
            limit,
            |nodes| with_entry(nodes, &victim),
        )
        .await;
        let (ready_again_at, _) = aggregator.await.unwrap();
        tokio::time::sleep(TAIL).await;
        let window = meter.since(&mark).await;
        losses.push(not_ready_at.duration_since(left));
        rejoins.push(ready_again_at.duration_since(back));
        println!(
            "FIGURE model run {run} node loss: left -> NotReady written {} ms; back -> Ready written {} ms; load {}; {}",
            not_ready_at.duration_since(left).as_millis(),
            ready_again_at.duration_since(back).as_millis(),
            load_average(),
            window.describe(2.0, Some(&idle))
        );

        end_watches(watches).await;
        let api = Api::<DynamicObject>::namespaced_with(admin.clone(), &namespace, &resource);
        for name in names.iter() {
            api.delete(name, &DeleteParams::default()).await.unwrap();
        }
    }

    println!(
        "FIGURE model {size} nodes over {runs} runs: started -> Ready written {}; left -> NotReady {}; back -> Ready {}; load {}",
        distribution(&formations),
        distribution(&losses),
        distribution(&rejoins),
        load_average()
    );
    Api::<Namespace>::all(admin.clone())
        .delete(&namespace, &DeleteParams::default())
        .await
        .unwrap();
}
