//! What the store's operations are asked and answer: an attempt's request and outcome, whether
//! a lock was still the caller's, how it was taken and why it is deleted. Every store speaks
//! these; the manager and the guard read them.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::keys::LockKeys;
use crate::LostCause;

/// Whether a release, hold or extension found the lock still the caller's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ownership {
    /// It was, and the operation was done.
    Ours,
    /// It was not, for this reason: nothing of the lock was touched.
    Lost(LostCause),
}

impl Ownership {
    pub(crate) fn is_ours(self) -> bool {
        self == Ownership::Ours
    }

    /// What a lock script's reply says: 1 ours; when not ours, -2 an operator force-released
    /// it (its `forced` mark holds the caller's token), -1 another holder has it, 0 nobody
    /// holds it.
    pub(crate) fn from_reply(reply: i64) -> Option<Self> {
        match reply {
            1 => Some(Ownership::Ours),
            0 => Some(Ownership::Lost(LostCause::Expired)),
            -1 => Some(Ownership::Lost(LostCause::Taken)),
            -2 => Some(Ownership::Lost(LostCause::ForceReleased)),
            _ => None,
        }
    }

    /// A Redlock answer, which is a majority's yes or no: masters do not agree on why not, and
    /// keep no `forced` mark, so a lock that is not ours there is reported expired.
    pub(super) fn from_majority(ours: bool) -> Self {
        if ours {
            Ownership::Ours
        } else {
            Ownership::Lost(LostCause::Expired)
        }
    }
}

/// What one attempt to take a lock found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lock is ours now, for at least `expires_in` from when the attempt was sent; `fence`
    /// is the fencing token when one was asked for.
    Acquired {
        fence: Option<u64>,
        expires_in: Duration,
    },
    /// Someone else holds it, for at most `remaining` more (`None`: unknown).
    Held { remaining: Option<Duration> },
}

/// What a release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// The lock was not ours, for this reason: nothing was touched.
    NotOurs(LostCause),
    /// Ours, and free now: nobody waited.
    Freed,
    /// Ours, and handed to the next waiter in line.
    HandedOver,
}

/// What an attempt must do besides trying to take the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Nothing: a first try needs only `SET NX PX` — exactly the command a hand-written lock
    /// sends, the cheapest thing Redis can run.
    FirstTry,
    /// Take a place in line — or renew it, when `renewing` — (on Redlock, in the wake list of
    /// each master that finds the lock held), to be told on `channel` (`None`: not subscribed,
    /// the waiter looks again on its own).
    InLine {
        channel: Option<Arc<str>>,
        renewing: bool,
    },
}

impl Wait {
    /// The channel a script is told to hand the lock over on: `""` for none (a first try, or a
    /// waiter that looks again on its own).
    pub(crate) fn channel_arg(&self) -> &str {
        match self {
            Wait::FirstTry => "",
            Wait::InLine { channel, .. } => channel.as_deref().unwrap_or(""),
        }
    }
}

/// One attempt to take a lock, as the manager asks it of the store.
#[derive(Debug)]
pub(crate) struct LockRequest<'a> {
    pub(crate) keys: &'a LockKeys,
    /// The caller's token: the lock key's value while it holds the lock.
    pub(crate) token: &'a str,
    pub(crate) ttl_millis: u64,
    /// Whether a fencing token is issued with the lock.
    pub(crate) fencing: bool,
    /// What the attempt must do besides trying to take the lock.
    pub(crate) wait: Wait,
}

/// How a held lock was taken: what its release may skip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taken {
    /// By a first try, which writes nothing but the lock key (no `since` record): a release
    /// that finds nobody in line deletes that key alone.
    FirstTry,
    /// Any other way (in line, handed over, several keys at once): the full release.
    Otherwise,
}

/// Why a lock is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unlock {
    /// Its holder is done with it: it goes to the next waiter.
    Release,
    /// A waiter gives up: its place leaves the line, and a lock handed to it meanwhile is
    /// released as its holder would.
    Leave,
}
