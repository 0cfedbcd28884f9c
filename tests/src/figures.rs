//! How the benchmarks of the suite print a distribution, and read their sizes.

use std::time::Duration;

use domaind_testkit::percentile::percentile;

/// `p50 / p99 / max` in milliseconds, nearest rank, and how many: "412 / 980 / 980 ms
/// (n=3)". Empty is "none".
pub fn distribution(samples: &[Duration]) -> String {
    if samples.is_empty() {
        return "none".into();
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    format!(
        "{} / {} / {} ms (n={})",
        percentile(&sorted, 50).as_millis(),
        percentile(&sorted, 99).as_millis(),
        sorted[sorted.len() - 1].as_millis(),
        sorted.len()
    )
}

/// A number from the environment, or `default`; a value that does not parse fails
/// the benchmark with its name.
pub fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |value| {
        value
            .parse()
            .unwrap_or_else(|e| panic!("{name}={value}: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|m| Duration::from_millis(*m))
                .collect::<Vec<_>>()
        };
        assert_eq!(distribution(&ms(&[30, 10, 20])), "20 / 30 / 30 ms (n=3)");
        let hundred: Vec<u64> = (1..=100).collect();
        assert_eq!(distribution(&ms(&hundred)), "50 / 99 / 100 ms (n=100)");
        assert_eq!(distribution(&[]), "none");
    }

    #[test]
    fn numbers_from_the_environment() {
        assert_eq!(env_number("DOMAIND_E2E_FIGURES_UNSET_FOR_THIS_TEST", 7), 7);
    }
}
