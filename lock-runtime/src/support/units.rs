//! Durations in the whole units Redis and the logs count in.
//!
//! Both saturate at `u64::MAX` rather than fail: a duration past `u64` milliseconds (or
//! microseconds) is past every limit anyway, so the largest count says as much as the exact one.

use std::time::Duration;

/// The whole milliseconds in `duration` (Redis' unit), a fraction of a millisecond dropped;
/// `u64::MAX` past that.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The whole microseconds in `duration`, a fraction dropped; `u64::MAX` past that.
pub(crate) fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_units_drop_the_fraction_and_saturate() {
        assert_eq!(millis(Duration::from_micros(1500)), 1);
        assert_eq!(micros(Duration::from_nanos(1500)), 1);
        assert_eq!(millis(Duration::MAX), u64::MAX);
        assert_eq!(micros(Duration::MAX), u64::MAX);
    }
}
