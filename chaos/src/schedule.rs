//! The fault schedule of `domaind-chaos run`: which faults, on which nodes, when and
//! for how long, drawn from a seed before the run starts. The same seed, node count,
//! scenario and duration always give the same schedule, on any machine: the generator
//! is our own (SplitMix64), not a library RNG whose stream may change between
//! versions or platforms.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

/// A kind of fault the harness injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL a daemon's process group, then restart it. Its IMEX lives on under the
    /// node's IMEX runner: the restarted daemon adopts it, and no import may break.
    DaemonKill,
    /// SIGKILL the whole node (the daemon, its IMEX runner and IMEX), then restart it:
    /// the one fault that may break the imports held on it and from it.
    NodeKill,
    /// SIGSTOP a daemon's process group, then SIGCONT. Its IMEX, the runner's child,
    /// runs on, as it would beside a paused container.
    Pause,
    /// SIGKILL only the node's IMEX daemon; `domaind` must start it again.
    ImexCrash,
    /// Graceful restarts (SIGTERM) of one to three daemons, as a liveness probe or a
    /// deleted pod restarts one: each must be held by every survivor, start again and
    /// the domain heal before the next.
    ///
    /// Kept beside [`FaultKind::Upgrade`], which restarts the same way: a restart is a
    /// lone event, each one detected and healed on its own, while an upgrade is paced
    /// by readiness alone, so one daemon stops while the previous one may still be
    /// catching up, which no restart makes.
    Restart,
    /// A rolling upgrade, as a DaemonSet's rolling update with `maxUnavailable: 1`
    /// makes it: every daemon in turn stopped (SIGTERM), waited for, started and
    /// waited for until ready, while the domains are live. IMEX (the same pid) and the
    /// imports must come through untouched.
    Upgrade,
    /// Cut one node off from the others (iptables), then heal.
    Partition,
    /// Drop a share of the packets between the rack's addresses (iptables), then stop.
    Loss,
    /// Claims prepared and unprepared: a node leaves and rejoins, or gets an extra
    /// claim while its own claim is unprepared and prepared again.
    Churn,
    /// Reissue a node's certificate into its TLS directory; it reloads without a restart.
    CertRotate,
    /// Take a node's IMEX server port (kill its IMEX daemon, listen on the port) for a
    /// while, then free it: the node backs off, the status names it, then it forms.
    ImexPort,
    /// Fill a node's state directory (a tmpfs, as root) for a while, then free it.
    DiskFull,
    /// With `--domains` (several domains with `isolation: Channel` on the same nodes): a
    /// sharing domain created on a few nodes, or one deleted from every node.
    DomainChurn,
    /// A cluster run (`--cluster`): delete a node daemon's pod; the DaemonSet makes a
    /// new one, which must take the node's claims back from its checkpoint.
    DaemonDelete,
    /// A cluster run: cordon a node and evict the run's pods from it, then uncordon.
    Drain,
    /// A cluster run: delete one of the workload's pods; its controller makes another.
    PodDelete,
    /// A cluster run: delete the controller's pods; new ones must take the lease.
    ControllerRestart,
}

impl FaultKind {
    pub const ALL: [FaultKind; 12] = [
        FaultKind::DaemonKill,
        FaultKind::NodeKill,
        FaultKind::Pause,
        FaultKind::ImexCrash,
        FaultKind::Restart,
        FaultKind::Upgrade,
        FaultKind::Partition,
        FaultKind::Loss,
        FaultKind::Churn,
        FaultKind::CertRotate,
        FaultKind::ImexPort,
        FaultKind::DiskFull,
    ];

    /// The kinds only a run of several sharing domains has (`--domains`): not in `all`
    /// for a run of one domain, whose schedules stay what they were.
    pub const SHARING: [FaultKind; 1] = [FaultKind::DomainChurn];

    /// The kinds of a cluster run (`--cluster`), its `all`: faults that exist on a
    /// real cluster, made through the API server (and the IMEX runner's or the
    /// daemon's pod for IMEX). `upgrade` is the node DaemonSet's rolling update there.
    pub const CLUSTER: [FaultKind; 6] = [
        FaultKind::DaemonDelete,
        FaultKind::ImexCrash,
        FaultKind::Drain,
        FaultKind::PodDelete,
        FaultKind::ControllerRestart,
        FaultKind::Upgrade,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::DaemonKill => "daemon-kill",
            FaultKind::NodeKill => "node-kill",
            FaultKind::Pause => "pause",
            FaultKind::ImexCrash => "imex-crash",
            FaultKind::Restart => "restart",
            FaultKind::Upgrade => "upgrade",
            FaultKind::Partition => "partition",
            FaultKind::Loss => "loss",
            FaultKind::Churn => "churn",
            FaultKind::CertRotate => "cert-rotate",
            FaultKind::ImexPort => "imex-port",
            FaultKind::DiskFull => "disk-full",
            FaultKind::DomainChurn => "domain-churn",
            FaultKind::DaemonDelete => "daemon-delete",
            FaultKind::Drain => "drain",
            FaultKind::PodDelete => "pod-delete",
            FaultKind::ControllerRestart => "controller-restart",
        }
    }

    /// Whether the fault needs root and iptables.
    pub fn needs_network_control(self) -> bool {
        matches!(self, FaultKind::Partition | FaultKind::Loss)
    }

    /// Whether the fault needs root to mount a tmpfs over the state directories.
    pub fn needs_state_dir_mounts(self) -> bool {
        self == FaultKind::DiskFull
    }

    /// Whether the fault needs a run of several sharing domains (`--domains`).
    pub fn needs_sharing(self) -> bool {
        FaultKind::SHARING.contains(&self)
    }

    /// Whether the fault exists in a cluster run.
    pub fn in_cluster(self) -> bool {
        FaultKind::CLUSTER.contains(&self)
    }

    /// Whether the fault exists on a loopback rack (`domaind-chaos run` without
    /// `--cluster`).
    pub fn on_loopback(self) -> bool {
        FaultKind::ALL.contains(&self) || FaultKind::SHARING.contains(&self)
    }

    /// How long, beyond its hold, a fault of this kind usually takes to be noticed and
    /// healed on a small loopback rack: the room the schedule leaves before the next
    /// fault. A fault that takes longer delays the ones after it (the harness never
    /// injects a fault before the previous one healed).
    fn allowance(self, targets: usize) -> Duration {
        let secs = match self {
            FaultKind::DaemonKill => 6,
            FaultKind::NodeKill => 8,
            FaultKind::Pause => 4,
            FaultKind::ImexCrash => 3,
            FaultKind::Restart => 6 * targets as u64,
            // Each daemon stopped, started and ready in turn, then one heal.
            FaultKind::Upgrade => 2 * targets as u64 + 4,
            FaultKind::Partition => 8,
            FaultKind::Loss => 2,
            FaultKind::Churn => 5,
            // The daemon looks at its TLS files every 10 s.
            FaultKind::CertRotate => 11,
            // Freed during a wait of the backoff (a hold of up to 15 s ends in the
            // 12.8 s one), then formation.
            FaultKind::ImexPort => 15,
            FaultKind::DiskFull => 3,
            // A new domain's channel is confirmed once every node advertises it.
            FaultKind::DomainChurn => 4,
            // A real cluster: a pod deleted, made again, its image started (the next
            // fault waits for the heal anyway: this is only room).
            FaultKind::DaemonDelete => 10,
            FaultKind::Drain => 8,
            FaultKind::PodDelete => 8,
            FaultKind::ControllerRestart => 10,
        };
        Duration::from_secs(secs)
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `--scenario`: one kind, `all`, or a comma-separated list (duplicates ignored).
pub fn parse_scenario(text: &str) -> Result<Vec<FaultKind>, String> {
    let mut kinds = Vec::new();
    for word in text.split(',').map(str::trim) {
        let found: Vec<FaultKind> = if word == "all" {
            FaultKind::ALL.to_vec()
        } else {
            let every = FaultKind::ALL
                .iter()
                .chain(&FaultKind::SHARING)
                .chain(FaultKind::CLUSTER.iter().filter(|k| !k.on_loopback()));
            match every.clone().find(|k| k.name() == word) {
                Some(kind) => vec![*kind],
                // Not an alias: which of the two a schedule meant is the question.
                None if word == "kill" => {
                    return Err(
                        "kill is two faults now: daemon-kill (domaind alone; IMEX lives on) \
                         and node-kill (domaind and IMEX together)"
                            .into(),
                    );
                }
                None => {
                    return Err(format!(
                        "unknown scenario {word:?}: expected all or a comma-separated list of {}",
                        every.map(|k| k.name()).collect::<Vec<_>>().join(", ")
                    ));
                }
            }
        };
        for kind in found {
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
    }
    Ok(kinds)
}

/// What a churn step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Churn {
    /// Unprepare every claim of the target (it leaves the domain), wait `hold`, prepare
    /// its claim again (it rejoins).
    LeaveAndRejoin,
    /// Prepare an extra claim of the same domain on the target, unprepare the target's
    /// own claim (the extra keeps it a member), wait `hold`, prepare it again, then
    /// unprepare the extra.
    ExtraClaim,
}

/// What a domain-churn step does. The harness turns one into the other when it must:
/// it creates when no domain but the run's first is left, and deletes when the run
/// holds one more domain than `--domains` asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DomainChurn {
    /// A new sharing domain, one claim on each target, prepared at once.
    Create,
    /// Every claim of a sharing domain other than the run's first unprepared, its
    /// claim files removed; which domain, by the step's `pick`.
    Delete,
}

/// One fault of the schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    pub index: usize,
    /// When to inject it, from the start of the fault phase (later if the previous
    /// fault has not healed by then).
    #[serde(rename = "at_ms", serialize_with = "millis")]
    pub at: Duration,
    pub kind: FaultKind,
    /// Node indexes: one, or the nodes of a rolling restart or upgrade in order.
    pub targets: Vec<usize>,
    /// How long the fault lasts (paused, cut off, lossy, out of the domain, its state
    /// directory full); for the kills and partition, at least this long after the
    /// survivors noticed.
    #[serde(rename = "hold_ms", serialize_with = "millis")]
    pub hold: Duration,
    /// `loss`: the share of packets dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_percent: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub churn: Option<Churn>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain_churn: Option<DomainChurn>,
    /// `domain-churn`: a draw that picks the domain a delete takes, among those there
    /// are then (`pick % count`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pick: Option<u64>,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

/// A run's faults, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Schedule {
    pub seed: u64,
    pub nodes: usize,
    pub kinds: Vec<FaultKind>,
    #[serde(rename = "duration_ms", serialize_with = "millis")]
    pub duration: Duration,
    pub steps: Vec<Step>,
}

impl Schedule {
    /// Faults for `nodes` nodes (at least 2) until `duration` has passed. Kinds are
    /// drawn from shuffled rounds of `kinds`, so that every kind comes up as often as
    /// the duration allows.
    pub fn generate(seed: u64, nodes: usize, kinds: &[FaultKind], duration: Duration) -> Self {
        Self::generate_spaced(seed, nodes, kinds, duration, DEFAULT_GAP)
    }

    /// As [`Schedule::generate`], with at least `gap` (and up to 2 s more) of quiet
    /// between one fault's heal allowance and the next fault: a soak's low rate.
    pub fn generate_spaced(
        seed: u64,
        nodes: usize,
        kinds: &[FaultKind],
        duration: Duration,
        gap: Duration,
    ) -> Self {
        assert!(nodes >= 2, "a chaos run needs at least 2 nodes");
        assert!(
            !kinds.is_empty(),
            "a chaos run needs at least one kind of fault"
        );
        let mut rng = SplitMix64::new(seed);
        let mut steps = Vec::new();
        let mut bag: Vec<FaultKind> = Vec::new();
        let mut at = rng.between_ms(1_000, 3_000);
        while at < duration {
            if bag.is_empty() {
                bag = kinds.to_vec();
                rng.shuffle(&mut bag);
            }
            let kind = bag.pop().expect("refilled above");
            let mut domain_churn = None;
            let mut pick = None;
            let (targets, hold, loss_percent, churn) = match kind {
                FaultKind::Restart => {
                    let count = 1 + rng.below(nodes.min(3) as u64) as usize;
                    let mut order: Vec<usize> = (0..nodes).collect();
                    rng.shuffle(&mut order);
                    order.truncate(count);
                    (order, Duration::ZERO, None, None)
                }
                FaultKind::Upgrade => {
                    let mut order: Vec<usize> = (0..nodes).collect();
                    rng.shuffle(&mut order);
                    (order, Duration::ZERO, None, None)
                }
                FaultKind::DaemonKill | FaultKind::NodeKill => (
                    vec![rng.node(nodes)],
                    rng.between_ms(1_000, 4_000),
                    None,
                    None,
                ),
                FaultKind::Pause => (
                    vec![rng.node(nodes)],
                    rng.between_ms(2_000, 10_000),
                    None,
                    None,
                ),
                FaultKind::Partition => (
                    vec![rng.node(nodes)],
                    rng.between_ms(1_000, 4_000),
                    None,
                    None,
                ),
                FaultKind::Loss => {
                    let percent = 5 + rng.below(6) as u32;
                    (
                        Vec::new(),
                        rng.between_ms(8_000, 15_000),
                        Some(percent),
                        None,
                    )
                }
                FaultKind::Churn => {
                    let variant = if rng.below(2) == 0 {
                        Churn::LeaveAndRejoin
                    } else {
                        Churn::ExtraClaim
                    };
                    (
                        vec![rng.node(nodes)],
                        rng.between_ms(1_000, 4_000),
                        None,
                        Some(variant),
                    )
                }
                // Past 15 s the restart waits reach 12.8 s, and the daemon would be
                // down near its peers' 30 s link grace.
                FaultKind::ImexPort => (
                    vec![rng.node(nodes)],
                    rng.between_ms(5_000, 15_000),
                    None,
                    None,
                ),
                FaultKind::DiskFull => (
                    vec![rng.node(nodes)],
                    rng.between_ms(4_000, 10_000),
                    None,
                    None,
                ),
                FaultKind::ImexCrash
                | FaultKind::CertRotate
                | FaultKind::DaemonDelete
                | FaultKind::PodDelete => (vec![rng.node(nodes)], Duration::ZERO, None, None),
                // How long the node stays cordoned with the run's pods evicted.
                FaultKind::Drain => (
                    vec![rng.node(nodes)],
                    rng.between_ms(3_000, 10_000),
                    None,
                    None,
                ),
                FaultKind::ControllerRestart => (Vec::new(), Duration::ZERO, None, None),
                // A new domain on 1..=nodes of the nodes, or a domain deleted from all
                // of them; the hold is how long the rack lives with it before the heal.
                FaultKind::DomainChurn => {
                    domain_churn = Some(if rng.below(2) == 0 {
                        DomainChurn::Create
                    } else {
                        DomainChurn::Delete
                    });
                    pick = Some(rng.next_u64());
                    let count = 1 + rng.below(nodes as u64) as usize;
                    let mut order: Vec<usize> = (0..nodes).collect();
                    rng.shuffle(&mut order);
                    order.truncate(count);
                    order.sort_unstable();
                    (order, rng.between_ms(500, 2_000), None, None)
                }
            };
            let gap_ms = gap.as_millis() as u64;
            let next =
                at + hold + kind.allowance(targets.len()) + rng.between_ms(gap_ms, gap_ms + 2_000);
            steps.push(Step {
                index: steps.len(),
                at,
                kind,
                targets,
                hold,
                loss_percent,
                churn,
                domain_churn,
                pick,
            });
            at = next;
        }
        Self {
            seed,
            nodes,
            kinds: kinds.to_vec(),
            duration,
            steps,
        }
    }
}

/// The least quiet between faults of a chaos run (up to 2 s more are drawn).
pub const DEFAULT_GAP: Duration = Duration::from_secs(1);

/// SplitMix64 (Steele, Lea and Flood): tiny, fast, and fixed forever, which is what
/// a reproducible schedule needs; its quality is ample for picking faults.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (n > 0), by multiplying into the range: the bias is below
    /// n / 2^64, nothing for our n.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    fn node(&mut self, nodes: usize) -> usize {
        self.below(nodes as u64) as usize
    }

    /// A whole number of milliseconds in `low..=high`.
    fn between_ms(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high - low + 1))
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenarios_parse_lists_and_all() {
        assert_eq!(
            parse_scenario("node-kill,pause, imex-crash,churn,node-kill,daemon-kill").unwrap(),
            vec![
                FaultKind::NodeKill,
                FaultKind::Pause,
                FaultKind::ImexCrash,
                FaultKind::Churn,
                FaultKind::DaemonKill
            ]
        );
        assert_eq!(parse_scenario("all").unwrap(), FaultKind::ALL.to_vec());
        for kind in [
            FaultKind::DaemonKill,
            FaultKind::NodeKill,
            FaultKind::Upgrade,
        ] {
            assert!(FaultKind::ALL.contains(&kind), "{kind}");
        }
        let error = parse_scenario("node-kill,reboot").unwrap_err();
        assert!(
            error.contains("\"reboot\"") && error.contains("cert-rotate"),
            "{error}"
        );
        // The old name says what it became.
        let error = parse_scenario("kill,pause").unwrap_err();
        assert!(
            error.contains("daemon-kill") && error.contains("node-kill"),
            "{error}"
        );
    }

    #[test]
    fn domain_churn_is_named_but_not_in_all() {
        assert_eq!(
            parse_scenario("node-kill,domain-churn").unwrap(),
            vec![FaultKind::NodeKill, FaultKind::DomainChurn]
        );
        assert!(
            !parse_scenario("all")
                .unwrap()
                .contains(&FaultKind::DomainChurn)
        );
        assert!(parse_scenario("nope").unwrap_err().contains("domain-churn"));
    }

    #[test]
    fn domain_churn_steps_create_or_delete_on_distinct_nodes() {
        let kinds = [FaultKind::NodeKill, FaultKind::DomainChurn];
        let schedule = Schedule::generate(5, 4, &kinds, Duration::from_secs(600));
        let churns: Vec<&Step> = schedule
            .steps
            .iter()
            .filter(|s| s.kind == FaultKind::DomainChurn)
            .collect();
        assert!(churns.len() > 10);
        for step in &churns {
            assert!(step.pick.is_some(), "{step:?}");
            assert!(
                !step.targets.is_empty() && step.targets.len() <= 4,
                "{step:?}"
            );
            assert!(step.targets.windows(2).all(|w| w[0] < w[1]), "{step:?}");
        }
        for variant in [DomainChurn::Create, DomainChurn::Delete] {
            assert!(churns.iter().any(|s| s.domain_churn == Some(variant)));
        }
        // Not every create takes every node: the domains overlap, not coincide.
        assert!(churns.iter().any(|s| s.targets.len() < 4));
    }

    #[test]
    fn cluster_kinds_are_named_and_scheduled() {
        assert_eq!(
            parse_scenario("daemon-delete,drain,pod-delete,controller-restart,imex-crash").unwrap(),
            vec![
                FaultKind::DaemonDelete,
                FaultKind::Drain,
                FaultKind::PodDelete,
                FaultKind::ControllerRestart,
                FaultKind::ImexCrash
            ]
        );
        assert!(!parse_scenario("all").unwrap().contains(&FaultKind::Drain));
        let schedule = Schedule::generate(2, 3, &FaultKind::CLUSTER, Duration::from_secs(600));
        for kind in FaultKind::CLUSTER {
            assert!(schedule.steps.iter().any(|s| s.kind == kind), "{kind}");
        }
        for step in &schedule.steps {
            match step.kind {
                FaultKind::ControllerRestart => assert!(step.targets.is_empty()),
                FaultKind::Upgrade => assert_eq!(step.targets.len(), 3),
                FaultKind::Drain => {
                    assert_eq!(step.targets.len(), 1);
                    assert!(step.hold >= Duration::from_secs(3));
                }
                _ => assert_eq!(step.targets.len(), 1),
            }
            assert!(step.targets.iter().all(|t| *t < 3));
        }
        // imex-crash and upgrade are both loopback and cluster faults; the rest are one
        // or the other.
        for kind in [FaultKind::ImexCrash, FaultKind::Upgrade] {
            assert!(kind.in_cluster() && kind.on_loopback(), "{kind}");
        }
        assert!(FaultKind::Drain.in_cluster() && !FaultKind::Drain.on_loopback());
        for kind in [FaultKind::DaemonKill, FaultKind::NodeKill] {
            assert!(!kind.in_cluster() && kind.on_loopback(), "{kind}");
        }
    }

    #[test]
    fn the_generator_is_splitmix64() {
        // The first outputs for seed 0, as published with the algorithm.
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(rng.next_u64(), 0x6e78_9e6a_a1b9_65f4);
    }

    #[test]
    fn below_stays_in_range_and_reaches_both_ends() {
        let mut rng = SplitMix64::new(9);
        let draws: Vec<u64> = (0..1_000).map(|_| rng.below(5)).collect();
        assert!(draws.iter().all(|d| *d < 5));
        assert!(draws.contains(&0) && draws.contains(&4));
    }

    #[test]
    fn every_kind_comes_up_and_targets_are_valid() {
        let schedule = Schedule::generate(3, 5, &FaultKind::ALL, Duration::from_secs(600));
        for kind in FaultKind::ALL {
            assert!(
                schedule.steps.iter().any(|s| s.kind == kind),
                "{kind} never comes up"
            );
        }
        for (i, step) in schedule.steps.iter().enumerate() {
            assert_eq!(step.index, i);
            assert!(step.at < schedule.duration);
            assert!(step.targets.iter().all(|t| *t < 5), "{step:?}");
            if i > 0 {
                assert!(step.at > schedule.steps[i - 1].at);
            }
            match step.kind {
                FaultKind::Loss => assert!(step.targets.is_empty() && step.loss_percent.is_some()),
                FaultKind::Restart => {
                    let mut distinct = step.targets.clone();
                    distinct.sort();
                    distinct.dedup();
                    assert_eq!(distinct.len(), step.targets.len(), "{step:?}");
                    assert!((1..=3).contains(&step.targets.len()));
                }
                // Every daemon, each once.
                FaultKind::Upgrade => {
                    let mut every = step.targets.clone();
                    every.sort();
                    assert_eq!(every, (0..5).collect::<Vec<_>>(), "{step:?}");
                    assert_eq!(step.hold, Duration::ZERO);
                }
                FaultKind::Churn => assert!(step.churn.is_some() && step.targets.len() == 1),
                FaultKind::DomainChurn => unreachable!("not in ALL"),
                _ => assert_eq!(step.targets.len(), 1),
            }
        }
    }
}
