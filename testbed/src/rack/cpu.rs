//! The CPU a rack's daemons use, read from `/proc`: what an idle daemon costs.
//!
//! A daemon's cost is three parts: its own time; the status tools it spawned and
//! reaped, which the kernel adds to its children's time (`cutime`, `cstime`) once
//! reaped; and its IMEX daemon, a child that lives as long as the domain and is never
//! reaped while it runs, so it is read on its own.

use std::collections::BTreeMap;

use serde::Serialize;

use domaind_imex::procfs::fields_after_command;

/// Clock ticks, as `/proc/<pid>/stat` counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ticks {
    /// utime + stime: the process itself.
    pub own: u64,
    /// cutime + cstime: its children that it waited for.
    pub reaped: u64,
}

/// The parent pid and ticks from a `/proc/<pid>/stat` line.
pub fn parse_stat(stat: &str) -> Option<(u32, Ticks)> {
    let fields: Vec<&str> = fields_after_command(stat)?.collect();
    // After the command: state, ppid (fields 3, 4), ... utime, stime, cutime, cstime
    // (fields 14 to 17).
    let number = |i: usize| fields.get(i)?.parse::<u64>().ok();
    let ppid = u32::try_from(number(1)?).ok()?;
    Some((
        ppid,
        Ticks {
            own: number(11)? + number(12)?,
            reaped: number(13)? + number(14)?,
        },
    ))
}

/// One reading of a daemon and of its children that run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sample {
    pub daemon: Ticks,
    /// Own ticks of each running child, by pid.
    pub children: BTreeMap<u32, u64>,
}

/// Every process's parent and ticks, by pid, read once; those that end while it reads
/// are left out.
pub fn every_process() -> BTreeMap<u32, (u32, Ticks)> {
    let mut stats = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            if let Some(stat) = std::fs::read_to_string(entry.path().join("stat"))
                .ok()
                .and_then(|s| parse_stat(&s))
            {
                stats.insert(pid, stat);
            }
        }
    }
    stats
}

/// Reads every process once, for each of `daemons`; `None` for one that is gone. A
/// daemon's long-lived children are its own children and `imex[i]`, the IMEX daemons
/// that run under its IMEX runner instead.
pub fn sample(daemons: &[u32], imex: &[Vec<u32>]) -> Vec<Option<Sample>> {
    let stats = every_process();
    daemons
        .iter()
        .enumerate()
        .map(|(i, pid)| {
            let (_, daemon) = stats.get(pid)?;
            let kept = imex.get(i).map(Vec::as_slice).unwrap_or_default();
            let children = stats
                .iter()
                .filter(|(child, (ppid, _))| ppid == pid || kept.contains(child))
                .map(|(child, (_, ticks))| (*child, ticks.own))
                .collect();
            Some(Sample {
                daemon: *daemon,
                children,
            })
        })
        .collect()
}

/// A daemon's CPU over a window, each part in percent of one core.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CpuUse {
    /// The daemon itself.
    pub daemon: f64,
    /// The short-lived processes it ran and reaped (IMEX status tools).
    pub spawned: f64,
    /// Its long-lived children: the IMEX daemon.
    pub imex: f64,
}

impl CpuUse {
    pub fn total(&self) -> f64 {
        self.daemon + self.spawned + self.imex
    }
}

/// The use between two samples `seconds` apart. Only children running at both count as
/// long-lived; one that ended in between was reaped into `reaped` (or, if the daemon
/// did not wait for it, is lost to both: a leak the figures would show as missing).
pub fn usage(before: &Sample, after: &Sample, seconds: f64, ticks_per_second: f64) -> CpuUse {
    let percent = |ticks: u64| ticks as f64 / ticks_per_second / seconds * 100.0;
    let imex: u64 = after
        .children
        .iter()
        .filter_map(|(pid, ticks)| Some(ticks.saturating_sub(*before.children.get(pid)?)))
        .sum();
    CpuUse {
        daemon: percent(after.daemon.own.saturating_sub(before.daemon.own)),
        spawned: percent(after.daemon.reaped.saturating_sub(before.daemon.reaped)),
        imex: percent(imex),
    }
}

/// The kernel's clock ticks per second (`USER_HZ`).
pub fn ticks_per_second() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |hz| hz as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    // A real line's shape: the command holds a space and a parenthesis.
    const STAT: &str = "4242 (domaind (x) run) S 17 4242 17 0 -1 4194560 3120 0 0 0 \
                        250 75 40 12 20 0 9 0 1234 123456789 2345 18446744073709551615";

    #[test]
    fn a_stat_line_gives_the_parent_and_the_four_times() {
        let (ppid, ticks) = parse_stat(STAT).unwrap();
        assert_eq!(ppid, 17);
        assert_eq!(
            ticks,
            Ticks {
                own: 325,
                reaped: 52
            }
        );
        assert_eq!(parse_stat("4242 (domaind) S 17 1 2"), None, "too short");
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn use_is_split_between_the_daemon_what_it_reaped_and_its_imex() {
        let before = Sample {
            daemon: Ticks {
                own: 1000,
                reaped: 200,
            },
            children: [(10, 500), (11, 3)].into(),
        };
        let after = Sample {
            daemon: Ticks {
                own: 1060,
                reaped: 230,
            },
            // 11 was a status tool, now reaped; 12 started since and is not counted.
            children: [(10, 512), (12, 1)].into(),
        };
        let cpu = usage(&before, &after, 60.0, 100.0);
        let near = |got: f64, want: f64| (got - want).abs() < 1e-9;
        assert!(near(cpu.daemon, 1.0), "{cpu:?}");
        assert!(near(cpu.spawned, 0.5), "{cpu:?}");
        assert!(near(cpu.imex, 0.2), "{cpu:?}");
        assert!(near(cpu.total(), 1.7), "{cpu:?}");
    }

    #[test]
    fn this_process_can_be_read() {
        let me = std::process::id();
        // Its parent stands in for an IMEX daemon under a runner: not its child, read
        // as one because it is named.
        let parent = std::os::unix::process::parent_id();
        let samples = sample(&[me, u32::MAX], &[vec![parent]]);
        let mine = samples[0].as_ref().unwrap();
        assert!(mine.children.contains_key(&parent), "{mine:?}");
        assert_eq!(samples[1], None);
        assert!(ticks_per_second() > 0.0);
    }
}
