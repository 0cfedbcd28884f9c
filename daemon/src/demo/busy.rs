//! How busy the whole machine was during a step, and with whom: the share of every
//! core's time spent on anything but idling, from /proc/stat, and the CPU each part of
//! the rack used, from /proc/<pid>/stat. A step that took long on a machine busy near
//! 100% waited for CPU, shared by every node of the rack; on a real rack each node has
//! its own, and the parts say how much each node's share would be.

use std::collections::BTreeMap;
use std::time::Instant;

use domaind_testbed::rack::cpu::{self, Ticks};
use serde::{Deserialize, Serialize};

/// The machine's CPU counters, and every process's, at one moment.
#[derive(Debug, Clone)]
pub struct CpuMark {
    busy_ticks: u64,
    total_ticks: u64,
    at: Instant,
    processes: BTreeMap<u32, (u32, Ticks)>,
}

/// CPU time used during a step, in milliseconds of one core, by whom.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Work {
    /// The rack's `domaind run` processes.
    pub daemons: u64,
    /// The IMEX status tools they ran and reaped.
    pub status_tools: u64,
    /// The IMEX daemons (children of a daemon or of an IMEX runner).
    pub imex: u64,
    /// The IMEX runners.
    pub runners: u64,
    /// The demo itself: starting processes and watching the rack.
    pub demo: u64,
    /// Everything else on the machine (and processes that ended unreaped by the rack).
    pub rest: u64,
}

impl CpuMark {
    /// Now; `None` where /proc/stat cannot be read (not Linux).
    pub fn now() -> Option<Self> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        let (busy_ticks, total_ticks) = parse(&text)?;
        Some(Self {
            busy_ticks,
            total_ticks,
            at: Instant::now(),
            processes: cpu::every_process(),
        })
    }

    /// The CPU used since this mark, by whom; `daemons` are the rack's daemon pids
    /// now. The demo's other children are its IMEX runners.
    pub fn work_since(&self, daemons: &[u32]) -> Option<Work> {
        let now = Self::now()?;
        let busy = now.busy_ticks.checked_sub(self.busy_ticks)?;
        Some(account(
            &self.processes,
            &now.processes,
            busy,
            daemons,
            std::process::id(),
            cpu::ticks_per_second(),
        ))
    }

    /// Percent of all cores' time busy since this mark.
    pub fn busy_percent_since(&self) -> Option<u32> {
        let now = Self::now()?;
        let total = now.total_ticks.checked_sub(self.total_ticks)?;
        let busy = now.busy_ticks.checked_sub(self.busy_ticks)?;
        if total == 0 || now.at <= self.at {
            return None;
        }
        Some(((busy * 100 + total / 2) / total) as u32)
    }
}

/// Splits `busy` machine ticks between `before` and `after` by role. A process that
/// started in between counts from zero; one that ended in between is lost to its role
/// (in `rest`) unless its parent reaped it.
fn account(
    before: &BTreeMap<u32, (u32, Ticks)>,
    after: &BTreeMap<u32, (u32, Ticks)>,
    busy: u64,
    daemons: &[u32],
    demo: u32,
    ticks_per_second: f64,
) -> Work {
    let spent = |pid: u32, part: fn(&Ticks) -> u64| -> u64 {
        let Some((_, now)) = after.get(&pid) else {
            return 0;
        };
        let then = before.get(&pid).map_or(0, |(_, t)| part(t));
        part(now).saturating_sub(then)
    };
    let own = |t: &Ticks| t.own;
    let reaped = |t: &Ticks| t.reaped;
    let runners: Vec<u32> = after
        .iter()
        .filter(|(pid, (parent, _))| *parent == demo && !daemons.contains(pid))
        .map(|(pid, _)| *pid)
        .collect();
    let imex: u64 = after
        .iter()
        .filter(|(_, (parent, _))| daemons.contains(parent) || runners.contains(parent))
        .map(|(pid, _)| spent(*pid, own))
        .sum();
    let mut ticks = Work {
        daemons: daemons.iter().map(|pid| spent(*pid, own)).sum(),
        status_tools: daemons.iter().map(|pid| spent(*pid, reaped)).sum(),
        imex,
        runners: runners.iter().map(|pid| spent(*pid, own)).sum(),
        demo: spent(demo, own),
        rest: 0,
    };
    let counted = ticks.daemons + ticks.status_tools + ticks.imex + ticks.runners + ticks.demo;
    ticks.rest = busy.saturating_sub(counted);
    let ms = |t: u64| (t as f64 * 1000.0 / ticks_per_second).round() as u64;
    Work {
        daemons: ms(ticks.daemons),
        status_tools: ms(ticks.status_tools),
        imex: ms(ticks.imex),
        runners: ms(ticks.runners),
        demo: ms(ticks.demo),
        rest: ms(ticks.rest),
    }
}

/// (busy, total) ticks of the `cpu` line: idle and iowait are not busy.
fn parse(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|line| line.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // user nice system idle iowait irq softirq steal (guest time is within user).
    let total: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3)? + ticks.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_and_iowait_are_not_busy() {
        let stat = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\n";
        assert_eq!(parse(stat), Some((150, 1000)));
        assert_eq!(parse("intr 1 2 3\n"), None);
    }

    #[test]
    fn work_is_split_by_role_and_the_rest_is_what_the_machine_did_besides() {
        let t = |own, reaped| Ticks { own, reaped };
        let demo = 1;
        // 10 and 11 daemons (11 restarted in between: new), 20 a runner, 30 its IMEX,
        // 31 a daemon's IMEX, 40 someone else's.
        let before = BTreeMap::from([
            (demo, (0, t(100, 5000))),
            (10, (demo, t(50, 7))),
            (20, (demo, t(1, 0))),
            (30, (20, t(9, 0))),
            (40, (0, t(1000, 0))),
        ]);
        let after = BTreeMap::from([
            (demo, (0, t(103, 9000))),
            (10, (demo, t(60, 9))),
            (11, (demo, t(4, 1))),
            (20, (demo, t(2, 0))),
            (30, (20, t(12, 0))),
            (31, (11, t(1, 0))),
            (40, (0, t(1500, 0))),
        ]);
        let work = account(&before, &after, 40, &[10, 11], demo, 100.0);
        assert_eq!(
            work,
            Work {
                daemons: 140,
                status_tools: 30,
                imex: 40,
                runners: 10,
                demo: 30,
                rest: 150,
            },
            "the demo's reaped children (killed daemons) are not its own work"
        );
    }
}
