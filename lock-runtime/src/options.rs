//! [`LockOptions`]: how long a lock lives, how long to wait for it, and its extras.

use std::time::Duration;

use crate::LockError;

use lock_limits::{Violation, MAX_DURATION_MILLIS, MAX_DURATION_TEXT};

/// The longest `ttl`, `timeout` or other duration setting accepted, as a `Duration`; the limit
/// itself lives in `lock_limits`, which the attribute checks at compile time too.
pub(crate) const MAX_DURATION: Duration = Duration::from_millis(MAX_DURATION_MILLIS);

/// How to take one lock: its ttl, how long to wait, auto-extension and fencing.
///
/// The defaults: ttl 30 s, timeout 10 s, no auto-extension, no fencing.
///
/// ```
/// use distlock::LockOptions;
/// use std::time::Duration;
///
/// let options = LockOptions::new()
///     .ttl(Duration::from_secs(60))
///     .timeout(Duration::from_millis(500))
///     .auto_extend(true)
///     .fencing(true);
/// assert_eq!(options.ttl_duration(), Duration::from_secs(60));
/// assert_eq!(LockOptions::default().timeout_duration(), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockOptions {
    ttl: Duration,
    timeout: Duration,
    auto_extend: bool,
    fencing: bool,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
            auto_extend: false,
            fencing: false,
        }
    }
}

impl LockOptions {
    /// The defaults: ttl 30 s, timeout 10 s, no auto-extension, no fencing.
    ///
    /// ```
    /// assert_eq!(distlock::LockOptions::new(), distlock::LockOptions::default());
    /// ```
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// How long the lock lives in Redis unless released or extended first (at least 1 ms,
    /// whole milliseconds; at most 365 days).
    ///
    /// ```
    /// let options = distlock::LockOptions::new().ttl(std::time::Duration::from_secs(5));
    /// assert_eq!(options.ttl_duration().as_secs(), 5);
    /// ```
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long [`LockManager::acquire`](crate::LockManager::acquire) waits for a lock held by
    /// someone else; zero means a single attempt.
    ///
    /// ```
    /// let options = distlock::LockOptions::new().timeout(std::time::Duration::ZERO);
    /// assert!(options.timeout_duration().is_zero());
    /// ```
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Keep the lock alive while it is held: a watchdog extends it to the full ttl every ttl/3,
    /// and marks the guard lost (see [`LockGuard::lost`](crate::LockGuard::lost)) when an
    /// extension finds the lock gone or Redis cannot be reached before the lock would expire.
    ///
    /// ```
    /// assert!(distlock::LockOptions::new().auto_extend(true).auto_extend_enabled());
    /// ```
    #[must_use]
    pub fn auto_extend(mut self, enabled: bool) -> Self {
        self.auto_extend = enabled;
        self
    }

    /// Also issue a fencing token: a number that strictly increases with every acquisition of
    /// the same key, by any client, readable as [`LockGuard::fencing_token`](crate::LockGuard::fencing_token).
    ///
    /// ```
    /// assert!(distlock::LockOptions::new().fencing(true).fencing_enabled());
    /// ```
    #[must_use]
    pub fn fencing(mut self, enabled: bool) -> Self {
        self.fencing = enabled;
        self
    }

    /// The configured ttl.
    ///
    /// ```
    /// assert_eq!(distlock::LockOptions::new().ttl_duration().as_secs(), 30);
    /// ```
    #[must_use]
    pub fn ttl_duration(&self) -> Duration {
        self.ttl
    }

    /// The configured timeout.
    ///
    /// ```
    /// assert_eq!(distlock::LockOptions::new().timeout_duration().as_secs(), 10);
    /// ```
    #[must_use]
    pub fn timeout_duration(&self) -> Duration {
        self.timeout
    }

    /// Whether auto-extension is on.
    ///
    /// ```
    /// assert!(!distlock::LockOptions::new().auto_extend_enabled());
    /// ```
    #[must_use]
    pub fn auto_extend_enabled(&self) -> bool {
        self.auto_extend
    }

    /// Whether fencing tokens are issued.
    ///
    /// ```
    /// assert!(!distlock::LockOptions::new().fencing_enabled());
    /// ```
    #[must_use]
    pub fn fencing_enabled(&self) -> bool {
        self.fencing
    }

    /// Checks every setting, so that a bad value is a `Config` error before any Redis call;
    /// returns the ttl in whole milliseconds.
    pub(crate) fn validate(&self) -> Result<u64, LockError> {
        let ttl_millis = ttl_millis(self.ttl)?;
        if lock_limits::check_timeout(millis_rounded_up(self.timeout)).is_err() {
            return Err(LockError::config(format!(
                "timeout {:?} is longer than the maximum of {MAX_DURATION_TEXT}; use a shorter \
                 timeout",
                self.timeout
            )));
        }
        Ok(ttl_millis)
    }
}

/// A ttl in whole milliseconds (what `PX` and `PEXPIRE` take), or a `Config` error that says
/// what range is accepted.
pub(crate) fn ttl_millis(ttl: Duration) -> Result<u64, LockError> {
    let millis = whole_millis(ttl);
    // Past the maximum by a fraction of a millisecond is past it: rounding down would accept a
    // ttl the documentation says is refused.
    let checked =
        lock_limits::check_ttl(millis_rounded_up(ttl)).and(lock_limits::check_ttl(millis));
    match checked {
        Ok(()) => Ok(millis),
        Err(Violation::TooLong) => Err(LockError::config(format!(
            "ttl {ttl:?} is longer than the maximum of {MAX_DURATION_TEXT}; use a shorter ttl \
             and `auto_extend` for long work"
        ))),
        Err(Violation::TooShort) => Err(LockError::config(format!(
            "ttl {ttl:?} is shorter than 1 ms, the smallest expiry Redis can keep; use a ttl \
             of at least 1 ms"
        ))),
    }
}

/// The whole milliseconds in `duration` (Redis' unit), saturating: a fraction of a millisecond
/// is dropped, and anything past `u64::MAX` ms is past every limit anyway.
fn whole_millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The milliseconds in `duration` with any fraction counted as a whole one, saturating: what a
/// maximum is compared with.
fn millis_rounded_up(duration: Duration) -> u64 {
    let fraction = u64::from(!duration.subsec_nanos().is_multiple_of(1_000_000));
    whole_millis(duration).saturating_add(fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_enormous_ttls_are_config_errors() {
        for ttl in [Duration::ZERO, Duration::from_micros(999), Duration::MAX] {
            let error = LockOptions::new().ttl(ttl).validate().unwrap_err();
            assert!(matches!(error, LockError::Config(_)), "{ttl:?}: {error}");
        }
        assert!(LockOptions::new()
            .timeout(Duration::MAX)
            .validate()
            .is_err());
    }

    #[test]
    fn the_limits_are_inclusive() {
        let max = Duration::from_millis(MAX_DURATION_MILLIS);
        assert!(LockOptions::new().ttl(max).timeout(max).validate().is_ok());
        for over in [
            max + Duration::from_millis(1),
            max + Duration::from_nanos(1),
        ] {
            assert!(LockOptions::new().ttl(over).validate().is_err());
            assert!(LockOptions::new().timeout(over).validate().is_err());
        }
        assert!(LockOptions::new()
            .timeout(Duration::ZERO)
            .validate()
            .is_ok());
    }

    #[test]
    fn ttl_is_rounded_down_to_whole_milliseconds() {
        assert_eq!(ttl_millis(Duration::from_micros(1500)).unwrap(), 1);
        assert_eq!(ttl_millis(Duration::from_secs(60)).unwrap(), 60_000);
    }
}
