//! The harness's eyes: one tick (reap crashed daemons, advance lives, collect prepare
//! answers, observe the rack, check every invariant) and the waits made of ticks. The
//! world is cloned before any file is read, so what it says the harness did happened
//! before what the observation shows.

use std::path::Path;
use std::time::{Duration, Instant};

use domaind_node::run::RunInfo;
use domaind_testkit::poll_every;

use super::{Harness, LOG_TAIL, TICK};
use crate::channels;
use crate::invariants::{Invariant, Life, Violation, World, check};
use crate::observe::{self, FileRead, HostsBlock, NodeObservation, Observation};
use crate::report::CrashRecord;

impl Harness {
    /// One observation of the rack, checked against every invariant.
    pub(super) async fn tick(&mut self) {
        self.reap_crashes();
        self.advance_lives();
        self.collect_prepares().await;
        let world = self.world.clone();
        let observation = self.observe(&world).await;
        let now = Instant::now();
        for violation in check(&world, &observation, now) {
            self.record(violation);
        }
        if world.sharing {
            for violation in channels::check(&world, &observation) {
                self.record(violation);
            }
        }
        self.observations += 1;
        self.last = Some((world, observation));
        self.check_cliques().await;
        self.sample_if_due().await;
    }

    /// Observes until `done` holds, at most `limit`; when it first held.
    pub(super) async fn wait_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&Self, &World, &Observation) -> bool,
    ) -> Option<Instant> {
        poll_every(TICK, limit, async || {
            self.tick().await;
            let (world, observation) = self.last.as_ref().expect("observed");
            done(self, world, observation)
                .then_some(observation.at)
                .ok_or(())
        })
        .await
        .ok()
    }

    /// Observes for `duration`, ending on time so that the fault lasts what the
    /// schedule says; when `seen` first held, if it did.
    pub(super) async fn hold(
        &mut self,
        duration: Duration,
        mut seen: impl FnMut(&Self, &World, &Observation) -> bool,
    ) -> Option<Instant> {
        let deadline = Instant::now() + duration;
        let mut first = None;
        loop {
            self.tick().await;
            let (world, observation) = self.last.as_ref().expect("observed");
            if first.is_none() && seen(self, world, observation) {
                first = Some(observation.at);
            }
            let now = Instant::now();
            if now >= deadline {
                return first;
            }
            tokio::time::sleep(TICK.min(deadline - now)).await;
        }
    }

    /// Daemons that exited without being told: each is a violation, and is started
    /// again so that the run goes on (its checkpoint brings its claims back).
    fn reap_crashes(&mut self) {
        for name in self.rack.unexpected_exits() {
            let Some(node) = self.world.nodes.iter().position(|n| n.name == name) else {
                if let Some(other) = self
                    .others
                    .nodes
                    .iter()
                    .copied()
                    .find(|i| self.rack.node(*i).name() == name)
                {
                    self.reap_other(other);
                }
                continue;
            };
            let code = self.reap_crashed(node, &name);
            self.record(Violation::new(
                Invariant::Crash,
                Some(&name),
                format!("domaind exited on its own ({code:?}); started again"),
            ));
            let now = Instant::now();
            match self.rack.start(node) {
                Ok(()) => self.world.set_life(node, Life::Starting, now),
                Err(error) => {
                    self.world.set_life(node, Life::Down, now);
                    self.liveness(Some(node), format!("cannot start it again: {error:#}"));
                }
            }
        }
    }

    /// Reaps a daemon that exited on its own and records the crash with its log's
    /// tail; returns its exit.
    pub(super) fn reap_crashed(&mut self, node: usize, name: &str) -> anyhow::Result<Option<i32>> {
        let code = tokio::task::block_in_place(|| self.rack.stop(node, Duration::ZERO));
        let log_tail = self.log_tail(node);
        self.findings.crash(CrashRecord {
            node: name.to_owned(),
            at_ms: self.ms_since_start(Instant::now()),
            during: self.current.map(|(kind, _)| kind),
            log_tail,
        });
        code
    }

    pub(super) fn log_tail(&self, node: usize) -> Vec<String> {
        let text = std::fs::read_to_string(self.rack.node(node).log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL)..]
            .iter()
            .map(|l| (*l).to_owned())
            .collect()
    }

    /// Starting daemons that wrote run.json are up; stopping daemons that exited are
    /// down (a graceful stop must exit 0).
    fn advance_lives(&mut self) {
        for node in 0..self.world.nodes.len() {
            match self.world.nodes[node].life {
                Life::Starting => {
                    let pid = self.rack.node(node).pid();
                    let written = RunInfo::read(&self.rack.node(node).state_dir())
                        .ok()
                        .flatten()
                        .is_some_and(|info| Some(info.pid) == pid);
                    if written
                        && tokio::task::block_in_place(|| self.rack.wait_ready(node, TICK)).is_ok()
                    {
                        self.world.set_life(node, Life::Up, Instant::now());
                    }
                }
                Life::Stopping if !self.rack.running(node) => {
                    let code = tokio::task::block_in_place(|| self.rack.stop(node, Duration::ZERO));
                    self.world.set_life(node, Life::Down, Instant::now());
                    if !matches!(code, Ok(Some(0))) {
                        let name = self.name(node);
                        self.record(Violation::new(
                            Invariant::Crash,
                            Some(&name),
                            format!(
                                "a graceful stop (SIGTERM) ended with {code:?}, not exit code 0"
                            ),
                        ));
                    }
                }
                _ => {}
            }
        }
    }

    async fn observe(&mut self, world: &World) -> Observation {
        let count = world.nodes.len();
        // Processes first: a running IMEX daemon means its hosts file was written
        // before it started, so the file read next is at least that new.
        let pids = self
            .rack
            .imex_daemons()
            .unwrap_or_else(|_| vec![Vec::new(); count]);
        let mut nodes: Vec<NodeObservation> = Vec::with_capacity(count);
        // The rack's first `count` nodes are the world's; other cliques are looked at
        // by the cliques invariant only.
        for (i, pids) in pids.into_iter().enumerate().take(count) {
            let node = self.rack.node(i);
            let mut seen = NodeObservation::empty();
            seen.imex_pids = pids;
            seen.hosts = read_hosts_settled(&node.imex_dir().join("hosts")).await;
            seen.nodes_config =
                observe::read_nodes_config(&node.imex_dir().join("nodes_config.cfg"));
            seen.checkpoint = observe::read_checkpoint(&node.state_dir());
            nodes.push(seen);
        }
        let asks: Vec<_> = (0..count)
            .map(|i| {
                let info = (world.nodes[i].life == Life::Up)
                    .then(|| self.rack.node(i).info().cloned())
                    .flatten();
                let metrics = self.metrics_for == Some(i);
                async move {
                    let Some(info) = info else {
                        return (None, None);
                    };
                    let view = observe::view(&info).await;
                    let reloads = if metrics {
                        observe::reloads(info.http_addr).await.ok()
                    } else {
                        None
                    };
                    (Some(view), reloads)
                }
            })
            .collect();
        for (seen, (view, reloads)) in nodes.iter_mut().zip(futures::future::join_all(asks).await) {
            match view {
                Some(Ok(view)) => seen.view = Some(view),
                Some(Err(error)) => seen.view_error = Some(error),
                None => {}
            }
            seen.tls_reloads = reloads;
        }
        let status = match self.rack.local().read_status(&self.domain.uid) {
            Ok(Some(status)) => FileRead::Read(status),
            Ok(None) => FileRead::Missing,
            Err(error) => FileRead::Bad(error.to_string()),
        };
        Observation {
            at: Instant::now(),
            nodes,
            status,
        }
    }
}

/// A hosts file is rewritten in place (it may be a bind mount), so a read can catch
/// it half-written; such a read is taken again, a few times, before it counts.
async fn read_hosts_settled(path: &Path) -> FileRead<HostsBlock> {
    let mut read = observe::read_hosts(path);
    for _ in 0..3 {
        if !matches!(read, FileRead::Bad(_)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        read = observe::read_hosts(path);
    }
    read
}
