//! Figures, not checks: N `domaind run --backend kube` daemons on one real API server
//! (8 NVLink cliques of 18 at 144: GB200 NVL72 racks), and what coordinating them costs
//! the API server. Ignored by `cargo test`; run by hand against `../shared/kube`
//! (docs/BENCHMARKS.md, "144 daemons on a real API server"):
//!
//! ```sh
//! eval "$(../shared/kube/up.sh)"
//! cargo build --profile dist --bin domaind
//! DOMAIND_BENCH_BIN=$PWD/target/dist/domaind DOMAIND_SCALE_NODES=144 \
//!   cargo test -p domaind-e2e --test e2e -- scale::daemons --ignored --nocapture
//! ```
//!
//! The daemons run on 127.0.182.x (`domaind_loopback::E2E_SCALE`) as one rack, and each
//! run forms a fresh domain on them: the test plays the scheduler and the kubelets
//! (claims allocated through the status subresource, every prepare sent at once
//! through the DRA sockets), waits for the status to read Ready, SIGKILLs one node
//! (daemon and IMEX) and waits for the status to list it NotReady, restarts it and
//! waits for Ready again, then unprepares and deletes it all. Around each step it reads
//! the API server's `/metrics` and the CPU of the API server and etcd
//! (`domaind_e2e::apiserver`). A domain that does not form, or a node loss the status
//! never shows, fails the test at the limit.
//!
//! Environment: `DOMAIND_SCALE_NODES` (18), `DOMAIND_SCALE_CLIQUES` (one per 18 nodes),
//! `DOMAIND_SCALE_RUNS` (3), `DOMAIND_SCALE_DOMAINS` (`per-clique`: a ComputeDomain per
//! clique, as the controller's rack mode keeps them; `one`: one ComputeDomain
//! spanning every clique), `DOMAIND_SCALE_LIMIT_S` (every wait, 300),
//! `DOMAIND_SCALE_KEEP=1` (keep the rack's directory and the daemons' logs), and
//! `DOMAIND_BENCH_BIN` (the daemons' and the controller's binary; 144 debug daemons do
//! not fit 2 cores).
//!
//! The model of NVIDIA's coordination beside it is `scale_model.rs`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use domaind_actors::model::ClaimRef;
use domaind_kube_api::crd::{ComputeDomain, ComputeDomainStatus, Phase};
use domaind_kubelet_plugin::DraVersion;
use domaind_kubelet_plugin::client::KubeletClient;
use domaind_loopback::{E2E_SCALE, addr};
use domaind_testbed::rack::cpu;
use domaind_testbed::rack::{
    LocalRack, RackBackend, RackSpec, prepare_until_ready, short_temp_dir,
};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch;

use domaind_e2e::apiserver::{Meter, Window, load_average};
use domaind_e2e::cluster::{
    allocate_claim, create_namespace, install_crd_and_device_classes, require, spawn_controller,
    wait_for,
};
use domaind_e2e::figures::{distribution, env_number};

/// Nodes per NVLink clique: a GB200 NVL72 rack.
const CLIQUE: usize = 18;
/// A window closes this long after its step's condition held, so that the step's tail
/// (claims' status writes, events) is counted in it. Fixed rather than "until quiet":
/// every read of the API server's metrics costs it CPU that the window would count.
const TAIL: Duration = Duration::from_secs(5);

/// What the test's watch of the namespace's ComputeDomains shows: each one's status, and
/// how many times it changed.
type Seen = BTreeMap<String, (Option<ComputeDomainStatus>, u32)>;

/// The statuses as they arrive, from one watch (not polls: every poll would be a
/// request counted in the figures).
struct Statuses {
    seen: watch::Receiver<Seen>,
    task: tokio::task::JoinHandle<()>,
    limit: Duration,
}

impl Statuses {
    fn watch(client: &Client, namespace: &str, limit: Duration) -> Self {
        let api = Api::<ComputeDomain>::namespaced(client.clone(), namespace);
        let (tx, seen) = watch::channel(Seen::new());
        let task = tokio::spawn(async move {
            let mut stream =
                std::pin::pin!(watcher(api, watcher::Config::default()).applied_objects());
            while let Some(event) = stream.next().await {
                let Ok(domain) = event else { continue };
                tx.send_modify(|seen| {
                    let entry = seen.entry(domain.name_any()).or_insert((None, 0));
                    if entry.0 != domain.status {
                        entry.0 = domain.status.clone();
                        entry.1 += 1;
                    }
                });
            }
        });
        Self { seen, task, limit }
    }

    /// Waits until `done` holds of what the watch shows; fails the test at the limit
    /// with what it last showed.
    async fn until(&mut self, what: &str, done: impl Fn(&Seen) -> bool) -> Instant {
        let limit = self.limit;
        let arrived = tokio::time::timeout(limit, self.seen.wait_for(|seen| done(seen)))
            .await
            .is_ok_and(|seen| seen.is_ok());
        match arrived {
            true => Instant::now(),
            false => {
                let seen = self.seen.borrow();
                let summary: Vec<String> = seen
                    .iter()
                    .map(|(name, (status, changes))| {
                        let s = status.as_ref().map(|s| {
                            let nodes: Vec<String> = s
                                .nodes
                                .iter()
                                .map(|n| format!("{}:{:?}", n.name, n.status))
                                .collect();
                            (s.status, s.ready_nodes, s.total_nodes, nodes)
                        });
                        format!("{name}: {s:?} after {changes} changes")
                    })
                    .collect();
                panic!("timed out after {limit:?} waiting until {what}; last seen: {summary:#?}")
            }
        }
    }

    fn changes(&self, domains: &[String]) -> u32 {
        let seen = self.seen.borrow();
        domains
            .iter()
            .filter_map(|d| seen.get(d))
            .map(|e| e.1)
            .sum()
    }
}

impl Drop for Statuses {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether every domain reads Ready with all of its members.
fn formed(seen: &Seen, members: &BTreeMap<String, usize>) -> bool {
    members.iter().all(|(domain, want)| {
        seen.get(domain)
            .and_then(|(status, _)| status.as_ref())
            .is_some_and(|s| {
                s.status == Phase::Ready
                    && s.ready_nodes as usize == *want
                    && s.nodes.len() == *want
            })
    })
}

/// Whether `domain` reads NotReady with `node` listed NotReady (or no longer listed).
fn shows_lost(seen: &Seen, domain: &str, node: &str) -> bool {
    seen.get(domain)
        .and_then(|(status, _)| status.as_ref())
        .is_some_and(|s| {
            s.status == Phase::NotReady
                && s.nodes
                    .iter()
                    .find(|n| n.name == node)
                    .is_none_or(|n| n.status == Phase::NotReady)
        })
}

/// Clock ticks the rack's processes used so far: the daemons, the status tools they
/// ran and reaped, their IMEX daemons (simulated).
#[derive(Debug, Clone, Copy, Default)]
struct RackTicks {
    daemons: u64,
    tools: u64,
    imex: u64,
    /// Long-lived children (IMEX daemons) running.
    imex_running: usize,
}

fn rack_ticks(rack: &LocalRack) -> RackTicks {
    let pids: Vec<u32> = rack.nodes().iter().filter_map(|n| n.pid()).collect();
    cpu::sample(&pids, &[])
        .into_iter()
        .flatten()
        .fold(RackTicks::default(), |sum, s| RackTicks {
            daemons: sum.daemons + s.daemon.own,
            tools: sum.tools + s.daemon.reaped,
            imex: sum.imex + s.children.values().sum::<u64>(),
            imex_running: sum.imex_running + s.children.len(),
        })
}

/// CPU seconds the rack used since `before`, by part. A node killed and restarted in
/// between loses what it used before the kill (the figures are a little low then).
fn rack_cpu(before: RackTicks, rack: &LocalRack) -> String {
    let after = rack_ticks(rack);
    let s = |a: u64, b: u64| a.saturating_sub(b) as f64 / cpu::ticks_per_second();
    let (daemons, tools, imex) = (
        s(after.daemons, before.daemons),
        s(after.tools, before.tools),
        s(after.imex, before.imex),
    );
    format!(
        "rack {:.1} CPU s (daemons {daemons:.1}, IMEX {imex:.1}, status tools {tools:.1}; {} IMEX daemons running)",
        daemons + tools + imex,
        after.imex_running
    )
}

/// 20 s of rest: what the rack and the API server cost while nothing changes.
async fn idle_window(meter: &Meter, rack: &LocalRack, what: &str) -> Window {
    let mark = meter.mark().await;
    let rack_before = rack_ticks(rack);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let idle = meter.since(&mark).await;
    println!(
        "FIGURE idle, {} daemons {what}: {:.2} requests/s, API server {:.1}% of a core, etcd {:.1}%; {} in {:.0} s; machine {:.0}% busy; load {}; {}",
        rack.nodes().len(),
        idle.traffic.total_requests() / idle.seconds,
        idle.apiserver / idle.seconds * 100.0,
        idle.etcd / idle.seconds * 100.0,
        rack_cpu(rack_before, rack),
        idle.seconds,
        idle.machine_busy,
        load_average(),
        idle.traffic.describe(),
    );
    idle
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: N daemons on a real API server (KUBECONFIG); prints figures"]
async fn daemons_on_a_real_api_server() {
    require(&[]);
    let client = Client::try_default().await.unwrap();
    let size = env_number("DOMAIND_SCALE_NODES", 18);
    let cliques = env_number("DOMAIND_SCALE_CLIQUES", size.div_ceil(CLIQUE));
    let runs = env_number("DOMAIND_SCALE_RUNS", 3);
    let limit = Duration::from_secs(env_number("DOMAIND_SCALE_LIMIT_S", 300) as u64);
    let per_clique = match std::env::var("DOMAIND_SCALE_DOMAINS").as_deref() {
        Ok("one") => false,
        Ok("per-clique") | Err(_) => true,
        Ok(other) => panic!("DOMAIND_SCALE_DOMAINS={other}: `one` or `per-clique`"),
    };
    let meter = Meter::new(client.clone());
    println!(
        "SCALE {size} daemons in {cliques} cliques, {}, {runs} runs; load {}",
        if per_clique {
            "a ComputeDomain per clique"
        } else {
            "one ComputeDomain"
        },
        load_average()
    );

    install_crd_and_device_classes(&client).await;
    let namespace = format!("domaind-scale-{}", std::process::id());
    let _cleared_on_panic = create_namespace(&client, &namespace).await;
    let domaind: std::path::PathBuf = std::env::var_os("DOMAIND_BENCH_BIN")
        .map(Into::into)
        .unwrap_or_else(|| domaind_e2e::binaries().domaind.clone());
    let mut tmp = short_temp_dir("dmscale").unwrap();
    // The daemons' logs (warnings and worse), kept when asked: what a run that did not
    // form has to say.
    if std::env::var("DOMAIND_SCALE_KEEP").as_deref() == Ok("1") {
        tmp.disable_cleanup(true);
        println!("SCALE keeps {}", tmp.path().display());
    }
    let controller = spawn_controller(&domaind, &namespace, tmp.path());

    let names: Vec<String> = (1..=size).map(|i| format!("scale-{i:03}")).collect();
    let mut spec = RackSpec::self_contained(size, domaind, tmp.path().join("rack"));
    spec.cliques = cliques;
    spec.names = Some(names.clone());
    spec.ips = Some(
        (1..=size)
            .map(|i| IpAddr::from(addr(E2E_SCALE, u8::try_from(i).expect("at most 250 nodes"))))
            .collect(),
    );
    spec.backend = RackBackend::Kube;
    spec.log_filter = "warn".into();
    let mut rack = LocalRack::create(spec).unwrap();

    // Start-up: every daemon publishes its slices and opens its watches.
    let mark = meter.mark().await;
    let rack_before = rack_ticks(&rack);
    let started = Instant::now();
    rack.start_all().unwrap();
    tokio::task::block_in_place(|| rack.wait_all_ready(limit)).unwrap();
    let up = started.elapsed();
    tokio::time::sleep(TAIL).await;
    let window = meter.since(&mark).await;
    println!(
        "FIGURE start-up: {size} daemons ready (run.json) in {} ms; {}; load {}; {}",
        up.as_millis(),
        rack_cpu(rack_before, &rack),
        load_average(),
        window.describe(size as f64, None)
    );

    // Idle: what a rack serving no domain costs the API server.
    let idle = idle_window(&meter, &rack, "serving no domain").await;

    let cds = Api::<ComputeDomain>::namespaced(client.clone(), &namespace);
    let templates = Api::<ResourceClaimTemplate>::namespaced(client.clone(), &namespace);
    let mut statuses = Statuses::watch(&client, &namespace, limit);
    let (mut formations, mut last_to_ready, mut losses, mut rejoins) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());

    for run in 1..=runs {
        // The run's domains, each node's, and how many members each has.
        let domain_names: Vec<String> = if per_clique {
            (0..cliques).map(|c| format!("r{run}-c{c}")).collect()
        } else {
            vec![format!("r{run}")]
        };
        let domain_of = |i: usize| {
            if per_clique {
                domain_names[rack.clique_of(i)].clone()
            } else {
                domain_names[0].clone()
            }
        };
        let mut members: BTreeMap<String, usize> = BTreeMap::new();
        for i in 0..size {
            *members.entry(domain_of(i)).or_default() += 1;
        }
        let mut domain_templates = BTreeMap::new();
        for name in &domain_names {
            let cd: ComputeDomain = serde_json::from_value(json!({
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "ComputeDomain",
                "metadata": {"name": name},
                "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": format!("{name}-channel")}}},
            }))
            .unwrap();
            cds.create(&PostParams::default(), &cd).await.unwrap();
        }
        for name in &domain_names {
            let template = wait_for("the controller creates the template", || async {
                let t = templates.get_opt(&format!("{name}-channel")).await.unwrap();
                (t.is_some(), t)
            })
            .await
            .unwrap();
            domain_templates.insert(name.clone(), template);
        }
        let mut claims = Vec::new();
        for (i, node) in names.iter().enumerate() {
            let template = &domain_templates[&domain_of(i)];
            let claim = allocate_claim(
                &client,
                &namespace,
                template,
                &format!("r{run}-{node}"),
                node,
            )
            .await;
            claims.push(ClaimRef {
                uid: claim.uid().unwrap(),
                namespace: namespace.clone(),
                name: claim.name_any(),
            });
        }
        tokio::time::sleep(TAIL).await;

        // Formation: every prepare at once, until every domain reads Ready.
        let mark = meter.mark().await;
        let rack_before = rack_ticks(&rack);
        let changes_before = statuses.changes(&domain_names);
        let started = Instant::now();
        let prepares = claims.iter().enumerate().map(|(i, claim)| {
            let socket = rack.node(i).dra_socket();
            async move {
                let answer = prepare_until_ready(&socket, claim, DraVersion::V1, limit).await;
                (answer, started.elapsed())
            }
        });
        let (answers, ready_at) = tokio::join!(
            futures::future::join_all(prepares),
            statuses.until("every domain is Ready with all its nodes", |seen| formed(
                seen, &members
            ))
        );
        let last_prepared = answers
            .into_iter()
            .map(|(answer, at)| {
                answer.unwrap().unwrap();
                at
            })
            .max()
            .unwrap();
        let formed_in = ready_at.duration_since(started);
        let status_writes = statuses.changes(&domain_names) - changes_before;
        tokio::time::sleep(TAIL).await;
        let window = meter.since(&mark).await;
        let rack_used = rack_cpu(rack_before, &rack);
        formations.push(formed_in);
        last_to_ready.push(formed_in.saturating_sub(last_prepared));
        println!(
            "FIGURE run {run} formation: prepares sent -> last answered {} ms -> all Ready {} ms ({status_writes} status changes seen); {rack_used}; load {}; {}",
            last_prepared.as_millis(),
            formed_in.as_millis(),
            load_average(),
            window.describe(size as f64, Some(&idle))
        );

        if run == 1 {
            idle_window(&meter, &rack, "with every domain formed").await;
        }

        // Node loss: SIGKILL the last node of the first clique, daemon and IMEX.
        let victim = *rack.clique_members(0).last().unwrap();
        let victim_domain = domain_of(victim);
        let mark = meter.mark().await;
        let rack_before = rack_ticks(&rack);
        let killed = Instant::now();
        rack.kill_node(victim).unwrap();
        let lost_at = statuses
            .until("the status lists the killed node NotReady", |seen| {
                shows_lost(seen, &victim_domain, &names[victim])
            })
            .await;
        let restarted = Instant::now();
        rack.start(victim).unwrap();
        let back_at = statuses
            .until("every domain is Ready again", |seen| formed(seen, &members))
            .await;
        tokio::task::block_in_place(|| rack.wait_ready(victim, limit)).unwrap();
        tokio::time::sleep(TAIL).await;
        let window = meter.since(&mark).await;
        losses.push(lost_at.duration_since(killed));
        rejoins.push(back_at.duration_since(restarted));
        println!(
            "FIGURE run {run} node loss: killed -> status NotReady {} ms; restarted -> Ready {} ms; {}; load {}; {}",
            lost_at.duration_since(killed).as_millis(),
            back_at.duration_since(restarted).as_millis(),
            rack_cpu(rack_before, &rack),
            load_average(),
            window.describe(2.0, Some(&idle))
        );

        // Teardown: the kubelets unprepare, the claims and domains go.
        let unprepares = claims.iter().enumerate().map(|(i, claim)| {
            let socket = rack.node(i).dra_socket();
            async move {
                let client = KubeletClient::connect(socket).await.unwrap();
                let answers = client
                    .unprepare(std::slice::from_ref(claim), DraVersion::V1)
                    .await
                    .unwrap();
                assert_eq!(answers[0].result, Ok(()), "{}", claim.name);
            }
        });
        futures::future::join_all(unprepares).await;
        Api::<ResourceClaim>::namespaced(client.clone(), &namespace)
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .unwrap();
        for name in &domain_names {
            cds.delete(name, &DeleteParams::default()).await.unwrap();
        }
        wait_for("the run's domains are gone", || async {
            let left: Vec<String> = cds
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .iter()
                .map(ResourceExt::name_any)
                .filter(|name| domain_names.contains(name))
                .collect();
            (left.is_empty(), left)
        })
        .await;
        // What the rack costs once its domains are gone: the next run starts from it.
        idle_window(&meter, &rack, "after the run's teardown").await;
    }

    println!(
        "FIGURE {size} daemons over {runs} runs: prepares sent -> all Ready {}; last prepare -> Ready {}; node killed -> status NotReady {}; restarted -> Ready {}; load {}",
        distribution(&formations),
        distribution(&last_to_ready),
        distribution(&losses),
        distribution(&rejoins),
        load_average()
    );
    let died = rack.unexpected_exits();
    assert!(died.is_empty(), "daemons died on their own: {died:?}");

    drop(statuses);
    rack.stop_all(Duration::from_secs(20));
    drop(controller);
    Api::<Namespace>::all(client.clone())
        .delete(&namespace, &DeleteParams::default())
        .await
        .unwrap();
}
