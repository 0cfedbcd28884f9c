//! `domaind demo --idle WINDOW`: what each daemon of a formed, quiet rack costs.
//!
//! CPU comes from `/proc` (the daemon, the status tools it reaped, its IMEX daemon:
//! `domaind_testbed::rack::cpu`), status questions from each daemon's
//! `domaind_imex_status_queries_total` on `/metrics`, both read at the start and the
//! end of the window.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use domaind_testbed::rack::cpu::{self, CpuUse};
use domaind_testbed::rack::{LocalRack, http_get};
use serde::Serialize;

const STATUS_QUERIES: &str = "domaind_imex_status_queries_total";

/// How long the rack is left alone before the window opens: the rejoined node's
/// status polls back off to their steady interval in about 13 s, and the last
/// status writes are done by then.
pub const SETTLE: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Serialize)]
pub struct IdleNode {
    pub name: String,
    /// Percent of one core.
    pub cpu: CpuUse,
    pub total: f64,
    /// IMEX status questions per second.
    pub status_queries_per_s: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct IdleCost {
    pub seconds: f64,
    pub nodes: Vec<IdleNode>,
    /// Means over the nodes, percent of one core.
    pub mean: CpuUse,
    pub mean_total: f64,
    pub max_total: f64,
    /// The machine's 1-minute load average when the window closed: others' work
    /// slows the daemons and shows in their figures.
    pub load_average: Option<f64>,
}

fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The sum of `name`'s samples in a Prometheus text exposition, if it has any.
fn counter(exposition: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = exposition
        .lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

async fn status_queries(rack: &LocalRack) -> Vec<Option<f64>> {
    let mut counts = Vec::new();
    for node in rack.nodes() {
        let count = match node.info() {
            Some(info) => http_get(info.http_addr, "/metrics")
                .await
                .ok()
                .and_then(|(_, body)| counter(&body, STATUS_QUERIES)),
            None => None,
        };
        counts.push(count);
    }
    counts
}

/// Measures the rack over `window`; it should be formed and left alone.
pub async fn measure(rack: &mut LocalRack, window: Duration) -> anyhow::Result<IdleCost> {
    let pids = rack
        .nodes()
        .iter()
        .map(|n| {
            n.pid()
                .with_context(|| format!("{} does not run", n.name()))
        })
        .collect::<anyhow::Result<Vec<u32>>>()?;
    // Under an IMEX runner the IMEX daemon is the runner's child, not the daemon's.
    let imex = tokio::task::block_in_place(|| rack.imex_daemons())?;
    let queries_before = status_queries(rack).await;
    let opened = Instant::now();
    let before = cpu::sample(&pids, &imex);
    tokio::time::sleep(window).await;
    let after = cpu::sample(&pids, &imex);
    let seconds = opened.elapsed().as_secs_f64();
    let queries_after = status_queries(rack).await;
    let hz = cpu::ticks_per_second();

    let mut nodes = Vec::new();
    for (i, node) in rack.nodes().iter().enumerate() {
        let (Some(before), Some(after)) = (&before[i], &after[i]) else {
            anyhow::bail!("{} exited while the rack idled", node.name());
        };
        let cpu = cpu::usage(before, after, seconds, hz);
        let status_queries_per_s = match (queries_before[i], queries_after[i]) {
            (Some(b), Some(a)) => Some((a - b) / seconds),
            _ => None,
        };
        nodes.push(IdleNode {
            name: node.name().to_owned(),
            total: cpu.total(),
            cpu,
            status_queries_per_s,
        });
    }
    let n = nodes.len().max(1) as f64;
    let mean = CpuUse {
        daemon: nodes.iter().map(|x| x.cpu.daemon).sum::<f64>() / n,
        spawned: nodes.iter().map(|x| x.cpu.spawned).sum::<f64>() / n,
        imex: nodes.iter().map(|x| x.cpu.imex).sum::<f64>() / n,
    };
    Ok(IdleCost {
        seconds,
        mean_total: mean.total(),
        max_total: nodes.iter().map(|x| x.total).fold(0.0, f64::max),
        load_average: load_average(),
        mean,
        nodes,
    })
}

/// The table `--idle` prints.
pub fn render(cost: &IdleCost) -> String {
    let mut out = format!(
        "Idle cost over {:.0} s, percent of one core (domaind | status tools it ran | its \
         IMEX daemon | total), and IMEX status questions per second:\n",
        cost.seconds
    );
    let row = |name: &str, cpu: &CpuUse, total: f64, queries: Option<f64>| {
        format!(
            "  {name:<10} {:>7.3} {:>7.3} {:>7.3} {:>7.3}   {}\n",
            cpu.daemon,
            cpu.spawned,
            cpu.imex,
            total,
            queries.map_or("-".into(), |q| format!("{q:.2}/s")),
        )
    };
    for node in &cost.nodes {
        out += &row(&node.name, &node.cpu, node.total, node.status_queries_per_s);
    }
    let queries: Vec<f64> = cost
        .nodes
        .iter()
        .filter_map(|n| n.status_queries_per_s)
        .collect();
    let mean_queries =
        (!queries.is_empty()).then(|| queries.iter().sum::<f64>() / queries.len() as f64);
    out += &row("mean", &cost.mean, cost.mean_total, mean_queries);
    out += &format!("  max total {:.3}", cost.max_total);
    if let Some(load) = cost.load_average {
        out += &format!("; load average {load:.2}");
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_is_summed_over_its_labels_and_other_names_are_ignored() {
        let text = "# TYPE domaind_imex_status_queries_total counter\n\
                    domaind_imex_status_queries_total 12\n\
                    domaind_imex_status_queries_total_other 99\n\
                    domaind_imex_restarts_total{cause=\"exited\"} 3\n";
        assert_eq!(counter(text, STATUS_QUERIES), Some(12.0));
        let labelled = "x{a=\"1\"} 2\nx{a=\"2\"} 3.5\n";
        assert_eq!(counter(labelled, "x"), Some(5.5));
        assert_eq!(counter("y 1\n", "x"), None);
    }

    #[test]
    fn the_table_has_a_row_per_node_and_the_means() {
        let cpu = CpuUse {
            daemon: 0.1,
            spawned: 0.02,
            imex: 0.01,
        };
        let cost = IdleCost {
            seconds: 60.0,
            nodes: vec![IdleNode {
                name: "node-01".into(),
                cpu,
                total: cpu.total(),
                status_queries_per_s: Some(0.2),
            }],
            mean: cpu,
            mean_total: cpu.total(),
            max_total: cpu.total(),
            load_average: Some(1.5),
        };
        let table = render(&cost);
        assert!(table.contains("node-01"), "{table}");
        assert!(
            table.contains("0.130") && table.contains("0.20/s"),
            "{table}"
        );
        assert!(table.contains("mean"), "{table}");
        assert!(table.contains("load average 1.50"), "{table}");
    }
}
