//! When a node renews its certificate: at two thirds of its validity, so that a third
//! of it (8 h of the default 24 h) is left for the signer to answer, however long it is
//! down, before the old one expires.

use std::time::{Duration, SystemTime};

/// The instant two thirds of the way from `not_before` to `not_after`.
pub fn renew_at(not_before: SystemTime, not_after: SystemTime) -> SystemTime {
    let lifetime = not_after
        .duration_since(not_before)
        .unwrap_or(Duration::ZERO);
    not_before + lifetime * 2 / 3
}

/// How long to wait from `now` until `renew_at` (none if it has passed).
pub fn renew_in(now: SystemTime, not_before: SystemTime, not_after: SystemTime) -> Duration {
    renew_at(not_before, not_after)
        .duration_since(now)
        .unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn a_day_long_certificate_is_renewed_after_sixteen_hours() {
        let start = SystemTime::UNIX_EPOCH + HOUR * 1000;
        assert_eq!(renew_at(start, start + HOUR * 24), start + HOUR * 16);
        assert_eq!(renew_in(start + HOUR, start, start + HOUR * 24), HOUR * 15);
    }

    #[test]
    fn a_certificate_past_its_renewal_or_upside_down_is_renewed_at_once() {
        let start = SystemTime::UNIX_EPOCH + HOUR * 1000;
        assert_eq!(
            renew_in(start + HOUR * 17, start, start + HOUR * 24),
            Duration::ZERO
        );
        assert_eq!(
            renew_in(start + HOUR * 30, start, start + HOUR * 24),
            Duration::ZERO
        );
        assert_eq!(renew_at(start, start - HOUR), start);
    }

    proptest! {
        #[test]
        fn renewal_comes_after_half_and_before_the_end(
            offset in 0u64..1_000_000_000, lifetime in 3u64..10_000_000
        ) {
            let start = SystemTime::UNIX_EPOCH + Duration::from_secs(offset);
            let end = start + Duration::from_secs(lifetime);
            let at = renew_at(start, end);
            prop_assert!(at > start + Duration::from_secs(lifetime) / 2);
            prop_assert!(at < end);
        }
    }
}
