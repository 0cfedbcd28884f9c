//! What the demo shows while it runs: a table like `kubectl get computedomains -w`
//! (a row per clique's domain), plus a row per node with what that node itself
//! reports.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::future::Future;
use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::bail;

use super::{DemoDomain, STEP_LIMIT, Summary};
use domaind_kube_api::crd::ComputeDomainStatus;
use domaind_node::run::NodeView;
use domaind_testbed::rack::{LocalRack, node_view};

/// How often the table is refreshed and conditions are checked: a figure is late by up
/// to this and one look. A look at every node costs the rack CPU (the demo's share is
/// in its work figures), so not much more often.
const REFRESH: Duration = Duration::from_millis(100);

/// The rack, as seen from outside at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Each clique's domain status, in clique order.
    pub statuses: Vec<Option<ComputeDomainStatus>>,
    /// Each node's `/state`, or `None` when it does not answer.
    pub views: Vec<(String, Option<NodeView>)>,
}

impl Snapshot {
    async fn take(rack: &LocalRack, domains: &[DemoDomain]) -> Self {
        let statuses = domains
            .iter()
            .map(|domain| rack.local().read_status(&domain.uid).ok().flatten())
            .collect();
        // All at once: one after the other, a look at 18 loaded nodes took long enough
        // to add its length to every figure.
        let views = futures::future::join_all(rack.nodes().iter().map(|node| async move {
            let view = match node.info() {
                Some(info) => node_view(info).await.ok(),
                None => None,
            };
            (node.name().to_owned(), view)
        }))
        .await;
        Self { statuses, views }
    }
}

/// What [`Observer::watch_keeping`] saw.
#[derive(Debug)]
pub struct Watched<T> {
    pub output: T,
    /// When `done` first held, for each clique.
    pub done_at: Vec<Instant>,
    /// For each clique, the first look in which `keep` did not hold, as the table
    /// showed it; none if it held in every look.
    pub broken: Vec<Option<String>>,
    pub last: Snapshot,
}

pub struct Observer {
    /// Redraw the table in place (a terminal).
    live: bool,
    /// Print nothing but JSON.
    quiet: bool,
    /// One per clique, in clique order.
    domains: Vec<DemoDomain>,
    /// Each node's clique, in node order.
    clique_of: Vec<usize>,
    started: Instant,
    /// Lines of the table on screen, to erase before redrawing.
    drawn: usize,
    /// Every gossip member or IMEX peer of another clique seen so far, as
    /// "node: what", from every snapshot of the run.
    crossings: BTreeSet<String>,
}

impl Observer {
    pub fn new(live: bool, quiet: bool, domains: Vec<DemoDomain>, clique_of: Vec<usize>) -> Self {
        Self {
            live,
            quiet,
            domains,
            clique_of,
            started: Instant::now(),
            drawn: 0,
            crossings: BTreeSet::new(),
        }
    }

    /// What crossed cliques in any snapshot so far (nothing, with one clique).
    pub fn crossings(&self) -> &BTreeSet<String> {
        &self.crossings
    }

    /// A line of narration, above the table.
    pub fn say(&mut self, message: &str) {
        if self.quiet {
            return;
        }
        self.erase();
        println!("==> {message}");
    }

    /// Runs `work` while refreshing the table, until `work` is done and `done(_, i)`
    /// held for every `i` below `count`; fails after [`STEP_LIMIT`]. Says when each
    /// `i` first held once `work` was done: one time per clique.
    pub async fn watch_each<F: Future>(
        &mut self,
        rack: &LocalRack,
        work: F,
        count: usize,
        done: impl Fn(&Snapshot, usize) -> bool,
    ) -> anyhow::Result<(F::Output, Vec<Instant>, Snapshot)> {
        let watched = self
            .watch_keeping(rack, work, count, done, |_, _| Ok(()))
            .await?;
        Ok((watched.output, watched.done_at, watched.last))
    }

    /// [`Self::watch_each`], and whether `keep(_, i)` held in every look, from the
    /// first, for each `i`.
    pub async fn watch_keeping<F: Future>(
        &mut self,
        rack: &LocalRack,
        work: F,
        count: usize,
        done: impl Fn(&Snapshot, usize) -> bool,
        keep: impl Fn(&Snapshot, usize) -> Result<(), String>,
    ) -> anyhow::Result<Watched<F::Output>> {
        let mut broken: Vec<Option<String>> = vec![None; count];
        let deadline = Instant::now() + STEP_LIMIT;
        let mut work = std::pin::pin!(work);
        let mut output = None;
        let mut first: Vec<Option<Instant>> = vec![None; count];
        loop {
            if output.is_none() {
                tokio::select! {
                    out = &mut work => output = Some(out),
                    _ = tokio::time::sleep(REFRESH) => {}
                }
            } else {
                tokio::time::sleep(REFRESH).await;
            }
            let snapshot = Snapshot::take(rack, &self.domains).await;
            let seen_at = Instant::now();
            for (i, broken) in broken.iter_mut().enumerate() {
                if broken.is_none()
                    && let Err(why) = keep(&snapshot, i)
                {
                    *broken = Some(format!("{why}:\n{}", self.render(&snapshot)));
                }
            }
            self.note_crossings(&snapshot);
            if self.live {
                self.draw(&snapshot);
            }
            if output.is_some() {
                for (i, at) in first.iter_mut().enumerate() {
                    if at.is_none() && done(&snapshot, i) {
                        *at = Some(seen_at);
                    }
                }
            }
            if first.iter().all(Option::is_some)
                && let Some(output) = output.take()
            {
                if !self.live && !self.quiet {
                    print!("{}", self.render(&snapshot));
                }
                return Ok(Watched {
                    output,
                    done_at: first.into_iter().flatten().collect(),
                    broken,
                    last: snapshot,
                });
            }
            if Instant::now() > deadline {
                self.erase();
                bail!(
                    "the rack did not get there within {STEP_LIMIT:?}; last seen:\n{}",
                    self.render(&snapshot)
                );
            }
        }
    }

    pub fn summary(&mut self, summary: &Summary) {
        if self.quiet {
            return;
        }
        self.erase();
        println!("\nSummary: {}", summary_line(summary));
    }

    /// The summary of a rack of several cliques: a line per clique, then isolation.
    pub fn fleet_summary(&mut self, summaries: &[Summary]) {
        if self.quiet {
            return;
        }
        self.erase();
        println!("\nSummary of {} cliques:", summaries.len());
        for (clique, summary) in summaries.iter().enumerate() {
            println!("  clique {}: {}", clique + 1, summary_line(summary));
        }
        if self.crossings.is_empty() {
            println!(
                "No node ever had a gossip member or IMEX peer of another clique \
                 (every /state read of the run)."
            );
        }
    }

    /// Records what crosses cliques in `snapshot`.
    fn note_crossings(&mut self, snapshot: &Snapshot) {
        for (node, (name, view)) in snapshot.views.iter().enumerate() {
            let Some(view) = view else { continue };
            let own = self.clique_of[node];
            let foreign = |peer: &String| {
                snapshot
                    .views
                    .iter()
                    .position(|(n, _)| n == peer)
                    .is_some_and(|i| self.clique_of[i] != own)
            };
            let members = view.gossip.members.iter().filter(|m| foreign(m));
            let peers = view
                .domains
                .iter()
                .flat_map(|d| d.peers.values())
                .filter(|p| foreign(p));
            let found: Vec<String> = members
                .map(|m| format!("{name}: gossip member {m}"))
                .chain(peers.map(|p| format!("{name}: IMEX peer {p}")))
                .collect();
            self.crossings.extend(found);
        }
    }

    fn erase(&mut self) {
        if self.live && self.drawn > 0 {
            // Up to the table's first line, then clear to the end of the screen.
            print!("\x1b[{}A\x1b[J", self.drawn);
            self.drawn = 0;
        }
    }

    fn draw(&mut self, snapshot: &Snapshot) {
        self.erase();
        let table = self.render(snapshot);
        self.drawn = table.lines().count();
        print!("{table}");
        let _ = std::io::stdout().flush();
    }

    fn render(&self, snapshot: &Snapshot) -> String {
        let mut out = String::new();
        let age = format!("{}s", self.started.elapsed().as_secs());
        let _ = writeln!(
            out,
            "\n{:<28} {:<9} {:<6} AGE",
            "COMPUTEDOMAIN", "STATUS", "NODES"
        );
        for (domain, status) in self.domains.iter().zip(&snapshot.statuses) {
            let (phase, ready) = match status {
                Some(s) => (
                    s.status.to_string(),
                    format!("{}/{}", s.ready_nodes, s.total_nodes),
                ),
                None => ("-".into(), "-".into()),
            };
            let _ = writeln!(
                out,
                "{:<28} {:<9} {:<6} {}",
                format!("{}/{}", domain.namespace, domain.name),
                phase,
                ready,
                age
            );
        }
        let _ = writeln!(
            out,
            "\n{:<9} {:<13} {:<5} {:<9} {:<8} STATUS",
            "NODE", "ADDRESS", "SLOT", "IMEX", "MEMBERS"
        );
        for (node, (name, view)) in snapshot.views.iter().enumerate() {
            let listed = snapshot
                .statuses
                .get(self.clique_of[node])
                .and_then(Option::as_ref)
                .and_then(|s| s.nodes.iter().find(|n| &n.name == name));
            let address = listed.map(|n| n.ip_address.clone()).unwrap_or_default();
            let status = listed.map_or("-".to_string(), |n| n.status.to_string());
            let domain = view.as_ref().and_then(|v| v.domains.first());
            let slot = domain
                .and_then(|d| d.slot)
                .map_or("-".to_string(), |s| s.to_string());
            let imex = match (view, domain) {
                (None, _) => "down",
                (Some(_), Some(d)) if d.local_ready => "ready",
                (Some(v), _) if v.imex.running => "starting",
                (Some(_), _) => "stopped",
            };
            let members = domain.map_or("-".to_string(), |d| d.members.len().to_string());
            let _ = writeln!(
                out,
                "{name:<9} {address:<13} {slot:<5} {imex:<9} {members:<8} {status}"
            );
        }
        out
    }
}

/// One clique's run in a sentence.
fn summary_line(summary: &Summary) -> String {
    let restart = &summary.daemon_kill;
    format!(
        "{} nodes formed ComputeDomain {}/{} in {} ms; {}'s daemon was killed and back in \
         {} ms with the domain {} and {} of {} imports broken; after a SIGKILL of the whole \
         node the survivors dropped it in {} ms and the status said so after {} ms; it \
         rejoined in {} ms. {} events recorded.",
        summary.nodes,
        summary.compute_domain.namespace,
        summary.compute_domain.name,
        summary.formed_ms,
        summary.killed,
        restart.back_ms,
        if restart.ready_throughout {
            "Ready throughout"
        } else {
            "NOT Ready throughout"
        },
        restart.imports_broken,
        restart.imports,
        summary.heal_ms,
        summary.status_ms,
        summary.rejoin_ms,
        summary.events
    )
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("live", &self.live)
            .finish()
    }
}
