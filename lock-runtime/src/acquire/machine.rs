//! The waiting protocol of one acquisition, as a state machine that does no I/O and reads no
//! clock: every decision of an acquisition is made here, from what the driver
//! (`manager::driver`) reports and the time it passes in.
//!
//! ```text
//!              held, not subscribed            subscribed (or not: then it polls)
//!  FirstTry ────────────────────────▶ Subscribe ───────────────────────────▶ InLine ◀─┐
//!     │  free: Acquired                                                      │  │ wake │
//!     ▼                                                                      │  └──────┘
//!  Acquired ◀──── a trusted hand-off message (confirmed first with           ┘
//!                 `wait_for_replicas`), or an attempt that finds the lock ours
//!  TimedOut ◀──── an attempt at or after the deadline that finds it held
//! ```
//!
//! - **`FirstTry`**: a plain `SET NX PX` (or the acquire script, with fencing). Free: done.
//!   Skipped for a key this manager saw handed over a moment ago ([`Acquisition::start`] with
//!   `contended`): it starts at Subscribe, and its join takes the lock if it is free.
//! - **Subscribe**: held; before taking a place in line, listen where a release will tell
//!   (this manager's channel, on Redlock too), so that a hand-off or a wake-up
//!   published right after the place is taken is not missed.
//! - **`InLine`**: the attempt takes (then renews) a place in line and reports the holder's
//!   remaining ttl (on Redlock, a place in the wake list of each master that finds it held).
//!   The place names the manager's channel only while it is subscribed ([`Acquisition::request`]).
//!   The waiter then sleeps until the first of: a message, its place's renewal
//!   ([`crate::backend::RENEW`]), the holder's expiry (a holder that died releases nothing), or
//!   the deadline — and looks again.
//! - **A hand-off message** is trusted without asking Redis only while the claim it announces
//!   is well ahead ([`GRANT_MARGIN`]), counted from the send time of the attempt that took the
//!   place ([`Acquisition::woke`]); a message read after a later look found the lock held, or
//!   read too late, makes the waiter look again instead.
//! - Errors from Redis are retried with backoff until the deadline, under a new token
//!   ([`Step::NewToken`]: the failed attempt may still run, and is cleaned up by its own
//!   token), so the waiter subscribes again for it. Except an attempt in line whose connection
//!   dropped ([`Outcome::Interrupted`]): the waiter keeps its token and its place, and its next
//!   look, a renewal, finds whatever the interrupted one did. A hand-off given back because
//!   too few replicas acknowledged it ([`Confirmation::GivenBack`]) goes on under a new token
//!   too: a token that gave its lock back never holds it again.
//!
//! The driver asks [`Acquisition::start`] for the first [`Step`], performs it, and feeds what
//! happened back in; [`Acquisition::holds_place`] says whether a place in line must be left if
//! the acquisition stops (is cancelled) now.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::grants::Grant;
use crate::backend::Wait;
use crate::support::retry::Backoff;

/// How long a waiter that could not subscribe waits at most before looking again: without a
/// message, a release costs it up to this much.
pub(crate) const UNSUBSCRIBED_POLL: Duration = Duration::from_millis(200);
/// A hand-off message is trusted without asking Redis only while the claim it announces has at
/// least this much left.
pub(crate) const GRANT_MARGIN: Duration = Duration::from_millis(300);
/// Spread of the looks of waiters that wake at the same moment (a ttl running out).
const EXPIRY_JITTER: Duration = Duration::from_millis(2);
/// Backoff after a Redis error while acquiring.
const ERROR_BACKOFF: Backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(500));

/// What an acquisition is asked to do, and what the store it runs on does.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms {
    /// When it gives up.
    pub(crate) deadline: Instant,
    /// A zero timeout: one attempt, which never takes a place in line.
    pub(crate) one_attempt: bool,
    /// How often a place in line (or in Redlock's wake lists) must be renewed; `None` where
    /// places do not expire.
    pub(crate) renew: Option<Duration>,
    /// The ttl asked for.
    pub(crate) ttl: Duration,
    /// Whether a fencing token was asked for.
    pub(crate) fencing: bool,
    /// What a message to the waiter is on this store.
    pub(crate) messages: Messages,
}

/// What a message to a waiter is, on the store an acquisition runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Messages {
    /// Only a wake-up (Redlock: a lock is held by a majority's grants, found by looking).
    WakeUp,
    /// A hand-off, trusted while its claim surely runs.
    HandOff,
    /// A hand-off counted once the waiter's own confirmation of the full ttl is acknowledged by
    /// replicas (`wait_for_replicas`): the hand-off was another connection's write.
    ReplicatedHandOff,
}

/// One acquisition's progress.
#[derive(Debug)]
pub(crate) struct Acquisition {
    terms: Terms,
    phase: Phase,
    subscription: Subscription,
    errors: Backoff,
    /// The channel a place names while the waiter listens.
    channel: Option<Arc<str>>,
    /// Whether the current token may hold a place in line (a new token gives the old one up).
    holds_place: bool,
    /// The last attempt sent: when, and whether it took (not renewed) a place in line.
    sent: Instant,
    asked: Asked,
    /// The send time of the attempt that took this token's place in line, while no later
    /// attempt has found the lock held. A hand-off to the token can only have been made after
    /// that attempt ran (there was no place to hand it to before), so its claim runs at least
    /// until then plus the claim. Once a later attempt finds the lock held, a message read
    /// since may have been published before that attempt and its claim have run out (a message
    /// is read late when the pub/sub connection's reader is held up): Redis is asked instead.
    placed_at: Option<Instant>,
    /// The end of the wait for a subscription.
    subscribe_until: Instant,
    /// The fencing token of a hand-off being confirmed (`wait_for_replicas`).
    confirming: u64,
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

/// What the last attempt asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asked {
    FirstTry,
    Join,
    Renew,
}

/// What the driver does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Send the attempt [`Acquisition::request`] describes; report with [`Acquisition::attempted`].
    Attempt,
    /// Register for messages to the token and wait for the subscription until `until`; report
    /// with [`Acquisition::subscribed`].
    Subscribe { until: Instant },
    /// Sleep until `until` plus a random part of `spread` (never past the deadline), or until a
    /// message; then report with [`Acquisition::woke`].
    Sleep { until: Instant, spread: Duration },
    /// Ask Redis to set the handed-over lock's full ttl and wait for the replicas to acknowledge
    /// it (`Backend::confirm_replicated`); report with [`Acquisition::confirmed`].
    Confirm,
    /// The last attempt failed and may still run, to be cleaned up by its token: leave the
    /// place, stop listening for the token, go on under a new one; report with
    /// [`Acquisition::rotated`].
    NewToken,
    /// The lock is ours.
    Acquired(Won),
    /// The lock was to be handed over, but its fencing token could not be issued: it was
    /// passed on, and this acquisition fails.
    FenceFailed,
    /// The deadline passed with the lock held by someone else.
    TimedOut,
    /// Give up with the error the last attempt returned.
    Failed,
}

/// A lock won: ours for at least `expires_in` from `since`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Won {
    pub(crate) fence: Option<u64>,
    pub(crate) since: Instant,
    pub(crate) expires_in: Duration,
    pub(crate) via: Via,
}

/// How a lock was won.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// A first try found it free.
    FirstTry,
    /// An attempt in line found it free or handed to the waiter.
    Line,
    /// A trusted hand-off message.
    HandOff,
    /// A hand-off message, confirmed with the replicas.
    Confirmed,
}

/// What the confirmation of a handed-over lock found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Confirmation {
    /// Ours, its full ttl acknowledged by the replicas.
    Ours,
    /// Not ours, or not known to be (the confirmation failed): Redis is asked.
    Doubtful,
    /// Ours, but too few replicas acknowledged it, so it was given back under the token. A
    /// release on a cluster leaves its token in the lock's `released` marker, which vouches
    /// that a later release of the same token ran before: a token that gave its lock back
    /// must never hold the lock again.
    GivenBack,
}

/// What an attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Ours, for at least `expires_in` from the send time.
    Acquired {
        fence: Option<u64>,
        expires_in: Duration,
    },
    /// Held by someone else, for at most `remaining` (`None`: unknown).
    Held { remaining: Option<Duration> },
    /// Redis failed; `permanent` when retrying cannot help (a permission, a wrong type).
    Failed { permanent: bool },
    /// The attempt failed because its connection dropped, where a waiter in line keeps its
    /// token and its place (see `Backend::keeps_place_through`): retried as a look in line. A
    /// first try, which holds no place, takes it as any transient failure.
    Interrupted,
}

/// How the wait for a subscription ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Subscribed {
    /// Subscribed.
    Confirmed,
    /// Not confirmed by the time the step gave.
    Unconfirmed,
    /// Subscribing failed.
    Failed,
}

impl Acquisition {
    /// An acquisition on `terms`.
    pub(crate) fn new(terms: Terms) -> Self {
        Acquisition {
            terms,
            phase: Phase::FirstTry,
            subscription: Subscription::NotYet,
            errors: ERROR_BACKOFF,
            channel: None,
            holds_place: false,
            sent: terms.deadline,
            asked: Asked::FirstTry,
            placed_at: None,
            subscribe_until: terms.deadline,
            confirming: 0,
        }
    }

    /// The first step, at `now` (when the acquisition's turn in this process came). A key known
    /// to be `contended` (this manager saw it handed over a moment ago, and its subscription is
    /// not failing; asked only when it matters) is given no first try, which would most likely
    /// find it held, but a place in line at once — after subscribing, so that the hand-off
    /// message is not missed; the attempt that takes the place also takes the lock when it is
    /// free and nobody waits. Not for a single attempt (a zero timeout), which must never take
    /// a place in line.
    pub(crate) fn start(&mut self, now: Instant, contended: impl FnOnce() -> bool) -> Step {
        if !self.terms.one_attempt && contended() {
            self.subscribe(now)
        } else {
            Step::Attempt
        }
    }

    /// When the acquisition gives up.
    pub(crate) fn deadline(&self) -> Instant {
        self.terms.deadline
    }

    /// Whether the waiter may hold a place in line: stopping now must leave it.
    pub(crate) fn holds_place(&self) -> bool {
        self.holds_place
    }

    /// Whether the waiter listens for messages (a failed subscription polls instead).
    pub(crate) fn listening(&self) -> bool {
        self.subscription == Subscription::Listening
    }

    /// Whether the waiter is in line.
    #[cfg(test)]
    fn in_line(&self) -> bool {
        self.phase == Phase::InLine
    }

    /// What the attempt asked for by [`Step::Attempt`] sends, at `now`. A place names the
    /// channel only while the manager's channel is subscribed (`hub_subscribed`, asked only for
    /// a place): a release counts who hears a hand-off, and takes a waiter nobody hears for
    /// dead. While the subscription is down (its connection dropped, and is not back yet), the
    /// place names no channel and is judged by its lease, and the lock handed to it is found at
    /// the next look.
    pub(crate) fn request(&mut self, now: Instant, hub_subscribed: impl FnOnce() -> bool) -> Wait {
        self.sent = now;
        if self.subscription == Subscription::NotYet {
            self.asked = Asked::FirstTry;
            return Wait::FirstTry;
        }
        let renewing = self.holds_place;
        self.asked = if renewing { Asked::Renew } else { Asked::Join };
        self.holds_place = true;
        let channel = self.channel.as_ref().filter(|_| hub_subscribed()).cloned();
        Wait::InLine { channel, renewing }
    }

    /// The attempt sent came back with `outcome` at `now`.
    pub(crate) fn attempted(&mut self, now: Instant, outcome: Outcome) -> Step {
        let outcome = match outcome {
            Outcome::Interrupted if self.asked == Asked::FirstTry => {
                Outcome::Failed { permanent: false }
            }
            outcome => outcome,
        };
        match outcome {
            Outcome::Acquired { fence, expires_in } => {
                let via = if self.asked == Asked::FirstTry {
                    Via::FirstTry
                } else {
                    Via::Line
                };
                self.won(fence, self.sent, expires_in, via)
            }
            Outcome::Failed { permanent: true } => Step::Failed,
            Outcome::Failed { permanent: false } | Outcome::Interrupted
                if now >= self.terms.deadline =>
            {
                Step::Failed
            }
            Outcome::Failed { permanent: false } => self.under_a_new_token(),
            Outcome::Interrupted => self.back_off(now),
            Outcome::Held { remaining } => {
                self.placed_at = (self.asked == Asked::Join).then_some(self.sent);
                if now >= self.terms.deadline {
                    return Step::TimedOut;
                }
                self.errors.reset();
                if self.subscription == Subscription::NotYet {
                    return self.subscribe(now);
                }
                self.phase = Phase::InLine;
                // A holder that dies releases nothing: look again when its ttl runs out.
                let mut until = now + remaining.unwrap_or(UNSUBSCRIBED_POLL);
                let mut spread = EXPIRY_JITTER;
                if let Some(renew) = self.terms.renew {
                    if now + renew < until {
                        until = now + renew;
                        spread = Duration::ZERO;
                    }
                }
                if self.subscription == Subscription::Polling {
                    until = until.min(now + UNSUBSCRIBED_POLL);
                }
                Step::Sleep {
                    until: until.min(self.terms.deadline),
                    spread,
                }
            }
        }
    }

    /// The driver went on under a new token (after [`Step::NewToken`]), at `now`: back off.
    pub(crate) fn rotated(&mut self, now: Instant) -> Step {
        self.back_off(now)
    }

    /// The wait for a subscription asked for by [`Step::Subscribe`] ended with `result`;
    /// `channel` is where hand-offs to the waiter are published. One not confirmed before the
    /// end of the step's wait takes its place meanwhile, as after a lost connection: the place
    /// names the channel once it is subscribed, and until then the lock handed to the waiter is
    /// found at its next look. Not when the wait ended at the deadline: it polls.
    pub(crate) fn subscribed(&mut self, result: Subscribed, channel: Arc<str>) -> Step {
        let listening = match result {
            Subscribed::Confirmed => true,
            Subscribed::Unconfirmed => self.subscribe_until < self.terms.deadline,
            Subscribed::Failed => false,
        };
        if listening {
            self.subscription = Subscription::Listening;
            self.channel = Some(channel);
        } else {
            self.subscription = Subscription::Polling;
        }
        self.phase = Phase::InLine;
        Step::Attempt
    }

    /// A sleep ended at `now`, with `message` (`None`: its timer, or a lost connection). A
    /// hand-off is ours for at least the claim, counted from before the attempt that took the
    /// place (the hand-off came after it): trusted while that is still well ahead. Anything
    /// else — a message read too late to trust (this waiter did not run for a while), or after
    /// a look that found the lock held, a wake-up, or no message — looks again, also at the
    /// deadline: one last look may still find it free.
    pub(crate) fn woke(&mut self, now: Instant, message: Option<Grant>) -> Step {
        // Only a release that hands the lock over sends a grant: on Redlock a message with a
        // fence (or a fencing failure) is not one of ours, and means at most "look again" —
        // the majority's answers decide.
        let message = message.filter(|_| self.terms.messages != Messages::WakeUp);
        let claim = self.claim();
        let trusted_since = self
            .placed_at
            .filter(|placed_at| now + GRANT_MARGIN < *placed_at + claim);
        match (message, trusted_since) {
            (Some(Grant::Granted { fence }), Some(placed_at))
                if self.terms.messages == Messages::HandOff =>
            {
                let fence = self.terms.fencing.then_some(fence);
                self.won(fence, placed_at, claim, Via::HandOff)
            }
            (Some(Grant::Granted { fence }), Some(_)) => {
                self.confirming = fence;
                Step::Confirm
            }
            (Some(Grant::FenceFailed), _) => Step::FenceFailed,
            (Some(Grant::Granted { .. }) | None, _) => Step::Attempt,
        }
    }

    /// The confirmation asked for by [`Step::Confirm`], sent at `sent`, found what
    /// `confirmation` says by `now`. A lock not confirmed ours sends the waiter to ask Redis, as
    /// after any doubt; one it gave back, under a new token (see [`Confirmation::GivenBack`]),
    /// unless the deadline has passed: then it fails with the error that made it give the lock
    /// back, as an attempt that fails at the deadline does.
    pub(crate) fn confirmed(
        &mut self,
        sent: Instant,
        now: Instant,
        confirmation: Confirmation,
    ) -> Step {
        match confirmation {
            Confirmation::Ours => {
                let fence = self.terms.fencing.then_some(self.confirming);
                self.won(fence, sent, self.terms.ttl, Via::Confirmed)
            }
            Confirmation::Doubtful => Step::Attempt,
            Confirmation::GivenBack if now >= self.terms.deadline => Step::Failed,
            Confirmation::GivenBack => self.under_a_new_token(),
        }
    }

    /// Goes on under a new token: a new registration for its messages, a new place in line.
    fn under_a_new_token(&mut self) -> Step {
        self.subscription = Subscription::NotYet;
        self.phase = Phase::FirstTry;
        self.channel = None;
        self.holds_place = false;
        self.placed_at = None;
        Step::NewToken
    }

    /// How long a hand-off is the waiter's at least.
    fn claim(&self) -> Duration {
        self.terms.ttl.min(crate::backend::CLAIM)
    }

    fn subscribe(&mut self, now: Instant) -> Step {
        // Bounded by a renewal as well as the deadline: the subscription is made by the hub's
        // task, which may run on another runtime than this waiter's (the one that made the
        // manager), whose threads a body may block; a slow pub/sub connect must not stretch
        // the deadline either.
        self.subscribe_until = self.terms.deadline.min(now + crate::backend::RENEW);
        Step::Subscribe {
            until: self.subscribe_until,
        }
    }

    fn back_off(&mut self, now: Instant) -> Step {
        Step::Sleep {
            until: (now + self.errors.next_pause()).min(self.terms.deadline),
            spread: Duration::ZERO,
        }
    }

    fn won(&mut self, fence: Option<u64>, since: Instant, expires_in: Duration, via: Via) -> Step {
        // The place became the lock: nothing to leave.
        self.holds_place = false;
        Step::Acquired(Won {
            fence,
            since,
            expires_in,
            via,
        })
    }
}

#[cfg(test)]
mod grant_tests;
#[cfg(test)]
mod tests;
