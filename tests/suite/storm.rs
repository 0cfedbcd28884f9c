//! SIGTERM in the middle of a storm of prepares, on a `domaind run` process with the
//! local backend: what the kubelet was told is what the restarted node holds.
//!
//! The rule, for every call of the storm, as read from the restarted node's `/state`:
//! - answered with success → among its claims, as prepared;
//! - refused whole (UNAVAILABLE: the plugin was shutting down and took no new calls)
//!   → not among its claims at all: the node never saw it;
//! - answered with a per-claim error → not prepared. It may still be among its claims,
//!   admitted before the stop (resolved and checkpointed, its answer not given): that
//!   is right, because the kubelet records a claim before it calls prepare and either
//!   calls prepare again (answered once the domain is ready) or, once the pod is gone,
//!   unprepare. The test plays that unprepare and sees the claim go;
//! - cut by the shutdown without an answer (the connection closed) → either.

use std::time::Duration;

use domaind_actors::model::{AllocationMode, ClaimRef, ReadinessPolicy};
use domaind_backends::local::{ClaimFile, ComputeDomainRef};
use domaind_chaos::schedule::SplitMix64;
use domaind_kubelet_plugin::DraVersion;
use domaind_kubelet_plugin::client::{ClientError, KubeletClient};
use domaind_node::run::NodeView;
use domaind_testbed::rack::{LocalRack, RackSpec, node_view, prepare_until_ready, short_temp_dir};
use tokio::task::JoinSet;

const SUBNET: u8 = domaind_loopback::E2E_STORM;
const START_LIMIT: Duration = Duration::from_secs(30);
/// A call that is neither answered nor cut within this is a hang: the daemon's own
/// shutdown is bounded well below it.
const CALL_LIMIT: Duration = Duration::from_secs(40);
const STOP_LIMIT: Duration = Duration::from_secs(30);
/// Storms, each with its own seeded SIGTERM moment.
const ROUNDS: u64 = 4;
/// Distinct claims per storm, one call each, issued evenly over `SPREAD`.
const CLAIMS: u32 = 40;
const SPREAD: Duration = Duration::from_millis(400);
const CD_UID: &str = "5f0c2a8e-storm-4c39-9a64-e2e0c0ffee47";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Prepared,
    /// A per-claim error.
    Refused(String),
    /// UNAVAILABLE from the plugin's gate: the call never reached the node.
    RefusedWhole,
    /// No answer: the connection went with the process.
    Cut(String),
}

fn claim(uid: &str) -> ClaimRef {
    ClaimRef {
        uid: uid.into(),
        namespace: "team-s".into(),
        name: format!("claim-{uid}"),
    }
}

fn claim_file(claim: &ClaimRef) -> ClaimFile {
    ClaimFile {
        namespace: claim.namespace.clone(),
        name: claim.name.clone(),
        uid: claim.uid.clone(),
        compute_domain: ComputeDomainRef {
            namespace: "team-s".into(),
            name: "storm".into(),
            uid: CD_UID.into(),
            num_nodes: 1,
            isolation: Default::default(),
        },
        allocation_mode: AllocationMode::Single,
        readiness: Some(ReadinessPolicy::Local),
        driver: None,
        device: None,
        admin_access: false,
    }
}

async fn prepare_once(client: &KubeletClient, claim: &ClaimRef) -> Outcome {
    let answered = tokio::time::timeout(
        CALL_LIMIT,
        client.prepare(std::slice::from_ref(claim), DraVersion::V1),
    )
    .await
    .unwrap_or_else(|_| panic!("{}: neither answered nor cut in {CALL_LIMIT:?}", claim.uid));
    match answered {
        Ok(mut answers) => match answers.pop().map(|a| a.result) {
            Some(Ok(_)) => Outcome::Prepared,
            Some(Err(error)) => Outcome::Refused(error),
            None => Outcome::Refused("no entry for the claim".into()),
        },
        Err(ClientError::Call { status, .. })
            if status.code() == tonic::Code::Unavailable
                && status.message().starts_with("shutting down") =>
        {
            Outcome::RefusedWhole
        }
        Err(error) => Outcome::Cut(format!("{error:#}")),
    }
}

/// The daemon's log from the start of `round` (each start is a new round), for a
/// failure's message.
fn log_of_round(rack: &LocalRack, round: u64) -> String {
    let log = std::fs::read_to_string(rack.node(0).log_path()).unwrap_or_default();
    let marker = format!("storm round {round}\n");
    match log.find(&marker) {
        Some(at) => log[at..].to_owned(),
        None => log,
    }
}

async fn view(rack: &LocalRack) -> NodeView {
    node_view(rack.node(0).info().expect("ready"))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_prepare_storm_keeps_every_answered_claim_and_no_refused_one() {
    let tmp = short_temp_dir("dms").unwrap();
    let binaries = domaind_e2e::binaries();
    let mut spec = RackSpec::new(
        1,
        binaries.domaind.clone(),
        binaries.imex_sim.clone(),
        tmp.path().into(),
    );
    spec.subnet = SUBNET;
    spec.log_filter = "info,domaind_gossip=warn".into();
    spec.extra_args = vec!["--prepare-deadline".into(), "2s".into()];
    let mut rack = LocalRack::create(spec).unwrap();
    rack.start_all().unwrap();
    rack.wait_all_ready(START_LIMIT).unwrap();

    // One claim held throughout, so that the storms hit a ready domain.
    let base = claim("storm-base");
    rack.local().write_claim(&claim_file(&base)).unwrap();
    prepare_until_ready(
        &rack.node(0).dra_socket(),
        &base,
        DraVersion::V1,
        START_LIMIT,
    )
    .await
    .unwrap()
    .unwrap();

    let mut totals = [0usize; 4];
    for round in 0..ROUNDS {
        let mut rng = SplitMix64::new(0x5167_0000 + round);
        // Inside the storm, not before or after it: calls on both sides of the signal.
        let spread = SPREAD.as_millis() as u64;
        let sigterm_at = Duration::from_millis(spread / 4 + rng.below(spread / 2));
        let claims: Vec<ClaimRef> = (0..CLAIMS)
            .map(|i| claim(&format!("storm-{round}-{i:02}")))
            .collect();
        for c in &claims {
            rack.local().write_claim(&claim_file(c)).unwrap();
        }
        // The rack appends each run's output to one log: a line says where this storm's
        // begins.
        std::fs::OpenOptions::new()
            .append(true)
            .open(rack.node(0).log_path())
            .and_then(|mut log| {
                std::io::Write::write_all(&mut log, format!("storm round {round}\n").as_bytes())
            })
            .unwrap();

        let client = KubeletClient::connect(rack.node(0).dra_socket())
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let mut calls = JoinSet::new();
        for (i, c) in claims.iter().enumerate() {
            let (client, c) = (client.clone(), c.clone());
            let at = started + SPREAD * i as u32 / CLAIMS;
            calls.spawn(async move {
                tokio::time::sleep_until(at).await;
                (c.uid.clone(), prepare_once(&client, &c).await)
            });
        }
        tokio::time::sleep_until(started + sigterm_at).await;
        rack.begin_stop(0).unwrap();
        let mut outcomes = Vec::new();
        while let Some(joined) = calls.join_next().await {
            outcomes.push(joined.unwrap());
        }
        let code = tokio::task::block_in_place(|| rack.stop(0, STOP_LIMIT)).unwrap();
        assert_eq!(
            code,
            Some(0),
            "round {round}: a graceful stop exits 0; its log:\n{}",
            log_of_round(&rack, round)
        );

        tokio::task::block_in_place(|| {
            rack.start(0).unwrap();
            rack.wait_ready(0, START_LIMIT).unwrap();
        });
        let held = view(&rack).await;
        let listed = |uid: &str| held.claims.iter().any(|c| c == uid);
        let prepared = |uid: &str| held.prepared.iter().any(|c| c == uid);
        let context = || {
            format!(
                "round {round}, SIGTERM at {sigterm_at:?}: {outcomes:?}\n{held:?}\nits log:\n{}",
                log_of_round(&rack, round)
            )
        };
        let mut admitted_refusals = Vec::new();
        for (uid, outcome) in &outcomes {
            match outcome {
                Outcome::Prepared => {
                    totals[0] += 1;
                    assert!(
                        listed(uid) && prepared(uid),
                        "{uid} was answered with success but the restarted node does not hold it prepared; {}",
                        context()
                    );
                }
                Outcome::Refused(_) => {
                    totals[1] += 1;
                    assert!(
                        !prepared(uid),
                        "{uid} was refused but the restarted node holds it prepared; {}",
                        context()
                    );
                    if listed(uid) {
                        admitted_refusals.push(claim(uid));
                    }
                }
                Outcome::RefusedWhole => {
                    totals[2] += 1;
                    assert!(
                        !listed(uid),
                        "{uid}'s call was refused whole, yet the restarted node holds it; {}",
                        context()
                    );
                }
                Outcome::Cut(_) => totals[3] += 1,
            }
        }
        assert!(prepared(&base.uid), "the base claim is kept; {}", context());

        // The kubelet's side: a claim it was refused is unprepared once its pod is gone,
        // and then the node holds it no more. Then the whole storm's pods go.
        let client = KubeletClient::connect(rack.node(0).dra_socket())
            .await
            .unwrap();
        // The kubelet never sends an empty request (the plugin refuses one).
        if !admitted_refusals.is_empty() {
            for answer in client
                .unprepare(&admitted_refusals, DraVersion::V1)
                .await
                .unwrap()
            {
                answer.result.unwrap();
            }
        }
        let after = view(&rack).await;
        for c in &admitted_refusals {
            assert!(
                !after.claims.contains(&c.uid),
                "{} stayed: {after:#?}",
                c.uid
            );
        }
        for answer in client.unprepare(&claims, DraVersion::V1).await.unwrap() {
            answer.result.unwrap();
        }
        assert_eq!(view(&rack).await.claims, vec![base.uid.clone()]);
    }

    // The storms straddled the signal: some calls were answered, some were not.
    let [answered, refused, refused_whole, cut] = totals;
    assert!(
        answered > 0 && refused + refused_whole + cut > 0,
        "prepared {answered}, refused {refused}, refused whole {refused_whole}, cut {cut}"
    );
    eprintln!(
        "storms: prepared {answered}, refused {refused}, refused whole {refused_whole}, cut {cut}"
    );
}
