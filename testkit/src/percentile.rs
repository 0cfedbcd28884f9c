//! How every benchmark and run report reads a distribution: nearest-rank percentiles.

/// The smallest of `sorted` (ascending) with at least `p`% of the samples at or below it.
///
/// # Panics
/// When `sorted` is empty: an empty distribution has no percentiles, and each caller
/// says so in its own words first.
pub fn percentile<T: Copy>(sorted: &[T], p: u32) -> T {
    let rank = (sorted.len() * p as usize).div_ceil(100).max(1);
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let hundred: Vec<u32> = (1..=100).collect();
        assert_eq!(
            [50, 90, 99, 100].map(|p| percentile(&hundred, p)),
            [50, 90, 99, 100]
        );
        assert_eq!([50, 99].map(|p| percentile(&[10, 20, 30], p)), [20, 30]);
        assert_eq!(percentile(&[7], 0), 7);
    }
}
