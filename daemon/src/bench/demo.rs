//! `domaind bench demo`: the demo's scenario run again and again, its figures as
//! distributions. One run proves nothing: a figure is its p50, p90, p99 and max over
//! many runs, beside the machine's load.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use serde::{Deserialize, Serialize};

use super::latency::{Latency, table};
use crate::demo::busy::Work;

#[derive(Debug, Clone, Args)]
pub struct DemoBenchArgs {
    /// Demo runs, one after the other.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub runs: u32,

    /// Nodes in the rack, 2 to 18.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(2..=18))]
    pub nodes: u16,

    /// The rack's loopback subnet (127.0.<subnet>.x).
    #[arg(long, default_value_t = domaind_loopback::BENCH_DEMO)]
    pub subnet: u8,

    /// Keep each run's JSON summary and log here (run-N.json, run-N.log), with the
    /// load before it (load.txt); and the nodes' logs of a run that failed or whose
    /// daemon kill was not Ready throughout (run-N-logs/).
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Print the distributions as JSON rather than a table.
    #[arg(long)]
    pub json: bool,
}

/// The part of the demo's `--json` summary measured here.
#[derive(Debug, Clone, Deserialize)]
struct Run {
    formed_ms: u64,
    heal_ms: u64,
    status_ms: u64,
    rejoin_ms: u64,
    imports_broken_ms: u64,
    daemon_kill: DaemonKillRun,
    #[serde(default)]
    busy_percent: Option<Busy>,
    #[serde(default)]
    work_ms: Option<StepWork>,
    ok: bool,
}

/// The CPU each part of the rack used in a step, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
struct StepWork {
    formed: Work,
    heal: Work,
    rejoin: Work,
}

/// How busy the machine's cores were during a step, in percent.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
struct Busy {
    formed: u32,
    heal: u32,
    rejoin: u32,
}

#[derive(Debug, Clone, Deserialize)]
struct DaemonKillRun {
    ready_throughout: bool,
    imports_broken: usize,
    back_ms: u64,
}

#[derive(Debug, Clone, Serialize)]
struct Report {
    runs: usize,
    nodes: u16,
    /// The 1-minute load average before each run: the least and the most.
    load_min: f64,
    load_max: f64,
    /// Runs whose daemon kill left the domain Ready in every look, and imports it broke.
    daemon_kill_ready_throughout: usize,
    daemon_kill_imports_broken: usize,
    figures: Vec<Latency>,
    /// The median over the runs of how busy the machine was during each step.
    busy_percent_p50: Option<Busy>,
    /// The median over the runs of each part's CPU in each step.
    work_ms_p50: Option<StepWork>,
}

pub fn run(args: DemoBenchArgs) -> anyhow::Result<()> {
    let domaind = std::env::current_exe().context("cannot find the domaind binary")?;
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).with_context(|| format!("cannot make {}", out.display()))?;
    }
    let mut runs = Vec::new();
    let mut loads = Vec::new();
    for index in 1..=args.runs {
        let load = load_average()?;
        loads.push(load);
        let logs = args
            .out
            .as_ref()
            .map(|out| out.join(format!("run-{index}-logs")));
        let mut demo = Command::new(&domaind);
        demo.args(["--log", "warn", "demo", "--json"])
            .args(["--nodes", &args.nodes.to_string()])
            .args(["--subnet", &args.subnet.to_string()]);
        if let Some(logs) = &logs {
            demo.arg("--logs").arg(logs);
        }
        let output = demo
            .stdin(Stdio::null())
            .output()
            .context("cannot run the demo")?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let summary = stdout.lines().last().unwrap_or_default();
        if let Some(out) = &args.out {
            std::fs::write(out.join(format!("run-{index}.json")), summary)?;
            std::fs::write(out.join(format!("run-{index}.log")), &output.stderr)?;
            let line = format!("run-{index} load {load:.2} exit {}\n", output.status);
            append(&out.join("load.txt"), &line)?;
        }
        let run: Run = serde_json::from_str(summary).with_context(|| {
            format!(
                "run {index} ({}) printed no summary; its log:\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            )
        })?;
        if !output.status.success() || !run.ok {
            bail!(
                "run {index} failed ({}): {summary}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let clean = run.daemon_kill.ready_throughout && run.daemon_kill.imports_broken == 0;
        if let Some(logs) = logs.filter(|_| clean) {
            std::fs::remove_dir_all(&logs)
                .with_context(|| format!("cannot remove {}", logs.display()))?;
        }
        eprintln!(
            "run {index}/{}: formed {} ms, heal {} ms, status {} ms, rejoin {} ms (load {load:.2})",
            args.runs, run.formed_ms, run.heal_ms, run.status_ms, run.rejoin_ms
        );
        runs.push(run);
    }
    let report = report(&runs, &loads, args.nodes);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} runs of {} nodes, load {:.2}-{:.2}; daemon kill Ready throughout in {}, imports broken by it {}",
            report.runs,
            report.nodes,
            report.load_min,
            report.load_max,
            report.daemon_kill_ready_throughout,
            report.daemon_kill_imports_broken
        );
        print!("{}", table(&report.figures));
        if let Some(busy) = report.busy_percent_p50 {
            println!(
                "machine busy (p50 of the runs): formation {}%, heal {}%, rejoin {}%",
                busy.formed, busy.heal, busy.rejoin
            );
        }
        if let Some(work) = &report.work_ms_p50 {
            print!("{}", work_table(work));
        }
    }
    Ok(())
}

fn report(runs: &[Run], loads: &[f64], nodes: u16) -> Report {
    let figure = |case: &'static str, ms: fn(&Run) -> u64| {
        let samples: Vec<Duration> = runs
            .iter()
            .map(|run| Duration::from_millis(ms(run)))
            .collect();
        Latency::of(case, &samples)
    };
    let figures = [
        figure("formed_ms", |r| r.formed_ms),
        figure("daemon_kill.back_ms", |r| r.daemon_kill.back_ms),
        figure("heal_ms", |r| r.heal_ms),
        figure("status_ms", |r| r.status_ms),
        figure("imports_broken_ms", |r| r.imports_broken_ms),
        figure("rejoin_ms", |r| r.rejoin_ms),
    ]
    .into_iter()
    .flatten()
    .collect();
    Report {
        runs: runs.len(),
        nodes,
        load_min: loads.iter().copied().fold(f64::INFINITY, f64::min),
        load_max: loads.iter().copied().fold(0.0, f64::max),
        daemon_kill_ready_throughout: runs
            .iter()
            .filter(|r| r.daemon_kill.ready_throughout)
            .count(),
        daemon_kill_imports_broken: runs.iter().map(|r| r.daemon_kill.imports_broken).sum(),
        figures,
        busy_percent_p50: busy_median(runs),
        work_ms_p50: work_median(runs),
    }
}

fn work_median(runs: &[Run]) -> Option<StepWork> {
    let works: Vec<StepWork> = runs.iter().filter_map(|r| r.work_ms).collect();
    if works.is_empty() {
        return None;
    }
    let step = |of: fn(&StepWork) -> Work| {
        let median = |part: fn(&Work) -> u64| {
            let mut values: Vec<u64> = works.iter().map(|w| part(&of(w))).collect();
            values.sort_unstable();
            values[(values.len() - 1) / 2]
        };
        Work {
            daemons: median(|w| w.daemons),
            status_tools: median(|w| w.status_tools),
            imex: median(|w| w.imex),
            runners: median(|w| w.runners),
            demo: median(|w| w.demo),
            rest: median(|w| w.rest),
        }
    };
    Some(StepWork {
        formed: step(|w| w.formed),
        heal: step(|w| w.heal),
        rejoin: step(|w| w.rejoin),
    })
}

/// Where each step's CPU went, p50 of the runs.
fn work_table(work: &StepWork) -> String {
    let mut out = format!(
        "{:<10}{:>9}{:>13}{:>7}{:>9}{:>7}{:>7}   CPU ms, p50 of the runs\n",
        "STEP", "DAEMONS", "STATUS TOOLS", "IMEX", "RUNNERS", "DEMO", "REST"
    );
    for (step, w) in [
        ("formation", work.formed),
        ("heal", work.heal),
        ("rejoin", work.rejoin),
    ] {
        out += &format!(
            "{step:<10}{:>9}{:>13}{:>7}{:>9}{:>7}{:>7}\n",
            w.daemons, w.status_tools, w.imex, w.runners, w.demo, w.rest
        );
    }
    out
}

fn busy_median(runs: &[Run]) -> Option<Busy> {
    let busy: Vec<Busy> = runs.iter().filter_map(|r| r.busy_percent).collect();
    if busy.is_empty() {
        return None;
    }
    let median = |field: fn(&Busy) -> u32| {
        let mut values: Vec<u32> = busy.iter().map(field).collect();
        values.sort_unstable();
        values[(values.len() - 1) / 2]
    };
    Some(Busy {
        formed: median(|b| b.formed),
        heal: median(|b| b.heal),
        rejoin: median(|b| b.rejoin),
    })
}

fn load_average() -> anyhow::Result<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").context("cannot read /proc/loadavg")?;
    text.split_whitespace()
        .next()
        .and_then(|first| first.parse().ok())
        .context("/proc/loadavg has no load average")
}

fn append(path: &std::path::Path, line: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    file.write_all(line.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(formed_ms: u64, ready: bool) -> Run {
        Run {
            formed_ms,
            heal_ms: 200,
            status_ms: 1400,
            rejoin_ms: 260,
            imports_broken_ms: 1400,
            daemon_kill: DaemonKillRun {
                ready_throughout: ready,
                imports_broken: usize::from(!ready),
                back_ms: 240,
            },
            busy_percent: Some(Busy {
                formed: formed_ms as u32,
                heal: 90,
                rejoin: 80,
            }),
            work_ms: Some(StepWork {
                heal: Work {
                    daemons: formed_ms,
                    ..Work::default()
                },
                ..StepWork::default()
            }),
            ok: true,
        }
    }

    #[test]
    fn the_report_is_each_figures_distribution_over_the_runs() {
        let runs: Vec<Run> = (1..=20).map(|i| run(i * 10, i != 7)).collect();
        let report = report(&runs, &[0.5, 1.5, 0.9], 4);
        assert_eq!((report.load_min, report.load_max), (0.5, 1.5));
        assert_eq!(report.daemon_kill_ready_throughout, 19);
        assert_eq!(report.daemon_kill_imports_broken, 1);
        let formed = &report.figures[0];
        assert_eq!(formed.case, "formed_ms");
        assert_eq!(formed.calls, 20);
        assert_eq!(
            (formed.p50_ms, formed.p90_ms, formed.p99_ms, formed.max_ms),
            (100.0, 180.0, 200.0, 200.0)
        );
        // The demo's summary parses as printed.
        let line = r#"{"nodes":4,"formed_ms":247,"killed":"node-04","daemon_kill":{"ready_throughout":true,"imports":4,"imports_broken":0,"same_imex":true,"back_ms":428},"imports_broken_by_node_kill":4,"imports_broken_ms":1458,"heal_ms":228,"status_ms":1457,"rejoin_ms":268,"events":5,"ok":true}"#;
        assert_eq!(
            report.busy_percent_p50,
            Some(Busy {
                formed: 100,
                heal: 90,
                rejoin: 80
            })
        );
        let work = report.work_ms_p50.unwrap();
        assert_eq!((work.heal.daemons, work.formed.daemons), (100, 0));
        assert!(work_table(&work).contains("heal"), "{}", work_table(&work));
        let parsed: Run = serde_json::from_str(line).unwrap();
        assert_eq!((parsed.heal_ms, parsed.daemon_kill.back_ms), (228, 428));
        assert_eq!(parsed.busy_percent, None);
    }
}
