//! A soak's samples (`--sample-every`): every daemon's process, journal, metrics and
//! gossip state, read from outside between observations, kept for the report's
//! trends and written to a CSV as they come (a run cut short keeps what it saw).

use std::fs::File;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use domaind_checkpoint::JOURNAL_FILE;

use domaind_heap::{
    HEAP_ACTIVE_BYTES, HEAP_ALLOCATED_BYTES, HEAP_METADATA_BYTES, HEAP_RESIDENT_BYTES,
};

use super::Harness;
use crate::invariants::Life;
use crate::soak::{
    MIN_SPAN, Sample, Samples, SoakReport, Vital, metric_series, metric_value, parse_proc_status,
};

/// How to sample.
#[derive(Debug, Clone)]
pub struct Sampling {
    pub every: Duration,
    /// How much of each life is not judged ([`crate::soak::WARMUP`]).
    pub warmup: Duration,
    /// Where each sample goes as a CSV line.
    pub csv: Option<PathBuf>,
}

pub(super) struct Sampler {
    every: Duration,
    warmup: Duration,
    next: Instant,
    first: Option<Instant>,
    samples: Samples,
    csv: Option<File>,
}

impl Sampler {
    pub(super) fn new(sampling: &Sampling) -> anyhow::Result<Self> {
        let csv = match &sampling.csv {
            Some(path) => {
                let mut file = File::create(path).map_err(|e| {
                    anyhow::anyhow!("cannot write the samples to {}: {e}", path.display())
                })?;
                writeln!(file, "{}", Sample::csv_header())?;
                Some(file)
            }
            None => None,
        };
        Ok(Self {
            every: sampling.every,
            warmup: sampling.warmup,
            next: Instant::now(),
            first: None,
            samples: Samples::default(),
            csv,
        })
    }
}

impl Harness {
    /// Samples every running daemon when the interval has passed: called on every
    /// tick, after the observation it reads the gossip state from.
    pub(super) async fn sample_if_due(&mut self) {
        let Some(sampler) = &self.sampler else {
            return;
        };
        let now = Instant::now();
        if now < sampler.next {
            return;
        }
        let first = sampler.first.unwrap_or(now);
        let at_s = now.saturating_duration_since(first).as_secs_f64();
        let mut taken = Vec::new();
        for node in 0..self.world.nodes.len() {
            if self.world.nodes[node].life != Life::Up {
                continue;
            }
            let Some(pid) = self.rack.node(node).pid() else {
                continue;
            };
            taken.push(self.sample_node(node, pid, at_s).await);
        }
        let Some(sampler) = &mut self.sampler else {
            return;
        };
        sampler.first = Some(first);
        sampler.next = now + sampler.every;
        for sample in taken {
            if let Some(csv) = &mut sampler.csv {
                // The CSV is evidence beside the report, which keeps every sample: a
                // failed write loses nothing the verdict needs.
                let _ = writeln!(csv, "{}", sample.csv_line());
            }
            sampler.samples.push(sample);
        }
    }

    async fn sample_node(&self, node: usize, pid: u32, at_s: f64) -> Sample {
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let status = std::fs::read_to_string(proc_dir.join("status"))
            .map(|text| parse_proc_status(&text))
            .unwrap_or_default();
        let fds = std::fs::read_dir(proc_dir.join("fd"))
            .ok()
            .map(|entries| entries.count() as f64);
        let rack_node = self.rack.node(node);
        let journal = std::fs::metadata(rack_node.state_dir().join(JOURNAL_FILE))
            .ok()
            .map(|m| m.len() as f64);
        let exposition = match rack_node.info() {
            Some(info) => crate::observe::metrics(info.http_addr).await.ok(),
            None => None,
        };
        let series = exposition.as_deref().map(|text| metric_series(text) as f64);
        let heap = |name| {
            exposition
                .as_deref()
                .and_then(|text| metric_value(text, name))
        };
        let gossip = self
            .last
            .as_ref()
            .and_then(|(_, observation)| observation.nodes.get(node))
            .and_then(|seen| seen.view.as_ref())
            .map(|view| view.gossip.state);
        Sample {
            at_s,
            node: self.name(node),
            pid,
            values: vec![
                (Vital::RssKib, status.rss_kib),
                (Vital::RssAnonKib, status.rss_anon_kib),
                (Vital::Fds, fds),
                (Vital::Threads, status.threads),
                (Vital::JournalBytes, journal),
                (Vital::MetricSeries, series),
                (Vital::GossipNodes, gossip.map(|g| g.nodes as f64)),
                (Vital::GossipKeys, gossip.map(|g| g.keys as f64)),
                (Vital::GossipBytes, gossip.map(|g| g.bytes as f64)),
                (Vital::HeapAllocatedBytes, heap(HEAP_ALLOCATED_BYTES)),
                (Vital::HeapResidentBytes, heap(HEAP_RESIDENT_BYTES)),
                (Vital::HeapActiveBytes, heap(HEAP_ACTIVE_BYTES)),
                (Vital::HeapMetadataBytes, heap(HEAP_METADATA_BYTES)),
            ],
        }
    }

    /// The soak's judgement, when the run sampled.
    pub(super) fn soak_report(&self) -> Option<SoakReport> {
        let sampler = self.sampler.as_ref()?;
        Some(SoakReport::new(
            &sampler.samples,
            sampler.every,
            sampler.warmup,
            MIN_SPAN,
        ))
    }
}
