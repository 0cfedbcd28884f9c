//! What the API server says it served, and what serving it cost: its own `/metrics`
//! (requests by verb and resource, conflicts, bytes) and the CPU of its process and of
//! etcd's (`/proc/<pid>/stat`). The scale benchmark (`suite/scale.rs`) reads both
//! before and after each step and divides by the changes the step made.
//!
//! Only the admin's credentials may read `/metrics`; `../shared/kube`'s
//! `admin.kubeconfig` has them, and its control plane keeps its pid files in `run/`
//! beside that kubeconfig.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kube::Client;

/// One exposition's samples: `(metric name, labels)` to value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples(BTreeMap<(String, BTreeMap<String, String>), f64>);

impl Samples {
    /// Parses the Prometheus text format. Comments and lines that do not parse are
    /// skipped: a figure missing from the result shows as zero, never as a panic in
    /// the middle of a benchmark.
    pub fn parse(text: &str) -> Self {
        Self(
            text.lines()
                .filter(|line| !line.starts_with('#'))
                .filter_map(sample_line)
                .map(|(name, labels, value)| ((name, labels), value))
                .collect(),
        )
    }

    /// Each series' increase since `before` (a series new since then counts from zero).
    pub fn since(&self, before: &Self) -> Self {
        Self(
            self.0
                .iter()
                .map(|(key, after)| (key.clone(), after - before.0.get(key).unwrap_or(&0.0)))
                .collect(),
        )
    }

    fn series<'a>(
        &'a self,
        name: &'a str,
    ) -> impl Iterator<Item = (&'a BTreeMap<String, String>, f64)> + 'a {
        self.0
            .iter()
            .filter(move |((n, _), _)| n == name)
            .map(|((_, labels), value)| (labels, *value))
    }

    /// The sum of `name` over every label set.
    pub fn total(&self, name: &str) -> f64 {
        // A fold from +0: an empty f64 sum is -0, which prints as "-0".
        self.series(name).fold(0.0, |sum, (_, value)| sum + value)
    }

    /// What was served, in the shape the benchmark reports.
    pub fn traffic(&self) -> Traffic {
        let mut requests = BTreeMap::new();
        let mut conflicts = BTreeMap::new();
        let mut background = 0.0;
        for (labels, value) in self.series("apiserver_request_total") {
            let label = |key: &str| labels.get(key).map(String::as_str).unwrap_or_default();
            if label("code") == "409" && value > 0.0 {
                *conflicts
                    .entry(format!(
                        "{} {}{}",
                        label("verb"),
                        label("resource"),
                        match label("subresource") {
                            "" => String::new(),
                            sub => format!("/{sub}"),
                        }
                    ))
                    .or_insert(0.0) += value;
            }
            let resource = match (label("resource"), label("subresource")) {
                // Non-resource URLs: the benchmark's own /metrics reads, health checks.
                ("", _) => continue,
                (resource, "") => resource.to_owned(),
                (resource, sub) => format!("{resource}/{sub}"),
            };
            // Leader election of the control plane and of our controller: a steady
            // beat that no change of ours causes.
            if resource == "leases" {
                background += value;
                continue;
            }
            // A watch is counted when it ends, and the control plane's informers end
            // and start theirs all the time: what watches cost is their events, below.
            if label("verb") == "WATCH" {
                continue;
            }
            *requests
                .entry(format!("{} {resource}", label("verb")))
                .or_insert(0.0) += value;
        }
        requests.retain(|_, count| *count > 0.0);
        Traffic {
            requests,
            conflicts,
            leases: background,
            request_bytes: self.total("apiserver_request_body_size_bytes_sum"),
            read_bytes: self.total("apiserver_response_sizes_sum"),
            watch_events: self.total("apiserver_watch_events_total"),
            watch_bytes: self.total("apiserver_watch_events_sizes_sum"),
        }
    }
}

/// `name{key="value",...} value [timestamp]`, or `name value`.
fn sample_line(line: &str) -> Option<(String, BTreeMap<String, String>, f64)> {
    let line = line.trim();
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_owned();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        rest = inner;
        loop {
            rest = rest.trim_start_matches([',', ' ']);
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, after) = rest.split_once("=\"")?;
            let (value, after) = quoted(after)?;
            labels.insert(key.trim().to_owned(), value);
            rest = after;
        }
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some((name, labels, value))
}

/// A label value up to its closing quote, unescaped, and what follows the quote.
fn quoted(text: &str) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => return Some((value, &text[at + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => value.push('\n'),
                other => value.push(other),
            },
            c => value.push(c),
        }
    }
    None
}

/// Requests and bytes the API server served over a window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Traffic {
    /// `"<VERB> <resource>[/<subresource>]"` to count; watches, leases and
    /// non-resource URLs are left out.
    pub requests: BTreeMap<String, f64>,
    /// Answers 409 (Conflict), by `"<VERB> <resource>[/<subresource>]"`.
    pub conflicts: BTreeMap<String, f64>,
    /// Lease requests (leader election), apart.
    pub leases: f64,
    /// Bodies of the requests that had one (writes).
    pub request_bytes: f64,
    /// Answers to reads (GET, LIST): the API server measures no others.
    pub read_bytes: f64,
    /// Watch events sent, each watcher counted.
    pub watch_events: f64,
    pub watch_bytes: f64,
}

impl Traffic {
    pub fn total_requests(&self) -> f64 {
        self.requests.values().fold(0.0, |sum, count| sum + count)
    }

    pub fn writes(&self) -> f64 {
        self.requests
            .iter()
            .filter(|(key, _)| {
                [
                    "POST", "PUT", "PATCH", "DELETE", "APPLY", "CREATE", "UPDATE",
                ]
                .iter()
                .any(|verb| key.starts_with(verb))
            })
            .fold(0.0, |sum, (_, count)| sum + count)
    }

    /// Conflicts on every resource.
    pub fn all_conflicts(&self) -> f64 {
        self.conflicts.values().fold(0.0, |sum, count| sum + count)
    }

    pub fn bytes(&self) -> f64 {
        self.request_bytes + self.read_bytes + self.watch_bytes
    }

    /// One line: the requests by kind, then conflicts and bytes.
    pub fn describe(&self) -> String {
        let requests: Vec<String> = self
            .requests
            .iter()
            .map(|(key, count)| format!("{key} {count}"))
            .collect();
        let conflicts: Vec<String> = self
            .conflicts
            .iter()
            .map(|(key, count)| format!("{key} {count}"))
            .collect();
        format!(
            "{} requests ({} writes; {}), {} conflicts ({}), {} lease requests apart; bytes: {:.0} written, {:.0} read, {:.0} in {} watch events",
            self.total_requests(),
            self.writes(),
            requests.join(", "),
            self.all_conflicts(),
            conflicts.join(", "),
            self.leases,
            self.request_bytes,
            self.read_bytes,
            self.watch_bytes,
            self.watch_events,
        )
    }
}

/// The metrics [`Samples::traffic`] reads: the rest of the API server's 14,000 lines
/// are not parsed.
const READ: &[&str] = &[
    "apiserver_request_total{",
    "apiserver_request_body_size_bytes_sum{",
    "apiserver_response_sizes_sum{",
    "apiserver_watch_events_total{",
    "apiserver_watch_events_sizes_sum{",
];

/// The API server's metrics, read now with `client` (the admin's). A read costs the API
/// server about 70 ms of CPU (measured on the 2-core machine), so a benchmark reads it
/// only at the edges of a window.
pub async fn scrape(client: &Client) -> Samples {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a request for /metrics");
    let text = client
        .request_text(request)
        .await
        .expect("the API server's /metrics (the admin's kubeconfig may read it)");
    let wanted: String = text
        .lines()
        .filter(|line| READ.iter().any(|prefix| line.starts_with(prefix)))
        .flat_map(|line| [line, "\n"])
        .collect();
    Samples::parse(&wanted)
}

/// The control plane's processes, from the pid files `../shared/kube` keeps in `run/`
/// beside `admin.kubeconfig`.
#[derive(Debug, Clone)]
pub struct ControlPlane {
    pub apiserver: u32,
    pub etcd: u32,
}

impl ControlPlane {
    /// From `DOMAIND_SCALE_KUBE_RUN` (the `run/` directory) when set, else `run/` beside
    /// the `KUBECONFIG` file.
    pub fn find() -> Self {
        let run: PathBuf = std::env::var_os("DOMAIND_SCALE_KUBE_RUN")
            .map(Into::into)
            .unwrap_or_else(|| {
                let kubeconfig: PathBuf = std::env::var_os("KUBECONFIG")
                    .expect("KUBECONFIG names ../shared/kube's admin.kubeconfig")
                    .into();
                kubeconfig
                    .parent()
                    .expect("the kubeconfig's directory")
                    .join("run")
            });
        Self {
            apiserver: pid_in(&run, "kube-apiserver.pid"),
            etcd: pid_in(&run, "etcd.pid"),
        }
    }

    /// Clock ticks each has used so far (utime + stime).
    pub fn ticks(&self) -> ControlPlaneTicks {
        ControlPlaneTicks {
            apiserver: own_ticks(self.apiserver),
            etcd: own_ticks(self.etcd),
        }
    }
}

fn pid_in(run: &Path, file: &str) -> u32 {
    let path = run.join(file);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (set DOMAIND_SCALE_KUBE_RUN)", path.display()))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn own_ticks(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| utime_and_stime(&stat))
        .unwrap_or_else(|| panic!("process {pid} of the control plane is gone"))
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line; the command before
/// them may hold spaces and parentheses, so fields count from its last `)`.
fn utime_and_stime(stat: &str) -> Option<u64> {
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace().skip(11);
    Some(fields.next()?.parse::<u64>().ok()? + fields.next()?.parse::<u64>().ok()?)
}

/// The kernel's clock ticks per second (`USER_HZ`).
pub fn ticks_per_second() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |hz| hz as f64)
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ControlPlaneTicks {
    pub apiserver: u64,
    pub etcd: u64,
}

impl ControlPlaneTicks {
    /// CPU seconds each used since `before`.
    pub fn seconds_since(&self, before: &Self) -> (f64, f64) {
        let hz = ticks_per_second();
        (
            self.apiserver.saturating_sub(before.apiserver) as f64 / hz,
            self.etcd.saturating_sub(before.etcd) as f64 / hz,
        )
    }
}

/// The machine's CPU ticks so far, busy and all (`/proc/stat`'s first line; idle and
/// iowait are not busy).
pub fn machine_ticks() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = text
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    let all: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    (all - idle, all)
}

/// Takes [`Mark`]s and says what happened between one and now.
#[derive(Clone)]
pub struct Meter {
    client: Client,
    plane: ControlPlane,
}

// The client has no Debug of its own.
impl std::fmt::Debug for Meter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meter")
            .field("plane", &self.plane)
            .finish_non_exhaustive()
    }
}

/// A moment's readings.
#[derive(Debug)]
pub struct Mark {
    samples: Samples,
    ticks: ControlPlaneTicks,
    machine: (u64, u64),
    me: u64,
    at: std::time::Instant,
}

/// What the API server served and what it and the machine spent, over a window.
#[derive(Debug, Clone)]
pub struct Window {
    pub traffic: Traffic,
    pub seconds: f64,
    /// CPU seconds.
    pub apiserver: f64,
    pub etcd: f64,
    /// This process (the benchmark: its clients, its watch).
    pub me: f64,
    /// Percent of all cores busy.
    pub machine_busy: f64,
}

impl Window {
    /// One line of figures, `per` changes dividing requests and bytes; with `idle` (a
    /// window of the same setup at rest), the API server's CPU net of its idle rate too.
    pub fn describe(&self, per: f64, idle: Option<&Window>) -> String {
        let net = idle.map_or(String::new(), |idle| {
            format!(
                " ({:.2} net of idle)",
                self.apiserver - idle.apiserver / idle.seconds * self.seconds
            )
        });
        format!(
            "{:.1} s; per change ({per}): {:.1} requests, {:.1} writes, {:.0} bytes; API server {:.2} CPU s{net}, etcd {:.2}, benchmark {:.2}; machine {:.0}% busy; {}",
            self.seconds,
            self.traffic.total_requests() / per,
            self.traffic.writes() / per,
            self.traffic.bytes() / per,
            self.apiserver,
            self.etcd,
            self.me,
            self.machine_busy,
            self.traffic.describe(),
        )
    }
}

impl Meter {
    /// `client` must be the admin's: only it may read `/metrics`.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            plane: ControlPlane::find(),
        }
    }

    pub fn plane(&self) -> &ControlPlane {
        &self.plane
    }

    pub async fn mark(&self) -> Mark {
        Mark {
            samples: scrape(&self.client).await,
            ticks: self.plane.ticks(),
            machine: machine_ticks(),
            me: own_ticks(std::process::id()),
            at: std::time::Instant::now(),
        }
    }

    pub async fn since(&self, mark: &Mark) -> Window {
        let now = self.mark().await;
        let (apiserver, etcd) = now.ticks.seconds_since(&mark.ticks);
        let busy = now.machine.0.saturating_sub(mark.machine.0) as f64;
        let all = now.machine.1.saturating_sub(mark.machine.1).max(1) as f64;
        Window {
            traffic: now.samples.since(&mark.samples).traffic(),
            seconds: now.at.duration_since(mark.at).as_secs_f64(),
            apiserver,
            etcd,
            me: now.me.saturating_sub(mark.me) as f64 / ticks_per_second(),
            machine_busy: busy / all * 100.0,
        }
    }
}

/// The machine's load averages (1, 5, 15 minutes), as `/proc/loadavg` says.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = r#"# HELP apiserver_request_total [STABLE] Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="resource.nvidia.com",resource="computedomains",scope="resource",subresource="status",verb="PATCH",version="v1beta1"} 3
apiserver_request_total{code="409",component="apiserver",dry_run="",group="resource.nvidia.com",resource="computedomains",scope="resource",subresource="status",verb="PUT",version="v1beta1"} 1
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 40
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="",scope="",subresource="/metrics",verb="GET",version=""} 2
apiserver_request_body_size_bytes_sum{resource="computedomains",verb="update"} 1000
apiserver_response_sizes_sum{component="apiserver",group="resource.k8s.io",resource="resourceclaims",scope="resource",subresource="",verb="GET",version="v1"} 500
apiserver_watch_events_total{group="resource.nvidia.com",kind="ComputeDomain",version="v1beta1"} 10
apiserver_watch_events_sizes_sum{group="resource.nvidia.com",kind="ComputeDomain",version="v1beta1"} 20000
"#;

    const AFTER: &str = r#"apiserver_request_total{code="200",component="apiserver",dry_run="",group="resource.nvidia.com",resource="computedomains",scope="resource",subresource="status",verb="PATCH",version="v1beta1"} 5
apiserver_request_total{code="409",component="apiserver",dry_run="",group="resource.nvidia.com",resource="computedomains",scope="resource",subresource="status",verb="PUT",version="v1beta1"} 4
apiserver_request_total{code="200",component="apiserver",dry_run="",group="resource.nvidia.com",resource="computedomains",scope="resource",subresource="status",verb="PUT",version="v1beta1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 45
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="",scope="",subresource="/metrics",verb="GET",version=""} 3
apiserver_request_body_size_bytes_sum{resource="computedomains",verb="update"} 4000
apiserver_response_sizes_sum{component="apiserver",group="resource.k8s.io",resource="resourceclaims",scope="resource",subresource="",verb="GET",version="v1"} 700
apiserver_watch_events_total{group="resource.nvidia.com",kind="ComputeDomain",version="v1beta1"} 16
apiserver_watch_events_sizes_sum{group="resource.nvidia.com",kind="ComputeDomain",version="v1beta1"} 32000
"#;

    #[test]
    fn a_window_counts_requests_by_verb_and_resource_conflicts_and_bytes() {
        let traffic = Samples::parse(AFTER)
            .since(&Samples::parse(BEFORE))
            .traffic();
        assert_eq!(
            traffic.requests,
            [
                ("PATCH computedomains/status".to_owned(), 2.0),
                ("PUT computedomains/status".to_owned(), 5.0),
            ]
            .into()
        );
        assert_eq!(
            traffic.conflicts,
            [("PUT computedomains/status".to_owned(), 3.0)].into()
        );
        assert_eq!(traffic.all_conflicts(), 3.0);
        assert_eq!(traffic.leases, 5.0, "leases are counted apart");
        assert_eq!(traffic.total_requests(), 7.0, "no /metrics read, no lease");
        assert_eq!(traffic.writes(), 7.0);
        assert_eq!(traffic.request_bytes, 3000.0);
        assert_eq!(traffic.read_bytes, 200.0);
        assert_eq!((traffic.watch_events, traffic.watch_bytes), (6.0, 12000.0));
        assert_eq!(traffic.bytes(), 15200.0);
    }

    #[test]
    fn label_values_are_unescaped_and_bad_lines_skipped() {
        let samples = Samples::parse(
            "m{a=\"x\\\"y\",b=\"1,2}\"} 7\nplain 3 1700000000\nnot a sample\nm{a=\"open} 1\n",
        );
        let labels: BTreeMap<String, String> =
            [("a".into(), "x\"y".into()), ("b".into(), "1,2}".into())].into();
        assert_eq!(samples.0.get(&("m".to_owned(), labels)), Some(&7.0));
        assert_eq!(samples.total("plain"), 3.0);
        assert_eq!(samples.0.len(), 2, "{samples:?}");
    }

    #[test]
    fn a_stat_line_gives_user_and_system_time() {
        let stat = "4242 (kube (x) apiserver) S 17 4242 17 0 -1 4194560 3120 0 0 0 \
                    250 75 40 12 20 0 9 0 1234 123456789 2345";
        assert_eq!(utime_and_stime(stat), Some(325));
        assert_eq!(utime_and_stime("4242 (x) S 1 2"), None);
        assert!(own_ticks(std::process::id()) < u64::MAX);
        assert!(ticks_per_second() > 0.0);
    }

    #[test]
    fn this_machine_has_a_load_average_and_busy_ticks() {
        assert_eq!(load_average().split(' ').count(), 3);
        let (busy, all) = machine_ticks();
        assert!(0 < busy && busy < all, "{busy} of {all}");
    }
}
