//! Latency figures of one case: nearest-rank percentiles over the calls' durations.

use std::time::Duration;

use domaind_testkit::percentile::percentile;
use serde::Serialize;

/// p50, p90, p99 and max of one case's calls, in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Latency {
    pub case: &'static str,
    pub calls: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    /// The figures of `samples`; `None` without any.
    pub fn of(case: &'static str, samples: &[Duration]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
        Some(Self {
            case,
            calls: sorted.len(),
            p50_ms: ms(percentile(&sorted, 50)),
            p90_ms: ms(percentile(&sorted, 90)),
            p99_ms: ms(percentile(&sorted, 99)),
            max_ms: ms(*sorted.last().expect("not empty")),
        })
    }
}

/// The cases as a table, one line each.
pub fn table(cases: &[Latency]) -> String {
    let mut out = format!(
        "{:<22} {:>6} {:>9} {:>9} {:>9} {:>9}\n",
        "CASE", "CALLS", "p50 ms", "p90 ms", "p99 ms", "max ms"
    );
    for case in cases {
        out.push_str(&format!(
            "{:<22} {:>6} {:>9.2} {:>9.2} {:>9.2} {:>9.2}\n",
            case.case, case.calls, case.p50_ms, case.p90_ms, case.p99_ms, case.max_ms
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(values: impl IntoIterator<Item = u64>) -> Vec<Duration> {
        values.into_iter().map(Duration::from_millis).collect()
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let hundred = Latency::of("x", &ms((1..=100).rev())).unwrap();
        assert_eq!(
            (
                hundred.p50_ms,
                hundred.p90_ms,
                hundred.p99_ms,
                hundred.max_ms
            ),
            (50.0, 90.0, 99.0, 100.0)
        );
        assert_eq!(hundred.calls, 100);
        let one = Latency::of("x", &ms([7])).unwrap();
        assert_eq!((one.p50_ms, one.p99_ms, one.max_ms), (7.0, 7.0, 7.0));
        // Few samples: p99 is the largest, p50 the middle one.
        let few = Latency::of("x", &ms([30, 10, 20])).unwrap();
        assert_eq!((few.p50_ms, few.p90_ms, few.p99_ms), (20.0, 30.0, 30.0));
        assert_eq!(Latency::of("x", &[]), None);
    }

    #[test]
    fn sub_millisecond_calls_keep_microseconds() {
        let fast = Latency::of("x", &[Duration::from_micros(1_234)]).unwrap();
        assert_eq!(fast.p50_ms, 1.234);
    }
}
