//! [`Held`]: what a guard and its watchdog share about one held lock — its identity, how long
//! it is known to live, and whether it was lost.
//!
//! Every change of the lock's ttl, by the holder's `extend` or by the watchdog, goes through
//! [`Held::set_ttl`], one at a time, and is recorded here before it is sent: so the watchdog
//! always works from the expiry Redis may really have, whoever changed it last.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::sync::futures::Notified;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::keys::LockKeys;
use crate::backend::{Ownership, Taken};
use crate::meters::Hold;
use crate::shared::Shared;
use crate::support::cold;
use crate::{LockError, LostCause};

/// One held lock.
pub(crate) struct Held {
    /// The inside of the manager that took it: its backend, kept alive while the lock is held.
    pub(crate) shared: Arc<Shared>,
    pub(crate) keys: LockKeys,
    pub(crate) token: Arc<str>,
    pub(crate) fence: Option<u64>,
    /// With `hold_at_least`: a release before this instant leaves the lock to expire then.
    hold_until: Option<Instant>,
    expiry: Mutex<Expiry>,
    /// Taken around each ttl change, so that their outcomes arrive in the order Redis applied
    /// them.
    setting_ttl: tokio::sync::Mutex<()>,
    lost: AtomicBool,
    /// Why it was lost, as first found: a later finding (a release after the watchdog gave up
    /// for want of Redis, which then finds the lock expired) is a consequence, not the cause.
    cause: OnceLock<LostCause>,
    /// Set with `lost` only when the watchdog gave the lock up: the attribute then cancels the
    /// body. A loss the holder learns from its own `extend` or `release` is its to handle.
    lost_by_watchdog: AtomicBool,
    /// Set when the guard is released or dropped: a confirmation not sent yet is not sent.
    closed: AtomicBool,
    /// Signalled on every change of `expiry` and on loss.
    changed: Notify,
    /// The metrics of this hold (nothing without the `metrics` feature).
    pub(crate) hold: Hold,
    /// How it was taken, which its release may take a shortcut by (see
    /// [`Held::taken_by`]).
    taken: Taken,
}

/// What is known of the lock's expiry in Redis.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expiry {
    /// The ttl it is meant to have: what the watchdog renews it to.
    pub(crate) ttl: Duration,
    /// The ttl of the setting `valid_until` comes from: the span the watchdog schedules and
    /// keeps its margin by. Shorter than `ttl` for a lock handed over with a claim not yet
    /// confirmed.
    pub(crate) span: Duration,
    /// The lock lives in Redis at least until then: the confirmed change's send time plus its
    /// ttl, or earlier while a change to a shorter ttl may have been applied unconfirmed.
    pub(crate) valid_until: Instant,
}

/// Who found the lock lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finder {
    Watchdog,
    Holder,
}

impl Held {
    /// A lock acquired with `expiry.ttl`, known to live in Redis at least until
    /// `expiry.valid_until`, which the setting it got (its full ttl, or a hand-off's claim) put
    /// `expiry.span` after its send time; a release before `hold_until` leaves it to expire then.
    pub(crate) fn new(
        shared: Arc<Shared>,
        keys: LockKeys,
        token: Arc<str>,
        fence: Option<u64>,
        expiry: Expiry,
        hold_until: Option<Instant>,
        hold: Hold,
    ) -> Self {
        Held {
            shared,
            keys,
            token,
            fence,
            hold_until,
            expiry: Mutex::new(expiry),
            setting_ttl: tokio::sync::Mutex::new(()),
            lost: AtomicBool::new(false),
            cause: OnceLock::new(),
            lost_by_watchdog: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            changed: Notify::new(),
            hold,
            taken: Taken::Otherwise,
        }
    }

    /// This hold, of a lock taken as `taken` says (by default, not by a first try: its release
    /// takes no shortcut).
    pub(crate) fn taken_by(mut self, taken: Taken) -> Self {
        self.taken = taken;
        self
    }

    pub(crate) fn expiry(&self) -> Expiry {
        *self.expiry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update_expiry(&self, update: impl FnOnce(&mut Expiry)) {
        update(&mut self.expiry.lock().unwrap_or_else(PoisonError::into_inner));
        self.changed.notify_waiters();
    }

    /// Sets the lock's remaining ttl in Redis, if it is still ours: to `ttl`, or to the ttl it
    /// was last set to when `None` (the watchdog's renewal).
    ///
    /// Cancel-safe: the expiry is lowered to what the change may make it *before* it is sent,
    /// so a change dropped in flight, which Redis may still apply, leaves a safe record.
    pub(crate) async fn set_ttl(
        &self,
        ttl: Option<Duration>,
        finder: Finder,
    ) -> Result<(), LockError> {
        let _one_at_a_time = self.setting_ttl.lock().await;
        let ttl = ttl.unwrap_or_else(|| self.expiry().ttl);
        self.apply_ttl(ttl, finder).await
    }

    /// Confirms the full ttl of a lock handed over on a shorter claim — unless the guard is
    /// being released (its release must not be overtaken by a confirmation on another
    /// connection: see [`Held::unlock`]), the lock is known lost, or the holder or the watchdog
    /// has set its ttl since (which confirmed it).
    pub(crate) async fn confirm(&self) -> Result<(), LockError> {
        let _one_at_a_time = self.setting_ttl.lock().await;
        let expiry = self.expiry();
        if self.is_closed() || self.is_lost() || expiry.span >= expiry.ttl {
            return Ok(());
        }
        self.apply_ttl(expiry.ttl, Finder::Holder).await
    }

    /// [`Held::set_ttl`] once the caller has its turn.
    async fn apply_ttl(&self, ttl: Duration, finder: Finder) -> Result<(), LockError> {
        self.not_inherited()?;
        let ttl_millis = crate::options::ttl_millis(ttl)?;
        let sent = Instant::now();
        self.update_expiry(|expiry| {
            expiry.ttl = ttl;
            expiry.span = expiry.span.min(ttl);
            expiry.valid_until = expiry.valid_until.min(sent + ttl);
        });
        let ours = self
            .shared
            .backend
            .extend(&self.keys, &self.token, ttl_millis)
            .await?;
        if let Ownership::Lost(cause) = ours {
            return Err(self.lost(cause, "it was no longer ours when extending", finder));
        }
        self.update_expiry(|expiry| {
            expiry.span = ttl;
            expiry.valid_until = sent + ttl;
        });
        Ok(())
    }

    /// An error unless this process took the lock. A process forked without exec has a copy
    /// of its parent's guards, whose token is the parent's: a release or a ttl change sent
    /// from the child would pass Redis's compare with that token and take the lock from under
    /// the parent, which goes on believing it holds it. Only the parent holds it; the child
    /// waits for it as any other process does.
    pub(crate) fn not_inherited(&self) -> Result<(), LockError> {
        if !self.shared.is_inherited() {
            return Ok(());
        }
        Err(LockError::config(format!(
            "lock `{}` was taken by process {}, which this process was forked from: the lock is \
             that process's, so this copy of its guard cannot release, extend or ask about it; \
             let the parent release it, and acquire the lock in this process to hold it here",
            self.keys.lock, self.shared.pid
        )))
    }

    /// Deletes the lock if it is still ours — or, before its `hold_at_least` is over, leaves
    /// it to expire when the hold ends.
    pub(crate) async fn unlock(&self) -> Result<(), LockError> {
        self.not_inherited()?;
        // A confirmation runs on the background runtime's connection, not the caller's: one in
        // flight could reach Redis after the release and lengthen a lock that a
        // `hold_at_least` release has just shortened. None is sent once the guard is closed,
        // and one already sent is waited for.
        self.close();
        // Without waiting in the usual case, where no ttl change is under way: a try takes
        // the mutex with one atomic operation, where a wait would register with it.
        if self.setting_ttl.try_lock().is_err() {
            drop(self.setting_ttl.lock().await);
        }
        let backend = &self.shared.backend;
        // Rounded up: Redis applies it later than now, so the lock lives past the hold's end.
        let keep_millis = self
            .hold_until
            .and_then(|until| until.checked_duration_since(Instant::now()))
            .map(|keep| u64::try_from(keep.as_micros().div_ceil(1000)).unwrap_or(u64::MAX))
            .filter(|millis| *millis > 0);
        let released = match keep_millis {
            // Boxed: the plain release is the usual one, and sets the future's size.
            Some(keep_millis) => {
                cold::boxed(|| backend.hold(&self.keys, &self.token, keep_millis)).await
            }
            None => backend.unlock(&self.keys, &self.token, self.taken).await,
        };
        let ours = match released {
            Ok(ours) => ours,
            Err(error) => {
                self.hold.release_failed();
                return Err(error.into());
            }
        };
        if let Ownership::Lost(cause) = ours {
            Err(self.lost(cause, "it was no longer ours at release", Finder::Holder))
        } else {
            self.hold.end();
            match keep_millis {
                Some(keep_ms) => {
                    tracing::debug!(target: "distlock", key = %self.keys.lock, keep_ms, "released; the lock expires when its hold_at_least ends");
                }
                None => tracing::debug!(target: "distlock", key = %self.keys.lock, "released"),
            }
            Ok(())
        }
    }

    /// Records that the lock is no longer ours, for `cause` unless one was recorded before, and
    /// wakes whoever waits for that.
    pub(crate) fn mark_lost(&self, cause: LostCause, why: &str, finder: Finder) {
        // The cause first: whoever wakes at `lost` reads it.
        let cause = *self.cause.get_or_init(|| cause);
        if finder == Finder::Watchdog {
            self.lost_by_watchdog.store(true, Ordering::Release);
        }
        if !self.lost.swap(true, Ordering::AcqRel) {
            self.hold.lost();
            tracing::warn!(target: "distlock", key = %self.keys.lock, %cause, why, "lock lost");
        }
        self.changed.notify_waiters();
    }

    /// Marks the lock lost (see [`Held::mark_lost`]) and returns the error that says so, with
    /// the first cause recorded.
    pub(crate) fn lost(&self, cause: LostCause, why: &str, finder: Finder) -> LockError {
        self.mark_lost(cause, why, finder);
        self.lost_error()
    }

    /// The error that says the lock was lost, with the first cause recorded (expired, when
    /// none was: not reached once the lock is known lost).
    pub(crate) fn lost_error(&self) -> LockError {
        LockError::Lost {
            key: self.keys.lock.to_string(),
            cause: self.lost_cause().unwrap_or(LostCause::Expired),
        }
    }

    /// Why the lock was lost, once it is known lost.
    pub(crate) fn lost_cause(&self) -> Option<LostCause> {
        self.cause.get().copied()
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// The guard is being released or dropped: nothing more is to be confirmed.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(crate) fn is_lost_by_watchdog(&self) -> bool {
        self.lost_by_watchdog.load(Ordering::Acquire)
    }

    /// Completes at the next change of the expiry or loss after this call: registered before
    /// it returns, so a change between a check and the await is not missed.
    pub(crate) fn changed(&self) -> Pin<Box<Notified<'_>>> {
        let mut changed = Box::pin(self.changed.notified());
        changed.as_mut().enable();
        changed
    }

    /// Completes once `condition` holds, re-checking at every change.
    pub(crate) async fn until(&self, condition: fn(&Self) -> bool) {
        loop {
            let changed = self.changed();
            if condition(self) {
                return;
            }
            changed.await;
        }
    }
}
