//! The waiting protocol of one acquisition, as a state machine that does no I/O.
//!
//! ```text
//!              held, not subscribed            subscribed (or not: then it polls)
//!  FirstTry ────────────────────────▶ Subscribe ───────────────────────────▶ InLine ◀─┐
//!     │  free: Acquired                                                      │  │ wake │
//!     ▼                                                                      │  └──────┘
//!  Acquired ◀──── a hand-off message, or an attempt that finds the lock ours ┘
//!                 (free and first in line, or handed over while not listening)
//!  TimedOut ◀──── an attempt at or after the deadline that finds it held
//! ```
//!
//! - **`FirstTry`**: a plain `SET NX PX` (or the acquire script, with fencing). Free: done.
//!   Skipped for a key this manager saw handed over a moment ago ([`Acquisition::start_in_line`]):
//!   it starts at Subscribe, and its join takes the lock if it is free.
//! - **Subscribe**: held; before taking a place in line, listen where a release will tell
//!   (this manager's channel, on Redlock too), so that a hand-off or a wake-up
//!   published right after the place is taken is not missed.
//! - **`InLine`**: the attempt takes (then renews) a place in line and reports the holder's
//!   remaining ttl (on Redlock, a place in the wake list of each master that finds it held).
//!   The waiter then sleeps until the first of: a message (a hand-off: done; a wake-up on
//!   Redlock: look again), its place's renewal ([`crate::backend::RENEW`]), the
//!   holder's expiry (a holder that died releases nothing), or the deadline — and looks again.
//! - Errors from Redis are retried with backoff until the deadline, under a new token (the
//!   failed attempt may still run, and is cleaned up by its own token), so the waiter
//!   subscribes again for it. Except an attempt in line whose connection dropped
//!   ([`Outcome::Interrupted`]): the waiter keeps its token and its place, and its next look,
//!   a renewal, finds whatever the interrupted one did.
//!
//! The manager drives it: it asks [`Acquisition::start`] for the first [`Step`], performs it,
//! and feeds what happened back in.

use std::time::Duration;

use tokio::time::Instant;

use crate::support::retry::Backoff;

/// How long a waiter that could not subscribe waits at most before looking again: without a
/// message, a release costs it up to this much.
pub(crate) const UNSUBSCRIBED_POLL: Duration = Duration::from_millis(200);
/// Spread of the looks of waiters that wake at the same moment (a ttl running out).
const EXPIRY_JITTER: Duration = Duration::from_millis(2);
/// Backoff after a Redis error while acquiring.
const ERROR_BACKOFF: Backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(500));

/// One acquisition's progress.
#[derive(Debug)]
pub(crate) struct Acquisition {
    deadline: Instant,
    phase: Phase,
    subscription: Subscription,
    /// How often a place in line (or in Redlock's wake lists) must be renewed; `None` where
    /// places do not expire.
    renew: Option<Duration>,
    errors: Backoff,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    FirstTry,
    InLine,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subscription {
    NotYet,
    Listening,
    /// The subscription failed: the waiter looks again on a short timer instead.
    Polling,
}

/// What an attempt to take the lock sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// The cheapest try: a plain `SET NX PX`.
    FirstTry,
    /// Take or renew a place in line, telling where to send the hand-off.
    InLine,
}

/// What the manager does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Send an attempt.
    Attempt(Request),
    /// Start listening for hand-offs or releases, then report with [`Acquisition::subscribed`].
    Subscribe,
    /// Sleep until `until` plus a random part of `spread`, or until a message; then report with
    /// [`Acquisition::woke`] (a hand-off message completes the acquisition instead).
    Sleep { until: Instant, spread: Duration },
    /// The lock is ours.
    Acquired,
    /// The deadline passed with the lock held by someone else.
    TimedOut,
    /// Give up with the error the last attempt returned.
    Failed,
}

/// What an attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Acquired,
    /// Held by someone else, for at most `remaining` (`None`: unknown).
    Held {
        remaining: Option<Duration>,
    },
    /// Redis failed; `permanent` when retrying cannot help (a permission, a wrong type).
    Failed {
        permanent: bool,
    },
    /// An attempt in line failed because its connection dropped, and the waiter keeps its
    /// token and its place (see `Backend::keeps_place_through`): retried as a look in line.
    Interrupted,
}

impl Acquisition {
    /// An acquisition that waits until `deadline`, renewing its place in line every `renew`.
    pub(crate) fn new(deadline: Instant, renew: Option<Duration>) -> Self {
        Acquisition {
            deadline,
            phase: Phase::FirstTry,
            subscription: Subscription::NotYet,
            renew,
            errors: ERROR_BACKOFF,
        }
    }

    // A method like every other transition: each step of the protocol, the first one too, comes
    // from the machine.
    #[allow(clippy::unused_self)]
    pub(crate) fn start(&self) -> Step {
        Step::Attempt(Request::FirstTry)
    }

    /// The first step of an acquisition of a key known to be contended (this manager saw it
    /// handed over a moment ago): no first try, which would most likely find it held, but a
    /// place in line at once — after subscribing, so that the hand-off message is not missed.
    /// The attempt that takes the place also takes the lock when it is free and nobody waits.
    pub(crate) fn start_in_line(&self) -> Step {
        debug_assert_eq!(self.subscription, Subscription::NotYet);
        Step::Subscribe
    }

    /// Whether the waiter may hold a place in line.
    #[cfg(test)]
    fn in_line(&self) -> bool {
        self.phase == Phase::InLine
    }

    /// Whether the waiter listens for messages (a failed subscription polls instead).
    pub(crate) fn listening(&self) -> bool {
        self.subscription == Subscription::Listening
    }

    /// An attempt sent came back with `outcome` at `now`.
    pub(crate) fn attempted(&mut self, now: Instant, outcome: Outcome) -> Step {
        match outcome {
            Outcome::Acquired => Step::Acquired,
            Outcome::Failed { permanent: true } => Step::Failed,
            Outcome::Failed { permanent: false } | Outcome::Interrupted if now >= self.deadline => {
                Step::Failed
            }
            Outcome::Failed { permanent: false } => {
                // A new token, so a new registration for its messages; and a new place in line.
                self.subscription = Subscription::NotYet;
                self.phase = Phase::FirstTry;
                Step::Sleep {
                    until: (now + self.errors.next_pause()).min(self.deadline),
                    spread: Duration::ZERO,
                }
            }
            Outcome::Interrupted => Step::Sleep {
                until: (now + self.errors.next_pause()).min(self.deadline),
                spread: Duration::ZERO,
            },
            Outcome::Held { .. } if now >= self.deadline => Step::TimedOut,
            Outcome::Held { remaining } => {
                self.errors.reset();
                if self.subscription == Subscription::NotYet {
                    return Step::Subscribe;
                }
                self.phase = Phase::InLine;
                // A holder that dies releases nothing: look again when its ttl runs out.
                let mut until = now + remaining.unwrap_or(UNSUBSCRIBED_POLL);
                let mut spread = EXPIRY_JITTER;
                if let Some(renew) = self.renew {
                    if now + renew < until {
                        until = now + renew;
                        spread = Duration::ZERO;
                    }
                }
                if self.subscription == Subscription::Polling {
                    until = until.min(now + UNSUBSCRIBED_POLL);
                }
                Step::Sleep {
                    until: until.min(self.deadline),
                    spread,
                }
            }
        }
    }

    /// The subscription asked for by [`Step::Subscribe`] succeeded or failed.
    pub(crate) fn subscribed(&mut self, listening: bool) -> Step {
        self.subscription = if listening {
            Subscription::Listening
        } else {
            Subscription::Polling
        };
        self.phase = Phase::InLine;
        Step::Attempt(Request::InLine)
    }

    /// A sleep ended without a hand-off: its timer, a wake-up message (Redlock), or a lost
    /// connection. Look again — also at the deadline: one last look may still find it free.
    pub(crate) fn woke(&mut self) -> Step {
        match (self.phase, self.subscription) {
            (_, Subscription::NotYet) => Step::Attempt(Request::FirstTry),
            _ => Step::Attempt(Request::InLine),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RENEW: Duration = Duration::from_secs(1);

    fn held(ms: u64) -> Outcome {
        Outcome::Held {
            remaining: Some(Duration::from_millis(ms)),
        }
    }

    fn in_line(now: Instant) -> Acquisition {
        let mut acquisition = Acquisition::new(now + Duration::from_secs(10), Some(RENEW));
        assert_eq!(acquisition.attempted(now, held(5000)), Step::Subscribe);
        assert_eq!(acquisition.subscribed(true), Step::Attempt(Request::InLine));
        acquisition
    }

    #[test]
    fn a_free_lock_is_taken_by_the_first_try() {
        let now = Instant::now();
        let mut acquisition = Acquisition::new(now + Duration::from_secs(1), Some(RENEW));
        assert_eq!(acquisition.start(), Step::Attempt(Request::FirstTry));
        assert_eq!(
            acquisition.attempted(now, Outcome::Acquired),
            Step::Acquired
        );
        assert!(!acquisition.in_line());
    }

    #[test]
    fn a_contended_key_skips_the_first_try_and_joins_once_subscribed() {
        let now = Instant::now();
        let mut acquisition = Acquisition::new(now + Duration::from_secs(10), Some(RENEW));
        assert_eq!(acquisition.start_in_line(), Step::Subscribe);
        assert_eq!(acquisition.subscribed(true), Step::Attempt(Request::InLine));
        assert_eq!(
            acquisition.attempted(now, Outcome::Acquired),
            Step::Acquired,
            "the join takes a free lock"
        );
    }

    #[test]
    fn a_held_lock_subscribes_then_takes_a_place_in_line() {
        let now = Instant::now();
        let mut acquisition = in_line(now);
        assert!(acquisition.in_line() && acquisition.listening());
        // In line: sleep until the place must be renewed, the holder's 5 s being further off.
        assert_eq!(
            acquisition.attempted(now, held(5000)),
            Step::Sleep {
                until: now + RENEW,
                spread: Duration::ZERO
            }
        );
        assert_eq!(acquisition.woke(), Step::Attempt(Request::InLine));
    }

    #[test]
    fn a_holder_about_to_expire_is_looked_at_when_it_does_with_jitter() {
        let now = Instant::now();
        let mut acquisition = in_line(now);
        assert_eq!(
            acquisition.attempted(now, held(300)),
            Step::Sleep {
                until: now + Duration::from_millis(300),
                spread: EXPIRY_JITTER
            }
        );
    }

    #[test]
    fn without_a_subscription_it_polls() {
        let now = Instant::now();
        let mut acquisition = Acquisition::new(now + Duration::from_secs(10), Some(RENEW));
        assert_eq!(acquisition.attempted(now, held(5000)), Step::Subscribe);
        assert_eq!(
            acquisition.subscribed(false),
            Step::Attempt(Request::InLine)
        );
        assert!(!acquisition.listening());
        let Step::Sleep { until, .. } = acquisition.attempted(now, held(5000)) else {
            panic!("a held lock is waited for");
        };
        assert_eq!(until, now + UNSUBSCRIBED_POLL);
    }

    #[test]
    fn sleeps_end_at_the_deadline_and_a_held_lock_then_times_out() {
        let now = Instant::now();
        let deadline = now + Duration::from_millis(100);
        let mut acquisition = Acquisition::new(deadline, Some(RENEW));
        assert_eq!(acquisition.attempted(now, held(5000)), Step::Subscribe);
        acquisition.subscribed(true);
        assert_eq!(
            acquisition.attempted(now, held(5000)),
            Step::Sleep {
                until: deadline,
                spread: Duration::ZERO
            }
        );
        // The last look at the deadline finds it held.
        assert_eq!(acquisition.woke(), Step::Attempt(Request::InLine));
        assert_eq!(acquisition.attempted(deadline, held(4900)), Step::TimedOut);
    }

    #[test]
    fn a_zero_timeout_is_one_attempt() {
        let now = Instant::now();
        let mut acquisition = Acquisition::new(now, Some(RENEW));
        assert_eq!(acquisition.attempted(now, held(5000)), Step::TimedOut);
        assert!(!acquisition.in_line(), "it never took a place in line");
    }

    #[test]
    fn errors_back_off_then_start_over_under_a_new_registration() {
        let now = Instant::now();
        let mut acquisition = in_line(now);
        let transient = Outcome::Failed { permanent: false };
        let Step::Sleep { until, .. } = acquisition.attempted(now, transient) else {
            panic!("a transient error is retried");
        };
        assert!(until > now && until <= now + Duration::from_millis(15));
        assert!(!acquisition.in_line());
        assert_eq!(acquisition.woke(), Step::Attempt(Request::FirstTry));
        assert_eq!(acquisition.attempted(now, held(100)), Step::Subscribe);
    }

    #[test]
    fn a_waiter_interrupted_in_line_keeps_its_place_and_looks_again() {
        let now = Instant::now();
        let mut acquisition = in_line(now);
        let Step::Sleep { until, .. } = acquisition.attempted(now, Outcome::Interrupted) else {
            panic!("an interrupted look is retried");
        };
        assert!(until > now && until <= now + Duration::from_millis(15));
        assert!(acquisition.in_line());
        assert_eq!(acquisition.woke(), Step::Attempt(Request::InLine));
        let late = now + Duration::from_secs(10);
        assert_eq!(
            acquisition.attempted(late, Outcome::Interrupted),
            Step::Failed
        );
    }

    #[test]
    fn permanent_errors_and_errors_at_the_deadline_fail() {
        let now = Instant::now();
        let mut acquisition = Acquisition::new(now + Duration::from_secs(1), Some(RENEW));
        assert_eq!(
            acquisition.attempted(now, Outcome::Failed { permanent: true }),
            Step::Failed
        );
        let mut late = Acquisition::new(now, Some(RENEW));
        assert_eq!(
            late.attempted(now, Outcome::Failed { permanent: false }),
            Step::Failed
        );
    }

    #[test]
    fn without_renewal_a_waiter_sleeps_until_the_holder_expires() {
        let now = Instant::now();
        let mut acquisition = Acquisition::new(now + Duration::from_secs(60), None);
        acquisition.attempted(now, held(5000));
        acquisition.subscribed(true);
        let Step::Sleep { until, .. } = acquisition.attempted(now, held(5000)) else {
            panic!("a held lock is waited for");
        };
        assert_eq!(until, now + Duration::from_secs(5));
    }
}
