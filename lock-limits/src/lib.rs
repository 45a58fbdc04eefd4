//! The limits on a lock's durations and kind (permits, read), shared by distlock's runtime (which refuses a value outside
//! them with `LockError::Config`) and by the `#[distributed_lock]` attribute (which refuses the same
//! value at compile time). Both crates depend on this one so that a limit is defined once and the
//! two can never disagree.
//!
//! Use it through the `distlock` crate; this crate has no dependencies so that the proc-macro
//! crate stays free of Redis and tokio.
//!
//! ```
//! use lock_limits::{check_timeout, check_ttl, Violation, MAX_DURATION_MILLIS};
//!
//! assert_eq!(check_ttl(60_000), Ok(()));
//! assert_eq!(check_ttl(0), Err(Violation::TooShort));
//! assert_eq!(check_timeout(0), Ok(()));
//! assert_eq!(check_ttl(MAX_DURATION_MILLIS + 1), Err(Violation::TooLong));
//! ```
#![no_std]
#![forbid(unsafe_code)]

/// The longest `ttl` or `timeout`, in milliseconds: 365 days. Past this a duration is almost
/// surely a unit mistake, and deadlines computed from it (`Instant + Duration`, Redis' `PX`) stay
/// far from overflowing.
///
/// ```
/// assert_eq!(lock_limits::MAX_DURATION_MILLIS, 365 * 24 * 3_600_000);
/// ```
pub const MAX_DURATION_MILLIS: u64 = 365 * 24 * 60 * 60 * 1000;

/// [`MAX_DURATION_MILLIS`] as people say it, for error messages.
///
/// ```
/// assert_eq!(lock_limits::MAX_DURATION_TEXT, "365 days");
/// ```
pub const MAX_DURATION_TEXT: &str = "365 days";

/// The shortest `ttl`, in milliseconds: Redis keeps expiries in whole milliseconds (`PX`), and a
/// lock that expires at once protects nothing.
///
/// ```
/// assert_eq!(lock_limits::MIN_TTL_MILLIS, 1);
/// ```
pub const MIN_TTL_MILLIS: u64 = 1;

/// The `ttl` of a lock when none is given, in milliseconds: 30 s. Here rather than only in the
/// runtime's `LockOptions::default`, because the attribute checks `hold_at_least` against the
/// ttl the lock will have, written or not.
///
/// ```
/// assert_eq!(lock_limits::DEFAULT_TTL_MILLIS, 30_000);
/// ```
pub const DEFAULT_TTL_MILLIS: u64 = 30_000;

/// How long an acquisition waits when no `timeout` is given, in milliseconds: 10 s. Beside the
/// default ttl so that the two defaults users read about are defined together.
///
/// ```
/// assert_eq!(lock_limits::DEFAULT_TIMEOUT_MILLIS, 10_000);
/// ```
pub const DEFAULT_TIMEOUT_MILLIS: u64 = 10_000;

/// Which limit a duration breaks.
///
/// ```
/// assert_eq!(lock_limits::check_ttl(0), Err(lock_limits::Violation::TooShort));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// Shorter than the minimum ([`MIN_TTL_MILLIS`] for a ttl).
    TooShort,
    /// Longer than [`MAX_DURATION_MILLIS`].
    TooLong,
}

/// Checks a ttl given in whole milliseconds: at least [`MIN_TTL_MILLIS`], at most
/// [`MAX_DURATION_MILLIS`].
///
/// ```
/// assert!(lock_limits::check_ttl(1).is_ok());
/// assert!(lock_limits::check_ttl(lock_limits::MAX_DURATION_MILLIS).is_ok());
/// ```
///
/// # Errors
///
/// The [`Violation`] the value commits.
pub const fn check_ttl(millis: u64) -> Result<(), Violation> {
    if millis < MIN_TTL_MILLIS {
        Err(Violation::TooShort)
    } else if millis > MAX_DURATION_MILLIS {
        Err(Violation::TooLong)
    } else {
        Ok(())
    }
}

/// Checks a timeout given in whole milliseconds: zero (a single attempt) up to
/// [`MAX_DURATION_MILLIS`].
///
/// ```
/// assert!(lock_limits::check_timeout(0).is_ok());
/// assert!(lock_limits::check_timeout(u64::MAX).is_err());
/// ```
///
/// # Errors
///
/// [`Violation::TooLong`] past the maximum.
pub const fn check_timeout(millis: u64) -> Result<(), Violation> {
    if millis > MAX_DURATION_MILLIS {
        Err(Violation::TooLong)
    } else {
        Ok(())
    }
}

/// The fewest permits a semaphore can have: one permit is the mutex.
///
/// ```
/// assert_eq!(lock_limits::MIN_PERMITS, 1);
/// ```
pub const MIN_PERMITS: u64 = 1;

/// The most permits a semaphore can have: `u32::MAX`, what `LockOptions::permits` takes.
///
/// ```
/// assert_eq!(lock_limits::MAX_PERMITS, u64::from(u32::MAX));
/// ```
pub const MAX_PERMITS: u64 = 4_294_967_295;

/// Why a lock's kind — its number of permits and whether it is taken to read — cannot be.
///
/// ```
/// assert_eq!(lock_limits::check_kind(0, false), Err(lock_limits::KindViolation::NoPermits));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KindViolation {
    /// Zero permits: a semaphore nobody can enter.
    NoPermits,
    /// More than [`MAX_PERMITS`].
    TooManyPermits,
    /// Permits and a read lock together: readers already share a name without a count, and a
    /// semaphore's holders are all alike, so the two cannot be one lock.
    PermitsWithRead,
    /// Several locks taken together (`acquire_all`, `keys = [..]`) as a semaphore or read lock:
    /// all-or-none is defined for mutexes (write locks) only.
    SeveralKeys,
}

/// Checks a lock's kind: `permits` at least [`MIN_PERMITS`] and at most [`MAX_PERMITS`], and more
/// than one permit only for a lock that is not taken to read (`read`).
///
/// ```
/// use lock_limits::{check_kind, KindViolation};
///
/// assert_eq!(check_kind(1, true), Ok(()));
/// assert_eq!(check_kind(5, false), Ok(()));
/// assert_eq!(check_kind(5, true), Err(KindViolation::PermitsWithRead));
/// ```
///
/// # Errors
///
/// The [`KindViolation`] the values commit.
pub const fn check_kind(permits: u64, read: bool) -> Result<(), KindViolation> {
    if permits < MIN_PERMITS {
        Err(KindViolation::NoPermits)
    } else if permits > MAX_PERMITS {
        Err(KindViolation::TooManyPermits)
    } else if permits > 1 && read {
        Err(KindViolation::PermitsWithRead)
    } else {
        Ok(())
    }
}

/// The fewest lock names taken together (`LockManager::acquire_all`, the attribute's
/// `keys = [..]`): one. An empty list would guard nothing, and is always a mistake in the
/// caller's code rather than a request to lock nothing.
///
/// ```
/// assert_eq!(lock_limits::MIN_KEYS, 1);
/// ```
pub const MIN_KEYS: usize = 1;

/// Checks how many lock names are taken together: at least [`MIN_KEYS`]. Repeated names
/// count once each time they appear here; the lock takes them once.
///
/// ```
/// assert!(lock_limits::check_key_count(2).is_ok());
/// assert_eq!(lock_limits::check_key_count(0), Err(lock_limits::Violation::TooShort));
/// ```
///
/// # Errors
///
/// [`Violation::TooShort`] for an empty list.
pub const fn check_key_count(count: usize) -> Result<(), Violation> {
    if count < MIN_KEYS {
        Err(Violation::TooShort)
    } else {
        Ok(())
    }
}

/// Checks the kind of several locks taken together: [`check_kind`]'s rule, and the mutex only
/// (one permit, not read), since all-or-none over semaphores or readers would hold some
/// permits of one name while waiting for another's.
///
/// ```
/// use lock_limits::{check_kind_of_several, KindViolation};
///
/// assert_eq!(check_kind_of_several(1, false), Ok(()));
/// assert_eq!(check_kind_of_several(3, false), Err(KindViolation::SeveralKeys));
/// assert_eq!(check_kind_of_several(1, true), Err(KindViolation::SeveralKeys));
/// ```
///
/// # Errors
///
/// The [`KindViolation`] the values commit.
pub const fn check_kind_of_several(permits: u64, read: bool) -> Result<(), KindViolation> {
    match check_kind(permits, read) {
        Err(violation) => Err(violation),
        Ok(()) if permits > 1 || read => Err(KindViolation::SeveralKeys),
        Ok(()) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_needs_a_permit_and_no_count_for_readers() {
        assert_eq!(check_kind(0, false), Err(KindViolation::NoPermits));
        assert_eq!(check_kind(0, true), Err(KindViolation::NoPermits));
        assert_eq!(check_kind(MAX_PERMITS, false), Ok(()));
        assert_eq!(
            check_kind(MAX_PERMITS + 1, false),
            Err(KindViolation::TooManyPermits)
        );
        assert_eq!(check_kind(2, true), Err(KindViolation::PermitsWithRead));
        assert_eq!(check_kind(1, true), Ok(()));
    }

    #[test]
    fn several_keys_are_mutexes_only() {
        assert_eq!(check_kind_of_several(1, false), Ok(()));
        assert_eq!(
            check_kind_of_several(2, false),
            Err(KindViolation::SeveralKeys)
        );
        assert_eq!(
            check_kind_of_several(1, true),
            Err(KindViolation::SeveralKeys)
        );
        assert_eq!(
            check_kind_of_several(0, false),
            Err(KindViolation::NoPermits)
        );
    }

    #[test]
    fn ttl_bounds_are_inclusive() {
        assert_eq!(check_ttl(0), Err(Violation::TooShort));
        assert_eq!(check_ttl(MIN_TTL_MILLIS), Ok(()));
        assert_eq!(check_ttl(MAX_DURATION_MILLIS), Ok(()));
        assert_eq!(check_ttl(MAX_DURATION_MILLIS + 1), Err(Violation::TooLong));
    }

    #[test]
    fn timeout_may_be_zero_but_not_past_the_maximum() {
        assert_eq!(check_timeout(0), Ok(()));
        assert_eq!(check_timeout(MAX_DURATION_MILLIS), Ok(()));
        assert_eq!(
            check_timeout(MAX_DURATION_MILLIS + 1),
            Err(Violation::TooLong)
        );
    }
}
