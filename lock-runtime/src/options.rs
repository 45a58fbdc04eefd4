//! [`LockOptions`]: how long a lock lives, how long to wait for it, and its extras; and the
//! [`Timeouts`] of a manager's connections.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::LockError;

use lock_limits::{Violation, MAX_DURATION_MILLIS, MAX_DURATION_TEXT};

/// The longest `ttl`, `timeout` or other duration setting accepted, as a `Duration`; the limit
/// itself lives in `lock_limits`, which the attribute checks at compile time too.
pub(crate) const MAX_DURATION: Duration = Duration::from_millis(MAX_DURATION_MILLIS);

// Beside the connections they bound, which lie below the options.
pub(crate) use crate::redis::connection::Timeouts;

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
    hold_at_least: Option<Duration>,
    label: Option<Label>,
    /// How many may hold the lock at once: 1 is the mutex.
    permits: u32,
    mode: LockMode,
}

/// How a read-write lock is taken (see [`LockOptions::mode`]): to read, sharing it with other
/// readers, or to write, alone. A lock taken without a mode is taken to write: the mutex.
///
/// ```
/// use distlock::{LockMode, LockOptions};
///
/// let readers = LockOptions::new().mode(LockMode::Read);
/// assert_eq!(readers.lock_mode(), LockMode::Read);
/// assert_eq!(LockOptions::new().lock_mode(), LockMode::Write);
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LockMode {
    /// Shared with every other reader; excludes writers.
    Read,
    /// Alone: excludes readers and other writers. The mutex.
    #[default]
    Write,
}

/// A label as given, and as it is written into the lock's value (cut and escaped once, here).
#[derive(Clone, PartialEq, Eq)]
struct Label {
    text: Arc<str>,
    encoded: Arc<str>,
}

impl fmt::Debug for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.text, f)
    }
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_millis(lock_limits::DEFAULT_TTL_MILLIS),
            timeout: Duration::from_millis(lock_limits::DEFAULT_TIMEOUT_MILLIS),
            auto_extend: false,
            fencing: false,
            hold_at_least: None,
            label: None,
            permits: 1,
            mode: LockMode::Write,
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

    /// Keep the lock at least until `hold` after it was acquired, even when it is released
    /// sooner: a release before then does not delete the lock but leaves it to expire then
    /// (still only if it is ours), and a waiter gets it when it expires. At most the ttl;
    /// zero turns it off.
    ///
    /// For a job that every node of a fleet starts on its own clock at "the same" time: the
    /// first node to start runs it, and a node whose clock runs behind by less than `hold`
    /// finds the lock still held instead of running the job a second time. The hold is
    /// measured on the acquiring process's monotonic clock from when Redis answered, so it is
    /// never shorter than asked, whatever the wall clocks say.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let options = distlock::LockOptions::new()
    ///     .ttl(Duration::from_secs(60))
    ///     .hold_at_least(Duration::from_secs(10));
    /// assert_eq!(options.hold_at_least_duration(), Some(Duration::from_secs(10)));
    /// ```
    #[must_use]
    pub fn hold_at_least(mut self, hold: Duration) -> Self {
        self.hold_at_least = (!hold.is_zero()).then_some(hold);
        self
    }

    /// Who takes the lock, for people and dashboards: recorded with the holder (see
    /// [`LockManager::inspect`](crate::LockManager::inspect)) and the label of its metrics.
    /// `#[distributed_lock]` sets the function's path and the key template, e.g.
    /// `my_app::jobs::process_trace trace:{trace_id}`; without one, inspection shows the lock's
    /// name and metrics show `unlabelled`. Keep it free of ids: a label per trace id would make
    /// one time series per trace. Stored in the lock's value, so it costs no command; cut to
    /// 200 bytes.
    ///
    /// ```
    /// let options = distlock::LockOptions::new().label("billing::charge invoice:{id}");
    /// assert_eq!(options.label_text(), Some("billing::charge invoice:{id}"));
    /// ```
    #[must_use]
    pub fn label(mut self, label: impl Into<String>) -> Self {
        let text: String = label.into();
        // Cut once, here, so that the value, the metrics and `label_text` all carry one label.
        let text = crate::support::identity::bounded(&text, crate::support::identity::MAX_LABEL);
        self.label = Some(Label {
            encoded: crate::support::identity::encode_label(text),
            text: Arc::from(text),
        });
        self
    }

    /// The label set with [`LockOptions::label`], if any.
    ///
    /// ```
    /// assert_eq!(distlock::LockOptions::new().label_text(), None);
    /// ```
    #[must_use]
    pub fn label_text(&self) -> Option<&str> {
        self.label.as_ref().map(|label| &*label.text)
    }

    /// Make the lock a semaphore of `permits` permits: at most that many holders at once, each
    /// holding a permit as a lock of its own — with the ttl, [`extend`](crate::LockGuard::extend),
    /// `auto_extend`, a fencing token of its own (from the name's one counter, so tokens are
    /// strictly increasing per name across permits, not per permit), released on every path and
    /// given back at its ttl when its holder dies. Waiters for a permit wait in one line, first
    /// come, first served, and a release hands its permit straight to the next. One permit (the
    /// default) is the mutex, with exactly its keys and commands.
    ///
    /// Every caller of a name must give the same number: one that asks for another number gets
    /// [`LockError::Config`] naming both, and from then on nobody gets in beyond the smaller of
    /// the two until the last permit is given back. A name used as a mutex by one caller and as
    /// a semaphore by another is a `Config` error too. Zero permits are refused with
    /// `Config` at acquisition, and so is a semaphore on a Redlock manager (each master could
    /// admit n holders, and holders need only a majority: more than n would get in), and a
    /// semaphore taken to read ([`LockOptions::mode`]).
    ///
    /// ```
    /// let options = distlock::LockOptions::new().permits(5);
    /// assert_eq!(options.permits_count(), 5);
    /// assert_eq!(distlock::LockOptions::new().permits_count(), 1);
    /// ```
    #[must_use]
    pub fn permits(mut self, permits: u32) -> Self {
        self.permits = permits;
        self
    }

    /// Take a read-write lock to read ([`LockMode::Read`]: shared with every other reader, no
    /// writer meanwhile) or to write ([`LockMode::Write`], the default: alone — the mutex).
    ///
    /// The line is fair: a writer in line is never overtaken by a reader that came after it (no
    /// writer starvation), and the readers at the head of the line are let in together. A task
    /// that holds the read lock and asks for the write lock of the same name would wait for
    /// itself: it gets [`LockError::Config`] at once (no upgrade). The same or a weaker mode
    /// re-enters (see [`LockManager::acquire`](crate::LockManager::acquire)). Not on Redlock,
    /// whose masters keep no common line: `Config` there.
    ///
    /// ```
    /// use distlock::{LockMode, LockOptions};
    ///
    /// let options = LockOptions::new().mode(LockMode::Read);
    /// assert_eq!(options.lock_mode(), LockMode::Read);
    /// ```
    #[must_use]
    pub fn mode(mut self, mode: LockMode) -> Self {
        self.mode = mode;
        self
    }

    /// The number of permits set with [`LockOptions::permits`] (1: the mutex).
    ///
    /// ```
    /// assert_eq!(distlock::LockOptions::new().permits_count(), 1);
    /// ```
    #[must_use]
    pub fn permits_count(&self) -> u32 {
        self.permits
    }

    /// The mode set with [`LockOptions::mode`] ([`LockMode::Write`] unless set).
    ///
    /// ```
    /// assert_eq!(distlock::LockOptions::new().lock_mode(), distlock::LockMode::Write);
    /// ```
    #[must_use]
    pub fn lock_mode(&self) -> LockMode {
        self.mode
    }

    /// The label as written into the lock's value.
    pub(crate) fn encoded_label(&self) -> Option<&str> {
        self.label.as_ref().map(|label| &*label.encoded)
    }

    /// The label shared, for metrics and lock-order checks kept past the options' life.
    pub(crate) fn shared_label(&self) -> Option<Arc<str>> {
        self.label.as_ref().map(|label| Arc::clone(&label.text))
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

    /// The configured minimum hold, if any (see [`LockOptions::hold_at_least`]).
    ///
    /// ```
    /// assert_eq!(distlock::LockOptions::new().hold_at_least_duration(), None);
    /// ```
    #[must_use]
    pub fn hold_at_least_duration(&self) -> Option<Duration> {
        self.hold_at_least
    }

    /// Checks every setting, so that a bad value is a `Config` error before any Redis call;
    /// returns the ttl in whole milliseconds.
    pub(crate) fn validate(&self) -> Result<u64, LockError> {
        let ttl_millis = ttl_millis(self.ttl)?;
        if lock_limits::check_timeout(whole_millis(self.timeout)).is_err() {
            return Err(LockError::config(format!(
                "timeout {:?} is longer than the maximum of {MAX_DURATION_TEXT}; use a shorter \
                 timeout",
                self.timeout
            )));
        }
        if let Some(hold) = self.hold_at_least {
            if hold > self.ttl {
                return Err(LockError::config(format!(
                    "hold_at_least {hold:?} is longer than the ttl {:?}: the lock would expire \
                     before the hold ends; use a hold_at_least of at most the ttl, or a longer ttl",
                    self.ttl
                )));
            }
        }
        if let Err(violation) =
            lock_limits::check_kind(u64::from(self.permits), self.mode == LockMode::Read)
        {
            return Err(LockError::config(kind_message(violation)));
        }
        Ok(ttl_millis)
    }
}

/// What a [`lock_limits::KindViolation`] means to the caller of [`LockOptions`].
pub(crate) fn kind_message(violation: lock_limits::KindViolation) -> &'static str {
    match violation {
        lock_limits::KindViolation::NoPermits => {
            "permits(0): a semaphore of no permits can never be taken; use permits(1) for a \
             mutex, or the number of holders allowed at once"
        }
        lock_limits::KindViolation::TooManyPermits => {
            "more permits than a u32 holds; use at most u32::MAX"
        }
        lock_limits::KindViolation::PermitsWithRead => {
            "permits(n > 1) with mode(LockMode::Read): readers already share the lock without a \
             count; pick one — permits(n) for at most n holders, or mode(LockMode::Read) for \
             readers and writers"
        }
        lock_limits::KindViolation::SeveralKeys => {
            "acquire_all with permits(n > 1) or mode(LockMode::Read): several keys are taken \
             all or none as mutexes only; leave permits and mode out of these options, or take \
             the semaphore or read lock with acquire"
        }
    }
}

/// A ttl in whole milliseconds (what `PX` and `PEXPIRE` take), or a `Config` error that says
/// what range is accepted.
pub(crate) fn ttl_millis(ttl: Duration) -> Result<u64, LockError> {
    let millis = whole_millis(ttl);
    match lock_limits::check_ttl(millis) {
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

/// The whole milliseconds in `duration` (Redis' unit), a fraction of a millisecond dropped —
/// except past the limit, where a fraction counts too (`u64::MAX`, past every limit), so that
/// the limit holds for every `Duration`, not only for whole milliseconds.
fn whole_millis(duration: Duration) -> u64 {
    if duration > MAX_DURATION {
        return u64::MAX;
    }
    crate::support::units::millis(duration)
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
    fn hold_at_least_must_fit_in_the_ttl() {
        let ttl = Duration::from_secs(5);
        let options = LockOptions::new().ttl(ttl);
        assert!(options.clone().hold_at_least(ttl).validate().is_ok());
        let error = options
            .clone()
            .hold_at_least(ttl + Duration::from_millis(1))
            .validate()
            .unwrap_err();
        assert!(
            matches!(&error, LockError::Config(message) if message.contains("at most the ttl")),
            "{error}"
        );
        assert_eq!(
            options
                .hold_at_least(Duration::ZERO)
                .hold_at_least_duration(),
            None
        );
    }

    #[test]
    fn zero_permits_and_permits_with_readers_are_config_errors() {
        for (options, says) in [
            (LockOptions::new().permits(0), "permits(0)"),
            (
                LockOptions::new().permits(3).mode(LockMode::Read),
                "pick one",
            ),
        ] {
            let error = options.validate().unwrap_err();
            assert!(
                matches!(&error, LockError::Config(message) if message.contains(says)),
                "{error}"
            );
        }
        assert!(LockOptions::new().permits(3).validate().is_ok());
        assert!(LockOptions::new().mode(LockMode::Read).validate().is_ok());
    }

    #[test]
    fn ttl_is_rounded_down_to_whole_milliseconds() {
        assert_eq!(ttl_millis(Duration::from_micros(1500)).unwrap(), 1);
        assert_eq!(ttl_millis(Duration::from_secs(60)).unwrap(), 60_000);
    }

    #[test]
    fn a_fraction_of_a_millisecond_past_the_limit_is_past_it() {
        assert!(ttl_millis(MAX_DURATION).is_ok());
        assert!(ttl_millis(MAX_DURATION + Duration::from_nanos(1)).is_err());
        let timeout = MAX_DURATION + Duration::from_nanos(1);
        assert!(LockOptions::new().timeout(timeout).validate().is_err());
    }
}
