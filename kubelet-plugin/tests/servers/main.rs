//! The kubelet plugin's gRPC servers over real unix sockets: the kubelet-style client
//! with a fake node behind them, device health as the kubelet watches it, and the
//! `:authority` filter with raw HTTP/2 clients.

mod authority;
mod device_health;
mod grpc;

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// The servers count on their own tasks, so the recorder is the process's, shared by
/// every test of this binary. A snapshot resets its counters, so every snapshot is
/// added to running totals; each test asserts only on counters it alone moves.
struct ProcessMetrics {
    snapshotter: Snapshotter,
    /// (name, labels as `k=v` in order) → total.
    totals: Mutex<BTreeMap<(String, Vec<String>), u64>>,
}

fn process_metrics() -> &'static ProcessMetrics {
    static METRICS: OnceLock<ProcessMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("no other recorder in this test binary");
        ProcessMetrics {
            snapshotter,
            totals: Mutex::new(BTreeMap::new()),
        }
    })
}

/// The total of counter `name` over every label set that has all of `labels`.
fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    let metrics = process_metrics();
    let mut totals = metrics
        .totals
        .lock()
        .expect("a test panicked holding the totals");
    for (key, _, _, value) in metrics.snapshotter.snapshot().into_vec() {
        let DebugValue::Counter(n) = value else {
            continue;
        };
        let key = key.key();
        let labels = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        *totals.entry((key.name().to_owned(), labels)).or_default() += n;
    }
    let wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    totals
        .iter()
        .filter(|((n, have), _)| n == name && wanted.iter().all(|w| have.contains(w)))
        .map(|(_, total)| total)
        .sum()
}
