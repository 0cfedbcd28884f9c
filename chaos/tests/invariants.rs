//! The invariants can fail: each is fed a rack that breaks it (and, beside it, the same
//! rack within bounds, which must pass), through the same readers the harness uses on
//! real files.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use domaind_actors::model::Phase;
use domaind_chaos::invariants::{
    ClaimPhase, Hit, Invariant, Life, Violation, World, check, dropped_by_all, held_by_all,
    import_break, may_break_imports, names_imex_failing, unsettled,
};
use domaind_chaos::observe::{
    FileRead, HostsBlock, NodeObservation, Observation, read_checkpoint, read_hosts,
    read_nodes_config,
};
use domaind_chaos::schedule::FaultKind;
use domaind_kube_api::crd::{
    ComputeDomainNode, ComputeDomainStatus, Condition, ConditionStatus, Phase as CrdPhase,
};
use domaind_node::run::{DomainView, GossipView, ImexView, NodeView};

const UID: &str = "cd-1";
const GRACE: Duration = Duration::from_secs(5);
const NAMES: [&str; 3] = ["node-01", "node-02", "node-03"];

fn ip(i: usize) -> IpAddr {
    format!("127.0.9.{}", i + 1).parse().unwrap()
}

/// Three nodes, up for a minute, each holding its prepared claim.
fn formed(now: Instant) -> World {
    let long_ago = now - Duration::from_secs(60);
    let mut world = World::new(
        UID,
        GRACE,
        NAMES
            .iter()
            .enumerate()
            .map(|(i, n)| ((*n).to_owned(), ip(i))),
        long_ago,
    );
    for (i, name) in NAMES.iter().enumerate() {
        world.set_life(i, Life::Up, long_ago);
        world.set_claim(i, &format!("claim-{name}"), ClaimPhase::Prepared, long_ago);
    }
    world
}

fn block(members: &[usize]) -> HostsBlock {
    HostsBlock {
        slots: members.iter().map(|m| (*m as u16, ip(*m))).collect(),
        parked: 18 - members.len(),
    }
}

fn view(i: usize, members: &[usize]) -> NodeView {
    NodeView {
        node: NAMES[i].into(),
        claims: vec![format!("claim-{}", NAMES[i])],
        prepared: vec![format!("claim-{}", NAMES[i])],
        imex: ImexView {
            running: true,
            starts: 1,
            restarts: 0,
            last_failure: None,
            restart_delay_ms: None,
            failing: false,
            failures_in_a_row: 0,
        },
        domains: vec![DomainView {
            uid: UID.into(),
            namespace: "ns".into(),
            name: "cd".into(),
            phase: Phase::Ready,
            ready: members.len(),
            total: members.len(),
            slot: Some(i as u16),
            local_ready: true,
            members: members.iter().map(|m| NAMES[*m].to_owned()).collect(),
            lost: Vec::new(),
            held: Vec::new(),
            peers: members
                .iter()
                .map(|m| (*m as u16, NAMES[*m].to_owned()))
                .collect(),
            reporter: Some(NAMES[0].into()),
            isolation: Default::default(),
            channel: None,
        }],
        gossip: GossipView {
            cluster_id: "clique-a".into(),
            members: members.iter().map(|m| NAMES[*m].to_owned()).collect(),
            state: Default::default(),
        },
        checkpoint: Default::default(),
        channels: Vec::new(),
        shared_imex: None,
    }
}

fn status(members: &[usize]) -> ComputeDomainStatus {
    ComputeDomainStatus {
        status: domaind_kube_api::crd::Phase::Ready,
        nodes: members
            .iter()
            .map(|m| ComputeDomainNode {
                name: NAMES[*m].into(),
                ip_address: ip(*m).to_string(),
                clique_id: "c.1".into(),
                index: Some(*m as u16),
                status: domaind_kube_api::crd::Phase::Ready,
            })
            .collect(),
        ready_nodes: members.len() as u32,
        total_nodes: members.len() as u32,
        conditions: Vec::new(),
        observed_generation: None,
        channel: None,
    }
}

/// What a whole, agreeing rack of `members` looks like from outside.
fn healthy(now: Instant, members: &[usize]) -> Observation {
    Observation {
        at: now,
        nodes: (0..3)
            .map(|i| {
                let mut seen = NodeObservation::empty();
                seen.nodes_config = FileRead::Read(18);
                seen.checkpoint = FileRead::Read(BTreeSet::from([format!("claim-{}", NAMES[i])]));
                if members.contains(&i) {
                    seen.hosts = FileRead::Read(block(members));
                    seen.imex_pids = vec![100 + i as u32];
                    seen.view = Some(view(i, members));
                }
                seen
            })
            .collect(),
        status: FileRead::Read(status(members)),
    }
}

fn only(violations: &[Violation], invariant: Invariant) -> Vec<&Violation> {
    violations
        .iter()
        .filter(|v| v.invariant == invariant)
        .collect()
}

#[test]
fn a_whole_rack_breaks_nothing_and_is_settled() {
    let now = Instant::now();
    let world = formed(now);
    let obs = healthy(now, &[0, 1, 2]);
    assert_eq!(check(&world, &obs, now), Vec::new());
    assert_eq!(unsettled(&world, &obs), Vec::new());
}

#[test]
fn a_node_that_left_may_linger_for_the_grace_but_not_after() {
    let now = Instant::now();
    let mut world = formed(now);
    // node-03 unprepared its claim 2 s ago; node-01 still lists it.
    world.set_claim(
        2,
        "claim-node-03",
        ClaimPhase::Released,
        now - Duration::from_secs(2),
    );
    let mut obs = healthy(now, &[0, 1, 2]);
    obs.nodes[2].checkpoint = FileRead::Read(BTreeSet::new());
    obs.nodes[2].imex_pids.clear();
    assert_eq!(check(&world, &obs, now), Vec::new(), "within the grace");

    let later = now + Duration::from_secs(4);
    let violations = check(&world, &obs, later);
    let isolation = only(&violations, Invariant::Isolation);
    assert_eq!(isolation.len(), 2, "{violations:#?}");
    assert!(isolation.iter().all(|v| v.detail.contains("node-03")));
    assert_eq!(isolation[0].node.as_deref(), Some("node-01"));
}

#[test]
fn a_fake_entry_in_a_real_hosts_file_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    let now = Instant::now();
    let world = formed(now);
    let mut obs = healthy(now, &[0, 1, 2]);

    // What the daemon writes, plus an address the rack does not have.
    write_hosts(
        &hosts,
        &[
            (0, "127.0.9.1"),
            (1, "127.0.9.2"),
            (2, "127.0.9.3"),
            (3, "10.1.2.3"),
        ],
    );
    obs.nodes[1].hosts = read_hosts(&hosts);
    let violations = check(&world, &obs, now);
    assert!(
        violations
            .iter()
            .any(|v| v.invariant == Invariant::Isolation
                && v.node.as_deref() == Some("node-02")
                && v.detail.contains("10.1.2.3")),
        "{violations:#?}"
    );
    assert!(!unsettled(&world, &obs).is_empty());

    // A name that is not a slot in our block: IMEX would resolve it.
    std::fs::write(
        &hosts,
        "# BEGIN domaind IMEX slots\n127.0.9.1\tdomaind-imex-slot-000\n127.0.9.9\tintruder\n# END domaind IMEX slots\n",
    )
    .unwrap();
    obs.nodes[1].hosts = read_hosts(&hosts);
    let violations = check(&world, &obs, now);
    assert!(
        only(&violations, Invariant::Isolation)
            .iter()
            .any(|v| v.detail.contains("intruder")),
        "{violations:#?}"
    );

    // One node in two slots.
    write_hosts(
        &hosts,
        &[
            (0, "127.0.9.1"),
            (1, "127.0.9.2"),
            (2, "127.0.9.3"),
            (5, "127.0.9.2"),
        ],
    );
    obs.nodes[1].hosts = read_hosts(&hosts);
    let violations = check(&world, &obs, now);
    assert!(
        only(&violations, Invariant::Slots)
            .iter()
            .any(|v| v.detail.contains("node-02") && v.detail.contains("[1, 5]")),
        "{violations:#?}"
    );

    // An address in the nodes config bypasses the hosts mapping.
    let nodes_config = dir.path().join("nodes_config.cfg");
    std::fs::write(&nodes_config, "domaind-imex-slot-000\n127.0.9.3\n").unwrap();
    obs.nodes[1].nodes_config = read_nodes_config(&nodes_config);
    assert!(
        only(&check(&world, &obs, now), Invariant::Isolation)
            .iter()
            .any(|v| v.detail.contains("nodes config")),
    );
}

fn write_hosts(path: &Path, entries: &[(u16, &str)]) {
    let mut text = "127.0.0.1 localhost\n# BEGIN domaind IMEX slots\n".to_owned();
    for (slot, ip) in entries {
        text.push_str(&format!("{ip}\tdomaind-imex-slot-{slot:03}\n"));
    }
    text.push_str("# END domaind IMEX slots\n");
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_node_out_of_the_domain_must_not_run_imex() {
    let now = Instant::now();
    let mut world = formed(now);
    world.set_claim(
        2,
        "claim-node-03",
        ClaimPhase::Released,
        now - Duration::from_secs(30),
    );
    let mut obs = healthy(now, &[0, 1]);
    obs.nodes[2].checkpoint = FileRead::Read(BTreeSet::new());
    assert_eq!(check(&world, &obs, now), Vec::new());
    obs.nodes[2].imex_pids = vec![4242];
    let violations = check(&world, &obs, now);
    assert!(
        only(&violations, Invariant::Isolation)
            .iter()
            .any(|v| v.node.as_deref() == Some("node-03") && v.detail.contains("4242")),
        "{violations:#?}"
    );
}

#[test]
fn lost_and_resurrected_claims_are_caught_in_real_checkpoint_files() {
    use domaind_actors::ports::CheckpointStore as _;
    use domaind_checkpoint::{CheckpointConfig, FileCheckpointStore, JOURNAL_FILE};

    let dir = tempfile::tempdir().unwrap();
    let now = Instant::now();
    let mut world = formed(now);
    let mut obs = healthy(now, &[0, 1, 2]);

    // A checkpoint written by the daemon's own store, holding no claim.
    let store = FileCheckpointStore::open(CheckpointConfig::new(dir.path())).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        store.load().await.unwrap();
        let claim = domaind_actors::ports::CheckpointChange::ClaimGone("never-held".into());
        store.record(vec![claim]).await.unwrap();
    });
    obs.nodes[0].checkpoint = read_checkpoint(dir.path());
    let violations = check(&world, &obs, now);
    assert!(
        only(&violations, Invariant::Checkpoint)
            .iter()
            .any(|v| v.node.as_deref() == Some("node-01")
                && v.detail.contains("lost prepared claims")),
        "{violations:#?}"
    );

    // A damaged record.
    std::fs::write(dir.path().join(JOURNAL_FILE), b"00000000 {\"v\":2,\n").unwrap();
    obs.nodes[0].checkpoint = read_checkpoint(dir.path());
    assert!(!only(&check(&world, &obs, now), Invariant::Checkpoint).is_empty());

    // /state that forgot a claim after a restart.
    let mut obs = healthy(now, &[0, 1, 2]);
    obs.nodes[1].view.as_mut().unwrap().claims.clear();
    assert!(
        only(&check(&world, &obs, now), Invariant::Checkpoint)
            .iter()
            .any(|v| v.detail.contains("/state lost")),
    );

    // An unprepared claim still in the checkpoint.
    let obs = healthy(now, &[0, 1, 2]);
    world.set_claim(0, "claim-node-01", ClaimPhase::Released, now);
    world.set_claim(0, "extra", ClaimPhase::Prepared, now);
    let mut obs = obs;
    obs.nodes[0].checkpoint =
        FileRead::Read(BTreeSet::from(["claim-node-01".into(), "extra".into()]));
    assert!(
        only(&check(&world, &obs, now), Invariant::Checkpoint)
            .iter()
            .any(|v| v.detail.contains("still holds unprepared")),
    );
}

#[test]
fn a_full_state_directory_may_lag_on_disk_for_the_grace_but_never_in_state() {
    let now = Instant::now();
    let mut world = formed(now);
    let filled = now - Duration::from_secs(3);
    world.set_state_dir_full(0, true, filled);
    world.set_claim(0, "while-full", ClaimPhase::Prepared, filled);
    let mut obs = healthy(now, &[0, 1, 2]);
    obs.nodes[0]
        .view
        .as_mut()
        .unwrap()
        .claims
        .push("while-full".into());
    // Answered from memory while full: the file does not have it yet.
    assert_eq!(
        only(&check(&world, &obs, now), Invariant::Checkpoint),
        Vec::<&Violation>::new()
    );
    // /state must have it all the same.
    let mut forgetful = obs.clone();
    forgetful.nodes[0].view.as_mut().unwrap().claims.pop();
    assert!(
        only(&check(&world, &forgetful, now), Invariant::Checkpoint)
            .iter()
            .any(|v| v.detail.contains("/state lost") && v.detail.contains("while-full")),
    );
    // Freed: the file has the grace to catch up, then it must.
    world.set_state_dir_full(0, false, now);
    assert!(only(&check(&world, &obs, now + GRACE / 2), Invariant::Checkpoint).is_empty());
    assert!(
        only(&check(&world, &obs, now + GRACE), Invariant::Checkpoint)
            .iter()
            .any(|v| v.detail.contains("lost prepared claims") && v.detail.contains("while-full")),
    );
}

#[test]
fn an_imex_restart_the_harness_did_not_cause_is_a_crash() {
    let now = Instant::now();
    let mut world = formed(now);
    let mut obs = healthy(now, &[0, 1, 2]);
    obs.nodes[2].view.as_mut().unwrap().imex.restarts = 1;
    assert_eq!(only(&check(&world, &obs, now), Invariant::Crash).len(), 1);
    world.nodes[2].imex_crashes = 1;
    assert_eq!(check(&world, &obs, now), Vec::new());
}

#[test]
fn disagreement_and_a_false_status_are_unsettled() {
    let now = Instant::now();
    let world = formed(now);

    let mut obs = healthy(now, &[0, 1, 2]);
    obs.nodes[1].hosts = FileRead::Read(HostsBlock {
        slots: BTreeMap::from([(0, ip(0)), (1, ip(1)), (4, ip(2))]),
        parked: 15,
    });
    let reasons = unsettled(&world, &obs);
    assert!(
        reasons.iter().any(|r| r.invariant == Invariant::Agreement
            && r.node.as_deref() == Some("node-02")
            && r.detail.contains("differs")),
        "{reasons:#?}"
    );
    // The status agrees with node-01's peer set: only node-02 is off.
    assert!(
        reasons.iter().all(|r| r.invariant != Invariant::Status),
        "{reasons:#?}"
    );

    let mut obs = healthy(now, &[0, 1, 2]);
    let FileRead::Read(status) = &mut obs.status else {
        unreachable!()
    };
    status.nodes.pop();
    status.total_nodes = 2;
    status.ready_nodes = 2;
    let reasons = unsettled(&world, &obs);
    assert!(
        reasons
            .iter()
            .any(|r| r.invariant == Invariant::Status && r.detail.contains("node-03")),
        "{reasons:#?}"
    );

    let mut obs = healthy(now, &[0, 1, 2]);
    obs.nodes[0].view.as_mut().unwrap().domains[0].lost = vec!["node-02".into()];
    assert!(!unsettled(&world, &obs).is_empty());

    let mut obs = healthy(now, &[0, 1, 2]);
    obs.status = FileRead::Missing;
    assert!(
        unsettled(&world, &obs)
            .iter()
            .any(|r| r.invariant == Invariant::Status)
    );
}

#[test]
fn a_dead_node_counts_as_dropped_only_once_nobody_lists_it() {
    let now = Instant::now();
    let mut world = formed(now);
    world.set_life(2, Life::Down, now);
    let mut obs = healthy(now, &[0, 1, 2]);
    assert!(!dropped_by_all(&world, &obs, 2));
    obs.nodes[0].hosts = FileRead::Read(block(&[0, 1]));
    assert!(!dropped_by_all(&world, &obs, 2), "node-02 still lists it");
    obs.nodes[1].hosts = FileRead::Read(block(&[0, 1]));
    assert!(dropped_by_all(&world, &obs, 2));
}

/// The imex-port fault's invariant: the status names the node only when the reporter
/// wrote it so: NotReady, the node's row NotReady, and the node in the Ready
/// condition's list of failing IMEX daemons (not merely somewhere in the message).
#[test]
fn a_failing_imex_is_named_only_as_the_reporter_writes_it() {
    let with = |phase: CrdPhase, row: CrdPhase, message: &str| {
        let mut written = status(&[0, 1, 2]);
        written.status = phase;
        written.nodes[2].status = row;
        written.conditions = vec![Condition {
            type_: "Ready".into(),
            status: ConditionStatus::False,
            last_transition_time: "2026-11-22T10:00:00Z".into(),
            reason: "NodesNotReady".into(),
            message: message.into(),
            observed_generation: None,
        }];
        FileRead::Read(written)
    };
    let node = NAMES[2];
    let named = format!(
        "2/3 nodes ready, IMEX failing on: {}",
        NAMES[0..3].join(", ")
    );
    assert!(names_imex_failing(
        &with(CrdPhase::NotReady, CrdPhase::NotReady, &named),
        node
    ));
    let alone = format!("2/3 nodes ready, lost: x, IMEX failing on: {node}");
    assert!(names_imex_failing(
        &with(CrdPhase::NotReady, CrdPhase::NotReady, &alone),
        node
    ));
    for (phase, row, message) in [
        // Another node failing.
        (
            CrdPhase::NotReady,
            CrdPhase::NotReady,
            format!("2/3 nodes ready, IMEX failing on: {}", NAMES[0]),
        ),
        // Named in passing, not as failing.
        (
            CrdPhase::NotReady,
            CrdPhase::NotReady,
            format!("2/3 nodes ready, lost: {node}"),
        ),
        // Its row says Ready.
        (CrdPhase::NotReady, CrdPhase::Ready, alone.clone()),
        // The domain says Ready.
        (CrdPhase::Ready, CrdPhase::NotReady, alone.clone()),
    ] {
        assert!(
            !names_imex_failing(&with(phase, row, &message), node),
            "{phase:?} {row:?} {message}"
        );
    }
    assert!(!names_imex_failing(&FileRead::Missing, node));
}

/// `--domains`: node-03 holds only a claim of another sharing domain. It must be in
/// every peer set (one shared IMEX domain) but is no member of the first domain, whose
/// status lists each member at its slot in the domain, not in the shared peer set.
#[test]
fn with_sharing_domains_the_peer_set_is_every_holder_and_the_members_the_first_domains() {
    let now = Instant::now();
    let long_ago = now - Duration::from_secs(60);
    let mut world = formed(now);
    world.sharing = true;
    world
        .claim_domains
        .insert("claim-d2-node-03".into(), "cd-2".into());
    world.set_claim(2, "claim-d2-node-03", ClaimPhase::Prepared, long_ago);
    world.set_claim(2, "claim-node-03", ClaimPhase::Released, long_ago);
    assert_eq!(world.members(), vec![0, 1]);
    assert_eq!(world.imex_members(), vec![0, 1, 2]);

    let mut obs = healthy(now, &[0, 1, 2]);
    obs.nodes[2].view.as_mut().unwrap().domains.clear();
    for i in 0..2 {
        let domain = &mut obs.nodes[i].view.as_mut().unwrap().domains[0];
        domain.members = vec![NAMES[0].into(), NAMES[1].into()];
        (domain.ready, domain.total) = (2, 2);
        // Slots in the domain itself: swapped against the shared peer set's.
        domain.slot = Some(1 - i as u16);
    }
    let mut listed = status(&[0, 1]);
    listed.nodes[0].index = Some(1);
    listed.nodes[1].index = Some(0);
    obs.status = FileRead::Read(listed.clone());
    assert_eq!(unsettled(&world, &obs), Vec::new());

    // The status giving node-01 its shared IMEX slot is wrong for the domain.
    listed.nodes[0].index = Some(0);
    obs.status = FileRead::Read(listed);
    let reasons = unsettled(&world, &obs);
    assert!(
        reasons
            .iter()
            .any(|r| r.invariant == Invariant::Status && r.detail.contains("node-01 has index")),
        "{reasons:#?}"
    );

    // node-03 left out of a peer set: it holds a claim of a sharing domain.
    obs.nodes[0].hosts = FileRead::Read(block(&[0, 1]));
    let reasons = unsettled(&world, &obs);
    assert!(
        reasons.iter().any(|r| r.invariant == Invariant::Agreement
            && r.node.as_deref() == Some("node-01")
            && r.detail.contains("node-03")),
        "{reasons:#?}"
    );
}

/// Issue 28: the faults that must never break a job's imports, and the only ones that
/// may: those that take a node's IMEX away (a new instance, or the node dropped).
#[test]
fn only_a_node_whose_imex_goes_away_may_break_imports() {
    for never in [
        FaultKind::DaemonKill,
        FaultKind::Restart,
        FaultKind::Upgrade,
        FaultKind::CertRotate,
        FaultKind::DiskFull,
        FaultKind::DomainChurn,
        FaultKind::Pause,
        FaultKind::Loss,
        FaultKind::Churn,
    ] {
        assert!(!may_break_imports(never), "{never} may not break imports");
    }
    let may: Vec<FaultKind> = FaultKind::ALL
        .iter()
        .chain(&FaultKind::SHARING)
        .copied()
        .filter(|k| may_break_imports(*k))
        .collect();
    assert_eq!(
        may,
        vec![
            FaultKind::NodeKill,
            FaultKind::ImexCrash,
            FaultKind::Partition,
            FaultKind::ImexPort
        ]
    );
}

fn hit(kind: FaultKind, step: usize, targets: &[usize]) -> Hit {
    Hit {
        kind,
        step,
        targets: targets.to_vec(),
    }
}

#[test]
fn a_break_is_allowed_only_by_such_a_fault_on_the_importer_or_the_peer_blamed() {
    // node 0 imports from 1 and 2; imex-sim blames node 2.
    let (importer, blamed) = (0, Some(2));
    // A node-kill elsewhere, and faults on node 2 that leave IMEX alone, excuse nothing.
    let harmless = [
        hit(FaultKind::NodeKill, 0, &[3]),
        hit(FaultKind::DaemonKill, 1, &[2]),
        hit(FaultKind::Upgrade, 2, &[0, 1, 2, 3]),
        hit(FaultKind::Loss, 3, &[]),
    ];
    assert_eq!(import_break(importer, blamed, &harmless), None);
    // A node-kill of the peer blamed does, and is the one named.
    let mut faults = harmless.to_vec();
    faults.push(hit(FaultKind::NodeKill, 4, &[2]));
    faults.push(hit(FaultKind::ImexCrash, 5, &[2]));
    assert_eq!(import_break(importer, blamed, &faults), Some(&faults[4]));
    // Its own IMEX going away excuses whatever peer it then blames (a partitioned
    // importer drops every peer from its config).
    let cut_off = [hit(FaultKind::Partition, 6, &[0])];
    assert_eq!(import_break(importer, Some(1), &cut_off), Some(&cut_off[0]));
    // Both hit: the fault on the peer blamed is the one named.
    let both = [
        hit(FaultKind::Partition, 8, &[0]),
        hit(FaultKind::ImexCrash, 9, &[2]),
    ];
    assert_eq!(import_break(importer, blamed, &both), Some(&both[1]));
    // A reason that names no node: only a fault on the importer.
    assert_eq!(import_break(importer, None, &faults), None);
    let crashed = [hit(FaultKind::ImexPort, 7, &[0])];
    assert_eq!(import_break(importer, None, &crashed), Some(&crashed[0]));
    // Nothing since it was taken: a violation.
    assert_eq!(import_break(importer, blamed, &[]), None);
}

#[test]
fn a_silent_daemon_is_held_only_once_every_survivor_says_so() {
    let now = Instant::now();
    let mut world = formed(now);
    world.set_life(2, Life::Down, now);
    let mut obs = healthy(now, &[0, 1, 2]);
    obs.nodes[2].view = None;
    assert!(!held_by_all(&world, &obs, 2), "nobody holds it yet");
    obs.nodes[0].view.as_mut().unwrap().domains[0].held = vec![NAMES[2].into()];
    assert!(!held_by_all(&world, &obs, 2), "node-02 does not hold it");
    obs.nodes[1].view.as_mut().unwrap().domains[0].held = vec![NAMES[2].into()];
    assert!(held_by_all(&world, &obs, 2));
    // Held is not dropped: it is still in their peer sets.
    assert!(!dropped_by_all(&world, &obs, 2));
    // With no survivor answering, nobody vouches for it.
    obs.nodes[0].view = None;
    obs.nodes[1].view = None;
    assert!(!held_by_all(&world, &obs, 2));
}
