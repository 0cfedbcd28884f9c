//! How busy the whole machine was during a step: the share of every core's time spent
//! on anything but idling, from /proc/stat. A step that took long on a machine busy
//! near 100% waited for CPU, shared by every node of the rack; on a real rack each
//! node has its own.

use std::time::Instant;

/// The machine's CPU counters at one moment.
#[derive(Debug, Clone, Copy)]
pub struct CpuMark {
    busy_ticks: u64,
    total_ticks: u64,
    at: Instant,
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
        })
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
}
