//! What the demo shows while it runs: a table like `kubectl get computedomains -w`,
//! plus a row per node with what that node itself reports.

use std::fmt::Write as _;
use std::future::Future;
use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::bail;

use super::{DemoDomain, STEP_LIMIT, Summary};
use domaind_kube_api::crd::ComputeDomainStatus;
use domaind_node::rack::{LocalRack, node_view};
use domaind_node::run::NodeView;

/// How often the table is refreshed and conditions are checked.
const REFRESH: Duration = Duration::from_millis(200);

/// The rack, as seen from outside at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub status: Option<ComputeDomainStatus>,
    /// Each node's `/state`, or `None` when it does not answer.
    pub views: Vec<(String, Option<NodeView>)>,
}

impl Snapshot {
    async fn take(rack: &LocalRack, domain: &DemoDomain) -> Self {
        let status = rack.local().read_status(&domain.uid).ok().flatten();
        let mut views = Vec::new();
        for node in rack.nodes() {
            let view = match node.info() {
                Some(info) => node_view(info).await.ok(),
                None => None,
            };
            views.push((node.name().to_owned(), view));
        }
        Self { status, views }
    }
}

pub struct Observer {
    /// Redraw the table in place (a terminal).
    live: bool,
    /// Print nothing but JSON.
    quiet: bool,
    domain: DemoDomain,
    started: Instant,
    /// Lines of the table on screen, to erase before redrawing.
    drawn: usize,
}

impl Observer {
    pub fn new(live: bool, quiet: bool, domain: DemoDomain) -> Self {
        Self {
            live,
            quiet,
            domain,
            started: Instant::now(),
            drawn: 0,
        }
    }

    /// A line of narration, above the table.
    pub fn say(&mut self, message: &str) {
        if self.quiet {
            return;
        }
        self.erase();
        println!("==> {message}");
    }

    /// Runs `work` while refreshing the table, until `work` is done and `done` holds
    /// for a snapshot; fails after [`STEP_LIMIT`].
    pub async fn watch_while<F: Future>(
        &mut self,
        rack: &LocalRack,
        work: F,
        done: impl Fn(&Snapshot, &DemoDomain) -> bool,
    ) -> anyhow::Result<(F::Output, Snapshot)> {
        let deadline = Instant::now() + STEP_LIMIT;
        let mut work = std::pin::pin!(work);
        let mut output = None;
        loop {
            if output.is_none() {
                tokio::select! {
                    out = &mut work => output = Some(out),
                    _ = tokio::time::sleep(REFRESH) => {}
                }
            } else {
                tokio::time::sleep(REFRESH).await;
            }
            let snapshot = Snapshot::take(rack, &self.domain).await;
            if self.live {
                self.draw(&snapshot);
            }
            if done(&snapshot, &self.domain)
                && let Some(output) = output.take()
            {
                if !self.live && !self.quiet {
                    print!("{}", self.render(&snapshot));
                }
                return Ok((output, snapshot));
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
        println!(
            "\nSummary: {} nodes formed ComputeDomain {}/{} in {} ms; after a SIGKILL the \
             survivors dropped {} in {} ms and the status said so after {} ms; it rejoined \
             in {} ms. {} events recorded.",
            summary.nodes,
            summary.compute_domain.namespace,
            summary.compute_domain.name,
            summary.formed_ms,
            summary.killed,
            summary.heal_ms,
            summary.status_ms,
            summary.rejoin_ms,
            summary.events
        );
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
        let (phase, ready) = match &snapshot.status {
            Some(s) => (
                s.status.to_string(),
                format!("{}/{}", s.ready_nodes, s.total_nodes),
            ),
            None => ("-".into(), "-".into()),
        };
        let age = format!("{}s", self.started.elapsed().as_secs());
        let _ = writeln!(
            out,
            "\n{:<28} {:<9} {:<6} AGE",
            "COMPUTEDOMAIN", "STATUS", "NODES"
        );
        let _ = writeln!(
            out,
            "{:<28} {:<9} {:<6} {}",
            format!("{}/{}", self.domain.namespace, self.domain.name),
            phase,
            ready,
            age
        );
        let _ = writeln!(
            out,
            "\n{:<9} {:<13} {:<5} {:<9} {:<8} STATUS",
            "NODE", "ADDRESS", "SLOT", "IMEX", "MEMBERS"
        );
        for (name, view) in &snapshot.views {
            let listed = snapshot
                .status
                .as_ref()
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

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("live", &self.live)
            .finish()
    }
}
