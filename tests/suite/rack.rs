//! End to end: `domaind run` processes on loopback with TLS gossip, `imex-sim` and the
//! local backend, called over their unix sockets as the kubelet calls them.

use domaind_testkit::{poll_for, poll_until_true};
use std::time::Duration;

use domaind_actors::model::{AllocationMode, ClaimRef, ReadinessPolicy};
use domaind_backends::local::{ClaimFile, ComputeDomainRef};
use domaind_kube_api::crd;
use domaind_kubelet_plugin::client::{ClaimAnswer, KubeletClient, register};
use domaind_kubelet_plugin::{DraVersion, PreparedDevice};
use domaind_node::run::NodeView;
use domaind_prepare::cdi::{CdiWriter, ClaimUid};
use domaind_testbed::rack::{
    LocalRack, RackSpec, http_get, node_view, prepare_until_ready, short_temp_dir,
};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const START_LIMIT: Duration = Duration::from_secs(30);
const LIMIT: Duration = Duration::from_secs(60);
const CD_UID: &str = "0b7c2a8e-5d1f-4c39-9a64-e2e0c0ffee01";

/// The rack's directory: its daemons' and IMEX's logs, kept when the test fails so that
/// the failure can be read afterwards.
struct RackDir(Option<tempfile::TempDir>);

impl RackDir {
    fn path(&self) -> &std::path::Path {
        self.0.as_ref().expect("the rack's directory").path()
    }
}

impl Drop for RackDir {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(dir) = self.0.take()
        {
            eprintln!("the failed test's rack is kept in {}", dir.keep().display());
        }
    }
}

/// A rack running the `imex-sim` binary, or the simulator built into `domaind`.
fn rack(nodes: usize, subnet: u8, builtin_imex_sim: bool) -> (RackDir, LocalRack) {
    let tmp = RackDir(Some(short_temp_dir("dmr").unwrap()));
    let domaind = domaind_e2e::binaries().domaind.clone();
    let mut spec = if builtin_imex_sim {
        RackSpec::self_contained(nodes, domaind, tmp.path().into())
    } else {
        RackSpec::new(
            nodes,
            domaind,
            domaind_e2e::binaries().imex_sim.clone(),
            tmp.path().into(),
        )
    };
    spec.subnet = subnet;
    spec.log_filter = "info,domaind_gossip=warn".into();
    spec.extra_args = vec!["--prepare-deadline".into(), "2s".into()];
    let mut rack = LocalRack::create(spec).unwrap();
    rack.start_all().unwrap();
    rack.wait_all_ready(START_LIMIT).unwrap();
    (tmp, rack)
}

fn claim_file(uid: &str, cd_uid: &str, cd_name: &str, num_nodes: u32) -> ClaimFile {
    ClaimFile {
        namespace: "team-a".into(),
        name: format!("claim-{uid}"),
        uid: uid.into(),
        compute_domain: ComputeDomainRef {
            namespace: "team-a".into(),
            name: cd_name.into(),
            uid: cd_uid.into(),
            num_nodes,
            isolation: Default::default(),
        },
        allocation_mode: AllocationMode::Single,
        readiness: Some(ReadinessPolicy::Domain),
        driver: None,
        device: None,
        admin_access: false,
    }
}

fn cdi(rack: &LocalRack, node: usize) -> CdiWriter {
    CdiWriter::new(rack.node(node).cdi_dir(), "compute-domain.nvidia.com").unwrap()
}

fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef {
        uid: uid.into(),
        namespace: "team-a".into(),
        name: format!("claim-{uid}"),
    }
}

async fn prepare_once(
    rack: &LocalRack,
    node: usize,
    claim: &ClaimRef,
    version: DraVersion,
) -> ClaimAnswer<Vec<PreparedDevice>> {
    let client = KubeletClient::connect(rack.node(node).dra_socket())
        .await
        .unwrap();
    let mut answers = client
        .prepare(std::slice::from_ref(claim), version)
        .await
        .unwrap();
    assert_eq!(answers.len(), 1);
    answers.remove(0)
}

/// Calls prepare until it succeeds, as the kubelet does.
async fn prepare(
    rack: &LocalRack,
    node: usize,
    claim: &ClaimRef,
    version: DraVersion,
) -> Vec<PreparedDevice> {
    prepare_until_ready(&rack.node(node).dra_socket(), claim, version, LIMIT)
        .await
        .unwrap()
        .unwrap_or_else(|error| panic!("{} not prepared: {error}", claim.uid))
}

async fn view(rack: &LocalRack, node: usize) -> NodeView {
    node_view(rack.node(node).info().expect("ready"))
        .await
        .unwrap()
}

async fn get(rack: &LocalRack, node: usize, path: &str) -> (u16, String) {
    http_get(rack.node(node).info().expect("ready").http_addr, path)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_daemons_form_a_domain_heal_a_kill_and_rejoin() {
    let (_tmp, mut rack) = rack(3, domaind_loopback::E2E_RACK_FORMS, false);
    let names: Vec<String> = rack.nodes().iter().map(|n| n.name().to_owned()).collect();

    // Registration, as the kubelet's plugin watcher does it.
    for node in rack.nodes() {
        let registration = register(&node.registration_socket()).await.unwrap();
        assert_eq!(registration.driver_name, "compute-domain.nvidia.com");
        assert_eq!(registration.endpoint, node.dra_socket());
        assert_eq!(
            registration.versions,
            vec![DraVersion::V1, DraVersion::V1beta1]
        );
    }

    for name in &names {
        rack.local()
            .write_claim(&claim_file(&format!("c-{name}"), CD_UID, "training", 3))
            .unwrap();
    }
    let calls = (0..3).map(|i| {
        let claim = claim_ref(&format!("c-{}", names[i]));
        let rack = &rack;
        async move { prepare(rack, i, &claim, DraVersion::V1).await }
    });
    let answers = futures::future::join_all(calls).await;
    for (i, devices) in answers.iter().enumerate() {
        let uid = format!("c-{}", names[i]);
        assert_eq!(devices.len(), 1, "{devices:?}");
        assert_eq!(devices[0].pool_name, names[i]);
        assert_eq!(devices[0].device_name, "channel-0");
        assert_eq!(devices[0].request_names, vec!["channel".to_string()]);
        assert_eq!(
            devices[0].cdi_device_ids,
            vec![format!(
                "k8s.compute-domain.nvidia.com/claim={uid}-channel-0"
            )]
        );
        let spec = cdi(&rack, i).spec_path(&ClaimUid::new(&uid).unwrap());
        assert!(spec.exists(), "{} is written", spec.display());
    }
    poll_for(
        "the status file shows Ready with three nodes",
        LIMIT,
        async || {
            let status = rack.local().read_status(CD_UID).unwrap();
            let done = status.as_ref().is_some_and(|s| {
                s.status == crd::Phase::Ready
                    && s.nodes.len() == 3
                    && s.nodes.iter().all(|n| n.status == crd::Phase::Ready)
            });
            if done { Ok(()) } else { Err(status) }
        },
    )
    .await;

    // Concurrent calls for one claim are safe and get the same answer.
    let claim0 = claim_ref(&format!("c-{}", names[0]));
    let (first, second) = tokio::join!(
        prepare(&rack, 0, &claim0, DraVersion::V1),
        prepare(&rack, 0, &claim0, DraVersion::V1)
    );
    assert_eq!((&first, &second), (&answers[0], &answers[0]));

    // The older DRA version answers the same, from the checkpoint.
    let again = prepare(
        &rack,
        1,
        &claim_ref(&format!("c-{}", names[1])),
        DraVersion::V1beta1,
    )
    .await;
    assert_eq!(again, answers[1]);

    for i in 0..3 {
        let channel = KubeletClient::connect(rack.node(i).dra_socket())
            .await
            .unwrap()
            .channel();
        let health = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(health.status(), ServingStatus::Serving);
        assert_eq!(get(&rack, i, "/healthz").await.0, 200);
        assert_eq!(get(&rack, i, "/readyz").await.0, 200);
        // /state tells claims, domains and IMEX peers: never on the network-facing port.
        assert_eq!(get(&rack, i, "/state").await.0, 404);
        let (code, metrics) = get(&rack, i, "/metrics").await;
        assert_eq!(code, 200);
        assert!(metrics.contains("domaind_prepare_total"), "{metrics}");
    }

    // SIGKILL: no retraction, the survivors' failure detector must find out.
    rack.kill(2).unwrap();
    poll_for("the status shows node-03 lost", LIMIT, async || {
        let status = rack.local().read_status(CD_UID).unwrap();
        let done = status.as_ref().is_some_and(|s| {
            s.status == crd::Phase::NotReady
                && s.nodes
                    .iter()
                    .any(|n| n.name == "node-03" && n.status == crd::Phase::NotReady)
        });
        if done { Ok(()) } else { Err(status) }
    })
    .await;
    poll_for("the survivors drop node-03 from IMEX", LIMIT, async || {
        let views = vec![view(&rack, 0).await, view(&rack, 1).await];
        let done = views.iter().all(|v| {
            v.domains.len() == 1
                && !v.domains[0].peers.values().any(|n| n == "node-03")
                && v.domains[0].lost == vec!["node-03".to_string()]
        });
        if done { Ok(()) } else { Err(views) }
    })
    .await;
    let events = rack.local().read_events(CD_UID).unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.reason == "NodeLost" && e.message.contains("node-03")),
        "{events:#?}"
    );

    // Back: it restores its checkpoint and rejoins without being asked again.
    rack.start(2).unwrap();
    rack.wait_ready(2, START_LIMIT).unwrap();
    poll_for("node-03 rejoins from its checkpoint", LIMIT, async || {
        let view = view(&rack, 2).await;
        let done = view.claims == vec!["c-node-03".to_string()]
            && view.domains.first().is_some_and(|d| d.peers.len() == 3);
        if done { Ok(()) } else { Err(view) }
    })
    .await;
    poll_for(
        "the status is Ready with three nodes again",
        LIMIT,
        async || {
            let status = rack.local().read_status(CD_UID).unwrap();
            let done = status
                .as_ref()
                .is_some_and(|s| s.status == crd::Phase::Ready && s.ready_nodes == 3);
            if done { Ok(()) } else { Err(status) }
        },
    )
    .await;
    let restored = prepare(&rack, 2, &claim_ref("c-node-03"), DraVersion::V1).await;
    assert_eq!(restored, answers[2]);

    // SIGTERM: the node retracts itself, so survivors drop it as departed, not lost.
    let imex_dir = rack.node(2).imex_dir();
    assert_eq!(rack.stop(2, LIMIT).unwrap(), Some(0));
    poll_for(
        "the survivors drop the departed node-03",
        LIMIT,
        async || {
            let views = vec![view(&rack, 0).await, view(&rack, 1).await];
            let done = views.iter().all(|v| {
                !v.domains[0].members.iter().any(|n| n == "node-03") && v.domains[0].lost.is_empty()
            });
            if done { Ok(()) } else { Err(views) }
        },
    )
    .await;
    assert!(
        domaind_node::run::RunInfo::read(&rack.node(2).state_dir())
            .unwrap()
            .is_none(),
        "a clean stop removes run.json"
    );
    assert!(imex_dir.exists());

    for i in 0..2 {
        assert_eq!(rack.stop(i, LIMIT).unwrap(), Some(0));
    }
    assert_eq!(rack.unexpected_exits(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_claims_get_precise_errors_over_the_socket() {
    let (_tmp, mut rack) = rack(1, domaind_loopback::E2E_RACK_BAD_CLAIMS, true);
    let local = rack.local().clone();

    let unknown = prepare_once(&rack, 0, &claim_ref("nobody"), DraVersion::V1).await;
    let error = unknown.result.unwrap_err();
    assert!(error.contains("unknown"), "{error}");

    let mut other_driver = claim_file("gpu", CD_UID, "training", 0);
    other_driver.driver = Some("gpu.nvidia.com".into());
    local.write_claim(&other_driver).unwrap();
    let error = prepare_once(&rack, 0, &claim_ref("gpu"), DraVersion::V1)
        .await
        .result
        .unwrap_err();
    assert!(
        error.contains("allocated by driver gpu.nvidia.com"),
        "{error}"
    );

    std::fs::write(local.claim_path("garbled").unwrap(), b"{\"uid\": ").unwrap();
    let error = prepare_once(&rack, 0, &claim_ref("garbled"), DraVersion::V1)
        .await
        .result
        .unwrap_err();
    assert!(error.contains("is not valid"), "{error}");

    let mut elsewhere = claim_file("ns", CD_UID, "training", 0);
    elsewhere.compute_domain.namespace = "team-b".into();
    local.write_claim(&elsewhere).unwrap();
    let error = prepare_once(&rack, 0, &claim_ref("ns"), DraVersion::V1)
        .await
        .result
        .unwrap_err();
    assert!(error.contains("own namespace"), "{error}");

    // One domain per node: a claim of a second one is refused, naming both.
    let mut first = claim_file("first", CD_UID, "training", 0);
    first.readiness = Some(ReadinessPolicy::Local);
    local.write_claim(&first).unwrap();
    prepare(&rack, 0, &claim_ref("first"), DraVersion::V1).await;
    local
        .write_claim(&claim_file("second", "cd-other", "inference", 0))
        .unwrap();
    let error = prepare_once(&rack, 0, &claim_ref("second"), DraVersion::V1)
        .await
        .result
        .unwrap_err();
    assert!(
        error.contains("already serves")
            && error.contains("training")
            && error.contains("inference"),
        "{error}"
    );

    // Errors of one claim do not hold back the others of the same request.
    let client = KubeletClient::connect(rack.node(0).dra_socket())
        .await
        .unwrap();
    let mixed = client
        .prepare(
            &[claim_ref("first"), claim_ref("nobody")],
            DraVersion::V1beta1,
        )
        .await
        .unwrap();
    assert!(mixed[0].result.is_ok(), "{mixed:?}");
    assert!(mixed[1].result.is_err(), "{mixed:?}");

    let unknown = client
        .unprepare(&[claim_ref("never-prepared")], DraVersion::V1)
        .await
        .unwrap();
    assert_eq!(unknown[0].result, Ok(()));
    let released = client
        .unprepare(&[claim_ref("first")], DraVersion::V1)
        .await
        .unwrap();
    assert_eq!(released[0].result, Ok(()));
    assert!(
        !cdi(&rack, 0)
            .spec_path(&ClaimUid::new("first").unwrap())
            .exists(),
        "unprepare removes the CDI spec"
    );
    // The node is free again: the other domain may come.
    prepare(&rack, 0, &claim_ref("second"), DraVersion::V1).await;
    assert_eq!(rack.stop(0, LIMIT).unwrap(), Some(0));
}

/// The hostage: a claim deleted while its daemon was down stays in the checkpoint, and
/// the node would refuse every other domain. At the restart, the stale-claim check
/// releases it (CDI spec, checkpoint, domain) with an event, and the next domain comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_deleted_while_the_daemon_was_down_is_released_at_start() {
    let (_tmp, mut rack) = rack(1, domaind_loopback::E2E_RACK_DELETED_CLAIM, true);
    let local = rack.local().clone();
    let mut first = claim_file("first", CD_UID, "training", 0);
    first.readiness = Some(ReadinessPolicy::Local);
    local.write_claim(&first).unwrap();
    prepare(&rack, 0, &claim_ref("first"), DraVersion::V1).await;
    let spec = cdi(&rack, 0).spec_path(&ClaimUid::new("first").unwrap());
    assert!(spec.exists());

    assert_eq!(rack.stop(0, LIMIT).unwrap(), Some(0));
    local.remove_claim("first").unwrap();
    rack.start(0).unwrap();
    rack.wait_ready(0, START_LIMIT).unwrap();

    poll_for("the stale claim is released", LIMIT, async || {
        let events = local.read_events(CD_UID).unwrap();
        let released = events.iter().any(|e| e.reason == "StaleClaimReleased");
        let claims = view(&rack, 0).await.claims;
        if released && !spec.exists() && claims.is_empty() {
            Ok(())
        } else {
            Err((events, claims))
        }
    })
    .await;
    let event = local
        .read_events(CD_UID)
        .unwrap()
        .into_iter()
        .find(|e| e.reason == "StaleClaimReleased")
        .unwrap();
    assert!(
        event.message.contains("claim team-a/claim-first (first)")
            && event.message.contains("no longer exists"),
        "{}",
        event.message
    );
    let mut second = claim_file("second", "cd-other", "inference", 0);
    second.readiness = Some(ReadinessPolicy::Local);
    local.write_claim(&second).unwrap();
    prepare(&rack, 0, &claim_ref("second"), DraVersion::V1).await;
    assert_eq!(rack.stop(0, LIMIT).unwrap(), Some(0));
}

/// The "done when": forged gossip from a certificate of the rack's CA, for a
/// node outside it, leaves a formed domain as it was (`domaind-chaos forge`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_gossip_leaves_a_formed_domain_ready_and_its_slots_and_peers_unchanged() {
    let (tmp, rack) = rack(3, domaind_loopback::E2E_RACK_FORGED_GOSSIP, true);
    let names: Vec<String> = rack.nodes().iter().map(|n| n.name().to_owned()).collect();
    for name in &names {
        rack.local()
            .write_claim(&claim_file(&format!("f-{name}"), CD_UID, "training", 3))
            .unwrap();
    }
    let calls = (0..3).map(|i| {
        let claim = claim_ref(&format!("f-{}", names[i]));
        let rack = &rack;
        async move { prepare(rack, i, &claim, DraVersion::V1).await }
    });
    futures::future::join_all(calls).await;
    poll_for("every node sees the domain Ready 3/3", LIMIT, async || {
        let mut views = Vec::new();
        for i in 0..3 {
            views.push(view(&rack, i).await);
        }
        let done = views.iter().all(|v| {
            v.domains.len() == 1
                && v.domains[0].phase == domaind_actors::model::Phase::Ready
                && v.domains[0].ready == 3
                && v.domains[0].peers.len() == 3
        });
        if done { Ok(()) } else { Err(views) }
    })
    .await;

    let cluster =
        domaind_gossip::cluster_id_for_clique(&domaind_gpu::Topology::simulated_clique(1).0);
    let report = domaind_chaos::forge::forge_rack(
        tmp.path(),
        &cluster,
        domaind_loopback::addr(domaind_loopback::E2E_RACK_FORGED_GOSSIP, 250).into(),
    )
    .await
    .unwrap();
    println!("{}", report.table());
    assert!(report.ok(), "{:#?}", report.problems);
    for reason in [
        "wrong_signer",
        "bad_signature",
        "unsigned_tombstone",
        "rollback",
        "untrusted_certificate",
        "unsigned_max_version",
    ] {
        assert!(
            report.refused.get(reason).copied().unwrap_or(0) > 0,
            "{reason}: {:?}",
            report.refused
        );
    }
}

/// IMEX kept by a runner (issue 28, `RackSpec::imex_runner`): a daemon SIGKILLed, or
/// stopped with SIGTERM, leaves its node's IMEX daemon running, and the daemon started
/// after it adopts that one: the same process, never a new instance. What the job
/// sees: its imports hold, the domain's Ready condition never changes, no event is
/// told, and the survivor's IMEX is never reconfigured. A node kill (the daemon and
/// its runner) takes IMEX with it, and the survivor's import of its memory breaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_restart_leaves_imex_running_and_the_next_daemon_adopts_it() {
    let tmp = short_temp_dir("dmr").unwrap();
    let mut spec = RackSpec::self_contained(
        2,
        domaind_e2e::binaries().domaind.clone(),
        tmp.path().into(),
    );
    spec.subnet = domaind_loopback::E2E_RACK_IMEX_RUNNER;
    spec.imex_runner = true;
    spec.log_filter = "info,domaind_gossip=warn".into();
    let mut rack = LocalRack::create(spec).unwrap();
    rack.start_all().unwrap();
    rack.wait_all_ready(START_LIMIT).unwrap();
    let names: Vec<String> = rack.nodes().iter().map(|n| n.name().to_owned()).collect();
    for name in &names {
        rack.local()
            .write_claim(&claim_file(&format!("r-{name}"), CD_UID, "kept", 2))
            .unwrap();
    }
    // At once: each answers once every node of the domain is ready.
    futures::future::join_all(names.iter().enumerate().map(|(i, name)| {
        let (rack, claim) = (&rack, claim_ref(&format!("r-{name}")));
        async move { prepare(rack, i, &claim, DraVersion::V1).await }
    }))
    .await;
    let imex = rack.imex_daemons().unwrap();
    assert!(imex.iter().all(|pids| pids.len() == 1), "{imex:?}");
    let kept = imex[1][0];
    let held = vec![rack.import(0).await.unwrap(), rack.import(1).await.unwrap()];
    // The Ready condition, transition time included: a status that left Ready and came
    // back would have a newer one.
    let ready_condition = |rack: &LocalRack| {
        let status = rack.local().read_status(CD_UID).unwrap().unwrap();
        let ready = status.condition(crd::READY_CONDITION).cloned();
        (status.status, ready)
    };
    // The reporter writes the status once the domain has been quiet a moment: after
    // the prepares were answered, not with them.
    poll_for("the status is written Ready", LIMIT, async || {
        let written = rack.local().read_status(CD_UID).ok().flatten();
        let ready = written
            .as_ref()
            .is_some_and(|s| s.status == crd::Phase::Ready);
        if ready {
            Ok(())
        } else {
            Err(written.is_some())
        }
    })
    .await;
    let (phase, ready) = ready_condition(&rack);
    assert_eq!((phase, ready.is_some()), (crd::Phase::Ready, true));
    let events = rack.local().read_events(CD_UID).unwrap().len();
    // What the survivor did to its IMEX: the starts and reloads it counted.
    let survivor_imex = async |rack: &LocalRack| {
        let (_, metrics) = get(rack, 0, "/metrics").await;
        metrics
            .lines()
            .filter(|l| {
                l.starts_with("domaind_imex_starts_total") || l.starts_with("domaind_imex_reloads")
            })
            .map(str::to_owned)
            .collect::<std::collections::BTreeSet<_>>()
    };
    let survivor = survivor_imex(&rack).await;

    // The adoption, and whether IMEX was started or reconfigured (a reload) since.
    let adoptions = async |rack: &LocalRack| {
        let (_, metrics) = get(rack, 1, "/metrics").await;
        let line = metrics
            .lines()
            .find(|l| l.starts_with("domaind_imex_adoptions_total{outcome=\"adopted\"}"))
            .map(str::to_owned);
        let touched = ["domaind_imex_starts_total", "domaind_imex_reloads"]
            .iter()
            .any(|name| metrics.contains(name));
        (line, touched)
    };
    for (how, stop) in [("SIGKILL", true), ("SIGTERM", false)] {
        if stop {
            rack.kill(1).unwrap();
        } else {
            assert_eq!(rack.stop(1, LIMIT).unwrap(), Some(0));
        }
        assert_eq!(
            rack.imex_daemons().unwrap()[1],
            vec![kept],
            "IMEX outlives a daemon ended by {how}"
        );
        rack.start(1).unwrap();
        rack.wait_ready(1, START_LIMIT).unwrap();
        poll_for(
            &format!("the daemon after {how} adopts IMEX"),
            LIMIT,
            async || {
                let seen = adoptions(&rack).await;
                if seen.0.is_some() { Ok(()) } else { Err(seen) }
            },
        )
        .await;
        let (adopted, touched) = adoptions(&rack).await;
        assert_eq!(
            adopted.as_deref(),
            Some("domaind_imex_adoptions_total{outcome=\"adopted\"} 1")
        );
        assert!(
            !touched,
            "after {how}, IMEX was neither started nor reconfigured while the node caught up"
        );
        assert_eq!(
            rack.imex_daemons().unwrap()[1],
            vec![kept],
            "the same process after {how}"
        );
        assert_eq!(rack.broken_imports(&held).await, vec![], "after {how}");
        assert_eq!(
            ready_condition(&rack),
            (phase, ready.clone()),
            "after {how}"
        );
        let told = rack.local().read_events(CD_UID).unwrap();
        assert_eq!(told.len(), events, "after {how}: {:?}", &told[events..]);
        assert_eq!(survivor_imex(&rack).await, survivor, "after {how}");
    }

    // The guard ends the runner's daemons with it.
    rack.kill_node(1).unwrap();
    // Gone, or a zombie left to whoever reaps orphans here.
    let gone = || {
        std::fs::read_to_string(format!("/proc/{kept}/stat"))
            .map_or(true, |stat| domaind_imex::leftover::stat_says_ended(&stat))
    };
    poll_until_true("a node kill to take its IMEX with it", LIMIT, async || {
        gone()
    })
    .await;
    assert!(rack.imex_daemons().unwrap()[1].is_empty());
    // The survivor drops the dead node from its IMEX, which cleans its import up.
    poll_for(
        "the survivor's import of the dead node breaks",
        LIMIT,
        async || {
            let broken = rack.broken_imports(&held[..1]).await;
            if broken.len() == 1 {
                Ok(())
            } else {
                Err(broken)
            }
        },
    )
    .await;
    rack.stop_all(LIMIT);
    assert_eq!(rack.unexpected_exits(), Vec::<String>::new());
}
