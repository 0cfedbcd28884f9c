//! What a soak (`domaind-chaos run --sample-every`) watches for growth: each daemon's
//! resident memory, file descriptors, threads, checkpoint journal, metric series and
//! gossip state, sampled through a long run, and the slope of each over every daemon's
//! life. A leak that a few minutes hide (a connection per restarted peer, a series per
//! claim, a dead member's state never forgotten) shows as a slope after hours.
//!
//! Pure: the harness reads `/proc`, the state directory and `/metrics` and hands the
//! numbers here; this module keeps them and judges them.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

/// How much of each daemon's life is not judged. A process fills its caches, opens its
/// connections and registers its series first; and gossip keeps what it must for an
/// hour by design (a dead incarnation's state, a deleted key's tombstone: the
/// `GossipTiming` grace periods), so its state reaches its level only after an hour of
/// the fault rate: growth before that is the retention filling, not a leak.
pub const WARMUP: Duration = Duration::from_secs(65 * 60);
/// A life shorter than this (after the warm-up) is too short for a slope to mean
/// anything against the noise of a live process.
pub const MIN_SPAN: Duration = Duration::from_secs(30 * 60);

/// One thing sampled of every daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Vital {
    /// VmRSS of `/proc/<pid>/status`, KiB: the binary's file pages in memory too.
    RssKib,
    /// RssAnon of `/proc/<pid>/status`, KiB: the process's own memory (heap, stacks),
    /// without the binary's pages, which come and go with the page cache.
    RssAnonKib,
    /// Entries of `/proc/<pid>/fd`.
    Fds,
    /// Threads of `/proc/<pid>/status`.
    Threads,
    /// The checkpoint journal's size, bytes.
    JournalBytes,
    /// Samples in the daemon's `/metrics` (lines that are not comments).
    MetricSeries,
    /// Node states the daemon's gossip keeps (`/state`).
    GossipNodes,
    /// Keys over them, deleted ones still kept included.
    GossipKeys,
    /// Bytes of those keys and values.
    GossipBytes,
    /// Bytes the daemon's live allocations hold (`domaind_heap_allocated_bytes` on its
    /// `/metrics`): what tells a leak from the allocator keeping pages.
    HeapAllocatedBytes,
    /// Bytes of the allocator's pages in memory (`domaind_heap_resident_bytes`): beside
    /// the allocated bytes, what tells fragmentation (pages kept for a few live
    /// allocations) from memory outside the allocator (stacks, the binary's data).
    HeapResidentBytes,
    /// Bytes of the pages holding live allocations (`domaind_heap_active_bytes`): above
    /// the allocated bytes, fragmentation.
    HeapActiveBytes,
    /// Bytes of the allocator's bookkeeping (`domaind_heap_metadata_bytes`).
    HeapMetadataBytes,
}

impl Vital {
    pub const ALL: [Vital; 13] = [
        Vital::RssKib,
        Vital::RssAnonKib,
        Vital::Fds,
        Vital::Threads,
        Vital::JournalBytes,
        Vital::MetricSeries,
        Vital::GossipNodes,
        Vital::GossipKeys,
        Vital::GossipBytes,
        Vital::HeapAllocatedBytes,
        Vital::HeapResidentBytes,
        Vital::HeapActiveBytes,
        Vital::HeapMetadataBytes,
    ];

    pub fn from_name(name: &str) -> Option<Vital> {
        Vital::ALL.into_iter().find(|v| v.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Vital::RssKib => "rss_kib",
            Vital::RssAnonKib => "rss_anon_kib",
            Vital::Fds => "fds",
            Vital::Threads => "threads",
            Vital::JournalBytes => "journal_bytes",
            Vital::MetricSeries => "metric_series",
            Vital::GossipNodes => "gossip_nodes",
            Vital::GossipKeys => "gossip_keys",
            Vital::GossipBytes => "gossip_bytes",
            Vital::HeapAllocatedBytes => "heap_allocated_bytes",
            Vital::HeapResidentBytes => "heap_resident_bytes",
            Vital::HeapActiveBytes => "heap_active_bytes",
            Vital::HeapMetadataBytes => "heap_metadata_bytes",
        }
    }

    /// The least rise, from the first quarter of a life to its last, that counts as
    /// growth: below it is noise of a live process (the allocator's arenas, a
    /// connection being replaced, a peer's key in flight), not a leak.
    fn tolerance(self, first: f64) -> f64 {
        match self {
            // Memory moves with the allocator and with what a fault made the daemon
            // hold for a while: a tenth.
            Vital::RssKib
            | Vital::RssAnonKib
            | Vital::HeapAllocatedBytes
            | Vital::HeapResidentBytes
            | Vital::HeapActiveBytes
            | Vital::HeapMetadataBytes => first * 0.10,
            // A peer's connection or a reload's file may be open at the moment of a
            // sample; a leak grows past a handful.
            Vital::Fds | Vital::Threads => 4.0_f64.max(first * 0.10),
            // The journal grows until its compaction; a tenth or a page.
            Vital::JournalBytes => 4096.0_f64.max(first * 0.10),
            // Each fault kind may add a labelled series once (its first sighting);
            // what may not happen is growth with every fault.
            Vital::MetricSeries => 16.0_f64.max(first * 0.05),
            // A restarted peer's previous life is kept until chitchat forgets it.
            Vital::GossipNodes | Vital::GossipKeys | Vital::GossipBytes => first * 0.25 + 1.0,
        }
    }
}

/// One daemon, at one moment: `None` where the number could not be read then (the
/// process just exited, `/state` did not answer).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds since the first sample.
    pub at_s: f64,
    pub node: String,
    pub pid: u32,
    pub values: Vec<(Vital, Option<f64>)>,
}

impl Sample {
    pub fn value(&self, vital: Vital) -> Option<f64> {
        self.values
            .iter()
            .find(|(v, _)| *v == vital)
            .and_then(|(_, value)| *value)
    }

    /// The CSV header of [`Sample::csv_line`].
    pub fn csv_header() -> String {
        let mut line = String::from("at_s,node,pid");
        for vital in Vital::ALL {
            let _ = write!(line, ",{}", vital.name());
        }
        line
    }

    pub fn csv_line(&self) -> String {
        let mut line = format!("{:.1},{},{}", self.at_s, self.node, self.pid);
        for vital in Vital::ALL {
            match self.value(vital) {
                Some(value) => {
                    let _ = write!(line, ",{value}");
                }
                None => line.push(','),
            }
        }
        line
    }
}

/// From `/proc/<pid>/status`: what the soak reads there.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ProcStatus {
    pub rss_kib: Option<f64>,
    pub rss_anon_kib: Option<f64>,
    pub threads: Option<f64>,
}

/// Resident memory (KiB, all and anonymous) and threads from `/proc/<pid>/status`.
pub fn parse_proc_status(text: &str) -> ProcStatus {
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|number| number.parse::<f64>().ok())
    };
    ProcStatus {
        rss_kib: field("VmRSS:"),
        rss_anon_kib: field("RssAnon:"),
        threads: field("Threads:"),
    }
}

/// Samples in a Prometheus text exposition.
pub fn metric_series(exposition: &str) -> usize {
    exposition
        .lines()
        .filter(|line| {
            let line = line.trim_start();
            !line.is_empty() && !line.starts_with('#')
        })
        .count()
}

/// The value of a sample without labels in a Prometheus text exposition.
pub fn metric_value(exposition: &str, name: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The Theil–Sen slope of `points` per hour: the median of the slopes between every two
/// samples. A few transient peaks (a burst of work held for one sample) tilt a
/// least-squares line; they barely move this one, which follows the baseline, where a
/// leak shows. `None` under two distinct times.
pub fn slope_per_hour(points: &[(f64, f64)]) -> Option<f64> {
    let mut slopes: Vec<f64> = points
        .iter()
        .enumerate()
        .flat_map(|(i, (ta, va))| {
            points[i + 1..]
                .iter()
                .filter(move |(tb, _)| tb != ta)
                .map(move |(tb, vb)| (vb - va) / (tb - ta))
        })
        .collect();
    if slopes.is_empty() {
        return None;
    }
    Some(median(&mut slopes) * 3600.0)
}

/// The median (the mean of the middle two of an even count); `values` not empty.
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[middle - 1] + values[middle]) / 2.0
    } else {
        values[middle]
    }
}

/// What one vital did over one daemon's life (one node, one pid).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LifeTrend {
    pub node: String,
    pub pid: u32,
    pub vital: Vital,
    /// Seconds of the life that were judged (after the warm-up).
    pub span_s: f64,
    pub samples: usize,
    /// Medians of the first and the last quarter of those samples: a peak held for a
    /// sample or two is not where the baseline is.
    pub first: f64,
    pub last: f64,
    pub max: f64,
    pub slope_per_hour: f64,
    /// The last quarter above the first by more than the vital's tolerance, and the
    /// slope rising: growth.
    pub grows: bool,
}

/// Every sample of a run, and the judgement.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    samples: Vec<Sample>,
}

impl Samples {
    pub fn push(&mut self, sample: Sample) {
        self.samples.push(sample);
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Samples back from the CSV a run wrote (`--samples`), to judge them again.
    pub fn from_csv(text: &str) -> Result<Samples, String> {
        let mut lines = text.lines().enumerate();
        let (_, header) = lines.next().ok_or("the file is empty")?;
        let columns: Vec<&str> = header.split(',').collect();
        if columns.len() < 3 || columns[..3] != ["at_s", "node", "pid"] {
            return Err(format!("not a soak's samples: the header is {header:?}"));
        }
        let vitals = columns[3..]
            .iter()
            .map(|name| Vital::from_name(name).ok_or_else(|| format!("unknown column {name:?}")))
            .collect::<Result<Vec<Vital>, String>>()?;
        let mut samples = Samples::default();
        for (index, line) in lines {
            let bad = |what: &str| format!("line {}: {what}: {line:?}", index + 1);
            let cells: Vec<&str> = line.split(',').collect();
            if cells.len() != columns.len() {
                return Err(bad(&format!(
                    "{} cells, not {}",
                    cells.len(),
                    columns.len()
                )));
            }
            let values = vitals
                .iter()
                .zip(&cells[3..])
                .map(|(vital, cell)| match *cell {
                    "" => Ok((*vital, None)),
                    number => number
                        .parse::<f64>()
                        .map(|n| (*vital, Some(n)))
                        .map_err(|_| bad(&format!("{} is not a number", vital.name()))),
                })
                .collect::<Result<Vec<_>, String>>()?;
            samples.push(Sample {
                at_s: cells[0]
                    .parse()
                    .map_err(|_| bad("the time is not a number"))?,
                node: cells[1].to_owned(),
                pid: cells[2]
                    .parse()
                    .map_err(|_| bad("the pid is not a number"))?,
                values,
            });
        }
        Ok(samples)
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The trend of every vital over every life that was sampled for at least
    /// `min_span` after its first `warmup` (a process fills its caches, opens its
    /// connections and registers its series first).
    pub fn trends(&self, warmup: Duration, min_span: Duration) -> Vec<LifeTrend> {
        let mut lives: Vec<(&str, u32)> = self
            .samples
            .iter()
            .map(|s| (s.node.as_str(), s.pid))
            .collect();
        lives.sort_unstable();
        lives.dedup();
        let mut trends = Vec::new();
        for (node, pid) in lives {
            let life: Vec<&Sample> = self
                .samples
                .iter()
                .filter(|s| s.node == node && s.pid == pid)
                .collect();
            let born = life.first().map_or(0.0, |s| s.at_s);
            let judged: Vec<&Sample> = life
                .into_iter()
                .filter(|s| s.at_s - born >= warmup.as_secs_f64())
                .collect();
            for vital in Vital::ALL {
                let points: Vec<(f64, f64)> = judged
                    .iter()
                    .filter_map(|s| Some((s.at_s, s.value(vital)?)))
                    .collect();
                if let Some(trend) = trend(node, pid, vital, &points, min_span) {
                    trends.push(trend);
                }
            }
        }
        trends
    }
}

fn trend(
    node: &str,
    pid: u32,
    vital: Vital,
    points: &[(f64, f64)],
    min_span: Duration,
) -> Option<LifeTrend> {
    let span = points.last()?.0 - points.first()?.0;
    if span < min_span.as_secs_f64() || points.len() < 8 {
        return None;
    }
    let slope = slope_per_hour(points)?;
    let quarter = points.len() / 4;
    let middle =
        |part: &[(f64, f64)]| median(&mut part.iter().map(|(_, v)| *v).collect::<Vec<_>>());
    let first = middle(&points[..quarter]);
    let last = middle(&points[points.len() - quarter..]);
    let max = points.iter().map(|(_, v)| *v).fold(f64::MIN, f64::max);
    Some(LifeTrend {
        node: node.to_owned(),
        pid,
        vital,
        span_s: span,
        samples: points.len(),
        first,
        last,
        max,
        slope_per_hour: slope,
        grows: slope > 0.0 && last - first > vital.tolerance(first),
    })
}

/// A vital over all the lives judged: the steepest one, and how many grew.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VitalSummary {
    pub vital: Vital,
    pub lives: usize,
    /// Means over the lives of their first- and last-quarter means.
    pub first: f64,
    pub last: f64,
    pub max: f64,
    /// The steepest slope of any life, per hour, and whose.
    pub steepest_per_hour: f64,
    pub steepest: String,
    pub growing: usize,
}

/// The soak part of a run's report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SoakReport {
    pub every_s: f64,
    pub warmup_s: u64,
    pub min_span_s: u64,
    pub samples: usize,
    pub vitals: Vec<VitalSummary>,
    /// Every life a vital grew over.
    pub growth: Vec<LifeTrend>,
}

impl SoakReport {
    pub fn new(samples: &Samples, every: Duration, warmup: Duration, min_span: Duration) -> Self {
        let trends = samples.trends(warmup, min_span);
        let vitals = Vital::ALL
            .iter()
            .filter_map(|&vital| {
                let of: Vec<&LifeTrend> = trends.iter().filter(|t| t.vital == vital).collect();
                let steepest = of
                    .iter()
                    .max_by(|a, b| a.slope_per_hour.total_cmp(&b.slope_per_hour))?;
                let n = of.len() as f64;
                Some(VitalSummary {
                    vital,
                    lives: of.len(),
                    first: of.iter().map(|t| t.first).sum::<f64>() / n,
                    last: of.iter().map(|t| t.last).sum::<f64>() / n,
                    max: of.iter().map(|t| t.max).fold(f64::MIN, f64::max),
                    steepest_per_hour: steepest.slope_per_hour,
                    steepest: format!("{} (pid {})", steepest.node, steepest.pid),
                    growing: of.iter().filter(|t| t.grows).count(),
                })
            })
            .collect();
        Self {
            every_s: every.as_secs_f64(),
            warmup_s: warmup.as_secs(),
            min_span_s: min_span.as_secs(),
            samples: samples.len(),
            vitals,
            growth: trends.into_iter().filter(|t| t.grows).collect(),
        }
    }

    pub fn ok(&self) -> bool {
        self.growth.is_empty() && !self.vitals.is_empty()
    }

    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\nsoak: {} samples, one every {:.0} s; each daemon's life judged after its first {} s, lives of {} s or more",
            self.samples, self.every_s, self.warmup_s, self.min_span_s
        );
        let _ = writeln!(
            out,
            "{:<14} {:>5} {:>12} {:>12} {:>12} {:>14}  {:<24} {:>7}",
            "vital", "lives", "first", "last", "max", "steepest /h", "whose", "growing"
        );
        for v in &self.vitals {
            let _ = writeln!(
                out,
                "{:<14} {:>5} {:>12.1} {:>12.1} {:>12.0} {:>14.2}  {:<24} {:>7}",
                v.vital.name(),
                v.lives,
                v.first,
                v.last,
                v.max,
                v.steepest_per_hour,
                v.steepest,
                v.growing
            );
        }
        if self.vitals.is_empty() {
            let _ = writeln!(out, "no life was sampled long enough to judge");
        }
        for t in &self.growth {
            let _ = writeln!(
                out,
                "GROWTH {} on {} (pid {}): {:.1} → {:.1} over {:.0} s, {:+.2}/h",
                t.vital.name(),
                t.node,
                t.pid,
                t.first,
                t.last,
                t.span_s,
                t.slope_per_hour
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_s: f64, node: &str, pid: u32, rss: f64, fds: f64) -> Sample {
        Sample {
            at_s,
            node: node.into(),
            pid,
            values: vec![(Vital::RssKib, Some(rss)), (Vital::Fds, Some(fds))],
        }
    }

    #[test]
    fn proc_status_gives_rss_and_threads() {
        let text = "Name:\tdomaind\nVmPeak:\t  99999 kB\nVmRSS:\t   23456 kB\n\
                    RssAnon:\t    6784 kB\nRssFile:\t   16672 kB\nThreads:\t7\n";
        assert_eq!(
            parse_proc_status(text),
            ProcStatus {
                rss_kib: Some(23456.0),
                rss_anon_kib: Some(6784.0),
                threads: Some(7.0)
            }
        );
        assert_eq!(parse_proc_status("Name:\tzombie\n"), ProcStatus::default());
    }

    #[test]
    fn series_are_the_lines_that_are_not_comments() {
        let text = "# HELP a x\n# TYPE a counter\na{k=\"1\"} 3\na{k=\"2\"} 4\n\nb 1\n";
        assert_eq!(metric_series(text), 3);
    }

    #[test]
    fn a_metric_value_is_read_by_its_whole_name() {
        let text = "# HELP domaind_heap_allocated_bytes held\n\
                    domaind_heap_allocated_bytes_total 7\n\
                    domaind_heap_allocated_bytes 1234567\n";
        assert_eq!(
            metric_value(text, "domaind_heap_allocated_bytes"),
            Some(1_234_567.0)
        );
        assert_eq!(metric_value(text, "domaind_heap_resident_bytes"), None);
    }

    #[test]
    fn the_slope_is_per_hour_and_needs_two_times() {
        let line: Vec<(f64, f64)> = (0..10).map(|i| (i as f64 * 60.0, 5.0 + i as f64)).collect();
        let slope = slope_per_hour(&line).unwrap();
        assert!((slope - 60.0).abs() < 1e-9, "{slope}");
        assert_eq!(slope_per_hour(&[(1.0, 2.0)]), None);
        assert_eq!(slope_per_hour(&[(1.0, 2.0), (1.0, 3.0)]), None);
    }

    /// Soak 43's heap: a flat baseline with a few samples caught in a burst of work (28 MB
    /// against 4), late in the run. Means of quarters and a least-squares line called
    /// that growth; the baseline did not move.
    #[test]
    fn peaks_of_a_burst_are_not_growth_and_a_rising_baseline_is() {
        let mut samples = Samples::default();
        for i in 0..110 {
            let t = i as f64 * 30.0;
            let peak = match i {
                95 => 28.0e6,
                101 => 12.0e6,
                _ => 0.0,
            };
            samples.push(Sample {
                at_s: t,
                node: "node-01".into(),
                pid: 10,
                values: vec![(
                    Vital::HeapAllocatedBytes,
                    Some(4.0e6 + (i % 5) as f64 * 5e4 + peak),
                )],
            });
            samples.push(Sample {
                at_s: t,
                node: "node-02".into(),
                pid: 11,
                values: vec![(Vital::HeapAllocatedBytes, Some(4.0e6 + i as f64 * 2e4))],
            });
        }
        let report = SoakReport::new(
            &samples,
            Duration::from_secs(30),
            Duration::ZERO,
            Duration::from_secs(1800),
        );
        let grew: Vec<&str> = report.growth.iter().map(|t| t.node.as_str()).collect();
        assert_eq!(grew, ["node-02"], "{}", report.table());
        // 20 kB a sample, 120 samples an hour.
        assert!((report.growth[0].slope_per_hour - 2.4e6).abs() < 1.0);
    }

    #[test]
    fn a_leak_grows_and_noise_does_not() {
        let mut samples = Samples::default();
        for i in 0..120 {
            let t = i as f64 * 60.0;
            // A flat daemon with a wobble, and one leaking a descriptor a minute.
            let wobble = if i % 2 == 0 { 300.0 } else { -300.0 };
            samples.push(sample(
                t,
                "node-01",
                10,
                20_000.0 + wobble,
                40.0 + (i % 3) as f64,
            ));
            samples.push(sample(t, "node-02", 11, 20_000.0, 40.0 + i as f64));
        }
        let report = SoakReport::new(
            &samples,
            Duration::from_secs(60),
            Duration::from_secs(600),
            Duration::from_secs(1800),
        );
        assert_eq!(report.growth.len(), 1, "{}", report.table());
        let leak = &report.growth[0];
        assert_eq!((leak.node.as_str(), leak.vital), ("node-02", Vital::Fds));
        assert!((leak.slope_per_hour - 60.0).abs() < 1e-6);
        assert!(!report.ok());
        let fds = report
            .vitals
            .iter()
            .find(|v| v.vital == Vital::Fds)
            .unwrap();
        assert_eq!((fds.lives, fds.growing), (2, 1));
    }

    #[test]
    fn each_life_is_judged_alone_and_short_ones_not_at_all() {
        let mut samples = Samples::default();
        // A restart: the new process starts lower; across lives that is no trend, and
        // a higher start after a restart is no growth either.
        for i in 0..60 {
            samples.push(sample(i as f64 * 60.0, "node-01", 10, 30_000.0, 50.0));
        }
        for i in 60..120 {
            samples.push(sample(i as f64 * 60.0, "node-01", 12, 35_000.0, 50.0));
        }
        // Ten minutes of a third life: too short to judge.
        for i in 120..130 {
            samples.push(sample(
                i as f64 * 60.0,
                "node-01",
                13,
                10_000.0 + i as f64 * 1000.0,
                50.0,
            ));
        }
        let report = SoakReport::new(
            &samples,
            Duration::from_secs(60),
            Duration::from_secs(600),
            Duration::from_secs(1800),
        );
        assert!(report.ok(), "{}", report.table());
        let rss = report
            .vitals
            .iter()
            .find(|v| v.vital == Vital::RssKib)
            .unwrap();
        assert_eq!(rss.lives, 2);
        assert_eq!(rss.steepest_per_hour, 0.0);
    }

    #[test]
    fn nothing_long_enough_is_not_a_pass() {
        let mut samples = Samples::default();
        samples.push(sample(0.0, "node-01", 10, 1.0, 1.0));
        let report = SoakReport::new(
            &samples,
            Duration::from_secs(60),
            Duration::from_secs(600),
            Duration::from_secs(1800),
        );
        assert!(!report.ok());
    }

    #[test]
    fn samples_come_back_from_their_csv() {
        let mut text = Sample::csv_header();
        let mut written = Samples::default();
        for i in 0..3 {
            let mut s = sample(i as f64 * 30.0, "node-02", 41, 20_000.0 + i as f64, 33.0);
            s.values = Vital::ALL
                .iter()
                .map(|v| (*v, (*v != Vital::JournalBytes).then_some(i as f64)))
                .collect();
            text.push('\n');
            text.push_str(&s.csv_line());
            written.push(s);
        }
        let read = Samples::from_csv(&text).unwrap();
        assert_eq!(read.samples, written.samples);
        assert!(
            Samples::from_csv("at_s,node,pid,rss_kib\n1,node-01,7,x\n")
                .unwrap_err()
                .contains("line 2: rss_kib is not a number")
        );
        assert!(
            Samples::from_csv("time,who\n")
                .unwrap_err()
                .contains("header")
        );
        assert!(
            Samples::from_csv("at_s,node,pid,heap\n")
                .unwrap_err()
                .contains("\"heap\"")
        );
    }

    #[test]
    fn samples_of_a_run_before_a_vital_existed_still_read() {
        let samples = Samples::from_csv("at_s,node,pid,rss_kib\n1.0,node-01,5,100\n").unwrap();
        assert_eq!(samples.len(), 1);
        assert_eq!(samples.samples[0].value(Vital::RssKib), Some(100.0));
        assert_eq!(samples.samples[0].value(Vital::HeapAllocatedBytes), None);
    }

    #[test]
    fn csv_lines_leave_unread_values_empty() {
        let mut s = sample(12.34, "node-03", 77, 100.0, 9.0);
        s.values.push((Vital::GossipKeys, None));
        assert_eq!(
            Sample::csv_header(),
            "at_s,node,pid,rss_kib,rss_anon_kib,fds,threads,journal_bytes,metric_series,gossip_nodes,gossip_keys,gossip_bytes,heap_allocated_bytes,heap_resident_bytes,heap_active_bytes,heap_metadata_bytes"
        );
        assert_eq!(s.csv_line(), "12.3,node-03,77,100,,9,,,,,,,,,,");
    }
}
