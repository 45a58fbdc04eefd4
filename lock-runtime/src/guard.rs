//! [`LockGuard`]: a held lock — extend it, check it, release it, or drop it.

use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::acquire::queue::{Lease, Turn};
use crate::backend::keys::LockKeys;
use crate::backend::Taken;
use crate::hold::held::{Expiry, Finder, Held};
use crate::meters::Meter;
use crate::shared::Shared;
use crate::support::cold;
use crate::{LockError, LockOptions};

/// A lock just acquired: what its guard is made of.
pub(crate) struct Acquired {
    pub(crate) keys: LockKeys,
    pub(crate) token: Arc<str>,
    pub(crate) fence: Option<u64>,
    /// This process's turn on the key.
    pub(crate) turn: Turn,
    /// The send time of the command that got the lock: ours for at least `expires_in` from it.
    pub(crate) since: Instant,
    pub(crate) expires_in: Duration,
    /// How it was taken.
    pub(crate) taken: Taken,
}

/// A held lock.
///
/// Release it with [`release`](LockGuard::release) to learn whether it was still yours; if you
/// just drop it (early return, panic, a cancelled future) it is released in the background,
/// still with the atomic compare-and-delete, so a guard never deletes a lock that has since
/// passed to someone else.
///
/// ```no_run
/// # async fn example() -> Result<(), distlock::LockError> {
/// use distlock::{LockManager, LockOptions};
/// use std::time::Duration;
///
/// let manager = LockManager::connect("redis://127.0.0.1:6379").await?;
/// let guard = manager.acquire("invoice:42", &LockOptions::new()).await?;
/// assert_eq!(guard.key(), "lock:invoice:42");
/// // ... work ...
/// guard.extend(Duration::from_secs(30)).await?; // more time, only if still ours
/// // ... more work ...
/// guard.release().await?; // Err(LockError::Lost) if it expired meanwhile
/// # Ok(())
/// # }
/// ```
pub struct LockGuard {
    held: Arc<Held>,
    /// This process's turn on the key; handed to the next local waiter after the release.
    turn: Option<Turn>,
    watchdog: Option<JoinHandle<()>>,
    released: bool,
    /// Re-entry by task: a re-entered guard releases nothing (see `manager::reentry`).
    pub(crate) reentry: crate::guard::Reentry,
    /// The guards of the other locks of an `acquire_all` taken one by one (each its own
    /// token), in the caller's order; this guard acts on them with its own lock.
    parts: Vec<LockGuard>,
}

/// A lock's turn among this process's tasks lasts while the lock lives: until its expiry, or
/// now once it is known lost.
impl Lease for Held {
    fn lives_until(&self) -> Option<Instant> {
        Some(if self.is_lost() {
            tokio::time::Instant::now()
        } else {
            self.expiry().valid_until
        })
    }
}

impl LockGuard {
    pub(crate) fn new(held: Held, turn: Turn) -> Self {
        let held = Arc::new(held);
        // This process's next task may contend once the lock has expired: a holder stuck past
        // its ttl keeps it from no one, in this process as in others.
        let lease: std::sync::Weak<dyn Lease> = Arc::downgrade(&held) as _;
        turn.hold_while(lease);
        LockGuard {
            held,
            turn: Some(turn),
            watchdog: None,
            released: false,
            reentry: crate::guard::Reentry::default(),
            parts: Vec::new(),
        }
    }

    /// This guard, holding also the locks of `parts`, after those it has (see
    /// [`LockGuard::keys`]).
    pub(crate) fn with_parts(mut self, parts: Vec<LockGuard>) -> Self {
        self.parts.extend(parts);
        self
    }

    /// What this guard shares with its watchdogs, for its own lock and each part's.
    pub(crate) fn helds(&self) -> impl Iterator<Item = &Arc<Held>> {
        std::iter::once(&self.held).chain(self.parts.iter().map(|part| &part.held))
    }

    /// The first of its locks known lost (see [`lost`](Self::lost)), if one is.
    fn lost_one(&self) -> Option<&Arc<Held>> {
        self.helds().find(|held| held.is_lost())
    }

    /// Completes once `condition` holds for any of its locks, re-checking at every change.
    async fn until_any(&self, condition: fn(&Held) -> bool) {
        if self.parts.is_empty() {
            return self.held.until(condition).await;
        }
        loop {
            let mut changes: Vec<_> = self.helds().map(|held| held.changed()).collect();
            if self.helds().any(|held| condition(held)) {
                return;
            }
            poll_fn(|cx| {
                let changed = changes
                    .iter_mut()
                    .any(|change| change.as_mut().poll(cx).is_ready());
                if changed {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
        }
    }

    /// The guard of a lock `acquired` on `shared` with `options`, with its watchdog when the
    /// options ask for one. A lock handed over with a claim shorter than its ttl is confirmed to
    /// its full ttl a third into the claim, unless it is released before (`confirm`); one whose
    /// ttl is within the claim was handed over with its full ttl, and needs nothing.
    pub(crate) fn acquired(
        shared: &Arc<Shared>,
        acquired: Acquired,
        options: &LockOptions,
    ) -> Self {
        let ttl = options.ttl_duration();
        let Acquired {
            keys,
            token,
            fence,
            turn,
            since,
            expires_in,
            taken,
        } = acquired;
        let expiry = Expiry {
            ttl,
            span: expires_in,
            valid_until: since + expires_in,
        };
        // From when Redis answered, which is after it granted: never a shorter hold.
        let hold_until = options
            .hold_at_least_duration()
            .map(|hold| Instant::now() + hold);
        let held = Held::new(
            Arc::clone(shared),
            keys,
            token,
            fence,
            expiry,
            hold_until,
            Meter::new(options).hold(),
        )
        .taken_by(taken);
        let mut guard = LockGuard::new(held, turn);
        // By `ttl`, not by what is left: a lock found handed over by looking (no message) is
        // known only by its remaining PTTL, below even a ttl that the hand-off gave in full.
        if ttl > crate::backend::CLAIM && expires_in <= crate::backend::CLAIM {
            guard.confirm_ttl();
        }
        if options.auto_extend_enabled() {
            guard.start_watchdog();
        }
        guard
    }

    /// A guard of a lock that an outer guard of the same task holds (see `manager::reentry`).
    pub(crate) fn reentered(held: Arc<Held>) -> Self {
        LockGuard {
            held,
            turn: None,
            watchdog: None,
            released: false,
            reentry: crate::guard::Reentry {
                reentered: true,
                class: None,
                shown: None,
            },
            parts: Vec::new(),
        }
    }

    /// What the guard shares with its watchdog and its re-entered guards.
    pub(crate) fn held(&self) -> &Arc<Held> {
        &self.held
    }

    /// This re-entered guard, showing the lock `key` of the locks its outer guard took
    /// together: the one the inner call asked for.
    pub(crate) fn showing(mut self, key: Arc<str>) -> Self {
        if *key != *self.held.keys.lock {
            self.reentry.shown = Some(key);
        }
        self
    }

    /// Sets the lock's ttl to the one it was asked for, a third into the claim it was handed
    /// over with, on the background runtime, unless it is released before (see `confirm`).
    // Not inlined, nor is `start_watchdog`: the tasks they spawn would otherwise take room in
    // the stack frame of every acquisition, which starts neither by default (see
    // `support::cold`).
    #[inline(never)]
    pub(crate) fn confirm_ttl(&mut self) {
        crate::hold::confirm::schedule(Arc::clone(&self.held));
    }

    /// Starts the auto-extension watchdog (see [`crate::LockOptions::auto_extend`]).
    #[inline(never)]
    pub(crate) fn start_watchdog(&mut self) {
        let held = Arc::clone(&self.held);
        self.watchdog = Some(tokio::spawn(crate::hold::watchdog::keep_alive(held)));
    }

    /// The full Redis key of the lock (`key_prefix + name`).
    ///
    /// ```no_run
    /// # async fn example(guard: distlock::LockGuard) {
    /// println!("holding {}", guard.key()); // e.g. "lock:trace:abc"
    /// # }
    /// ```
    #[must_use]
    pub fn key(&self) -> &str {
        self.reentry
            .shown
            .as_deref()
            .unwrap_or(&self.held.keys.lock)
    }

    /// Every full Redis key this guard holds: one for [`acquire`](crate::LockManager::acquire),
    /// each distinct name's for [`acquire_all`](crate::LockManager::acquire_all), in the order
    /// the names were given (repeats once). The first is [`key`](Self::key).
    ///
    /// ```no_run
    /// # async fn example(manager: distlock::LockManager) -> Result<(), distlock::LockError> {
    /// let names = ["account:7", "account:3", "account:7"];
    /// let guard = manager.acquire_all(&names, &distlock::LockOptions::new()).await?;
    /// assert_eq!(guard.keys(), ["lock:account:7", "lock:account:3"]);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn keys(&self) -> Vec<&str> {
        if let Some(shown) = &self.reentry.shown {
            return vec![shown];
        }
        self.held
            .keys
            .every()
            .map(|keys| &*keys.lock)
            .chain(self.parts.iter().flat_map(LockGuard::keys))
            .collect()
    }

    /// The key, shared rather than copied: for callers that need it after the guard is gone.
    pub(crate) fn shared_key(&self) -> Arc<str> {
        Arc::clone(&self.held.keys.lock)
    }

    /// The value stored in the lock key: a fresh UUID v4 for every acquisition (what makes it
    /// unguessable), then who holds it — `;h=<host>;p=<pid>;t=<since, Unix ms>[;l=<label>]`,
    /// escaped, without whitespace, and `;m=r` for a reader
    /// ([`LockMode::Read`](crate::LockMode::Read)) — which
    /// [`LockManager::inspect`](crate::LockManager::inspect) reads back. Release and extension
    /// compare the whole value. Locks taken together by
    /// [`acquire_all`](crate::LockManager::acquire_all) share it when one script took them;
    /// taken one by one (across cluster slots, on Redlock, in process) each has its own, and
    /// this is the first's.
    ///
    /// ```no_run
    /// # async fn example(guard: distlock::LockGuard) {
    /// let uuid = &guard.token()[..36];
    /// assert!(guard.token()[36..].starts_with(";h="));
    /// # }
    /// ```
    #[must_use]
    pub fn token(&self) -> &str {
        &self.held.token
    }

    /// The fencing token of this acquisition when it was taken with
    /// [`fencing(true)`](crate::LockOptions::fencing): strictly greater than that of every
    /// earlier acquisition of the same key, by any client. Pass it along with every write the
    /// lock protects, and have the storage reject writes with a smaller token than it has seen.
    /// With [`acquire_all`](crate::LockManager::acquire_all) each key's counter issues one, and
    /// this is the one of [`key`](Self::key), the first name's. A re-entered guard of another
    /// name that such a guard took together with the first by one script has none (`None`):
    /// that name's token is not kept, and another counter's would not fence its storage.
    ///
    /// ```no_run
    /// # async fn example(manager: distlock::LockManager) -> Result<(), distlock::LockError> {
    /// let options = distlock::LockOptions::new().fencing(true);
    /// let guard = manager.acquire("ledger", &options).await?;
    /// let token: u64 = guard.fencing_token().expect("asked for one");
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn fencing_token(&self) -> Option<u64> {
        // Only the first name's token is kept: another counter's would fence the wrong storage.
        if self.reentry.shown.is_some() {
            return None;
        }
        self.held.fence
    }

    /// Sets the lock's remaining time to live to `ttl`, if the lock is still ours.
    ///
    /// With [`auto_extend`](crate::LockOptions::auto_extend), the watchdog follows: from now on
    /// it renews the lock to this `ttl` every `ttl`/3, and cancels the holder by this expiry
    /// if it cannot renew — also when `ttl` is shorter than the one it was acquired with.
    ///
    /// # Errors
    /// [`LockError::Lost`] if the lock expired or belongs to someone else now (nothing is
    /// touched then), [`LockError::Config`] for a ttl outside 1 ms ..= 365 days or a guard
    /// its process inherited from the one it was forked from (which holds the lock),
    /// [`LockError::Redis`] if Redis could not be asked.
    ///
    /// ```no_run
    /// # async fn example(guard: distlock::LockGuard) -> Result<(), distlock::LockError> {
    /// guard.extend(std::time::Duration::from_secs(30)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        // Every lock is extended even when one is found lost: the release that follows then
        // hands the others on rather than leaving them to expire.
        let mut result = Ok(());
        for held in self.helds() {
            let extended = held.set_ttl(Some(ttl), Finder::Holder).await;
            tracing::debug!(target: "distlock", key = %held.keys.lock, ttl_ms = crate::support::units::millis(ttl), ok = extended.is_ok(), "extended");
            result = result.and(extended);
        }
        result
    }

    /// Asks Redis whether the lock is still ours.
    ///
    /// # Errors
    /// [`LockError::Redis`] if Redis could not be asked; [`LockError::Config`] for a guard its
    /// process inherited from the one it was forked from.
    ///
    /// ```no_run
    /// # async fn example(guard: distlock::LockGuard) -> Result<(), distlock::LockError> {
    /// if !guard.is_held().await? {
    ///     eprintln!("{} expired: stop writing", guard.key());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn is_held(&self) -> Result<bool, LockError> {
        for held in self.helds() {
            held.not_inherited()?;
            if !held.shared.backend.is_held(&held.keys, &held.token).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Completes when the guard learns that the lock is lost: when the auto-extension watchdog
    /// finds it gone or cannot reach Redis before it would expire, or when
    /// [`extend`](LockGuard::extend) or [`release`](LockGuard::release) found it no longer
    /// ours. Without `auto_extend` nothing checks in the background, so race your work against
    /// this only with `auto_extend` on.
    ///
    /// ```no_run
    /// # async fn example(manager: distlock::LockManager) -> Result<(), distlock::LockError> {
    /// let options = distlock::LockOptions::new().auto_extend(true);
    /// let guard = manager.acquire("report", &options).await?;
    /// tokio::select! {
    ///     () = guard.lost() => return Err(guard.lost_error().expect("lost")),
    ///     () = tokio::time::sleep(std::time::Duration::from_secs(90)) => {} // long work
    /// }
    /// guard.release().await
    /// # }
    /// ```
    pub async fn lost(&self) {
        self.until_any(Held::is_lost).await;
    }

    /// Why the lock was lost, once the guard knows it is (see [`lost`](Self::lost)): the
    /// cause the first finding gave — the watchdog's, or that of the `extend` or `release`
    /// that found the lock no longer ours. `None` while it is not known lost.
    ///
    /// ```no_run
    /// # fn example(guard: &distlock::LockGuard) {
    /// if let Some(distlock::LostCause::Unreachable) = guard.lost_cause() {
    ///     eprintln!("Redis was unreachable: check it before retrying");
    /// }
    /// # }
    /// ```
    #[must_use]
    pub fn lost_cause(&self) -> Option<crate::LostCause> {
        self.lost_one().and_then(|held| held.lost_cause())
    }

    /// The [`LockError::Lost`] that says why the lock was lost, once the guard knows it is;
    /// `None` while it is not known lost. For a holder racing its work against
    /// [`lost`](Self::lost).
    ///
    /// ```no_run
    /// # fn example(guard: &distlock::LockGuard) -> Result<(), distlock::LockError> {
    /// if let Some(error) = guard.lost_error() {
    ///     return Err(error); // "lock `lock:report` was lost: ..." with the cause's advice
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn lost_error(&self) -> Option<LockError> {
        self.lost_one().map(|held| held.lost_error())
    }

    /// The [`LockError::Lost`] of a lock known lost (see [`Held::lost_error`]).
    pub(crate) fn known_lost(&self) -> LockError {
        self.lost_one().unwrap_or(&self.held).lost_error()
    }

    /// Completes when the watchdog gives the lock up — not when the holder's own `extend` or
    /// `release` finds it gone, which the holder handles itself.
    pub(crate) async fn lost_by_watchdog(&self) {
        self.until_any(Held::is_lost_by_watchdog).await;
    }

    /// Whether the guard already knows the lock is lost (no Redis call; see [`lost`](Self::lost)).
    ///
    /// ```no_run
    /// # fn example(guard: &distlock::LockGuard) {
    /// if guard.is_lost() { /* stop */ }
    /// # }
    /// ```
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.lost_one().is_some()
    }

    /// Releases the lock with an atomic compare-and-delete that hands it to the next waiter in
    /// the lock's line, if any.
    ///
    /// # Errors
    /// [`LockError::Lost`] if the lock was no longer ours (it expired, and maybe someone else
    /// holds it now — their lock is left untouched); [`LockError::Redis`] if Redis could not be
    /// reached, in which case the lock expires at the end of its ttl; [`LockError::Config`] for
    /// a guard its process inherited from the one it was forked from, whose lock is left to it.
    /// A re-entered guard (see [`scope`](Self::scope)) releases nothing: `Ok(())`.
    ///
    /// ```no_run
    /// # async fn example(guard: distlock::LockGuard) -> Result<(), distlock::LockError> {
    /// guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn release(mut self) -> Result<(), LockError> {
        if self.reentry.reentered {
            return Ok(());
        }
        // Each part is released whatever the others found; the first error is returned.
        let mut parts_released = Ok(());
        for part in std::mem::take(&mut self.parts) {
            parts_released = parts_released.and(cold::boxed(|| part.release()).await);
        }
        self.stop_watchdog();
        let held = Arc::clone(&self.held);
        let mut unlock = pin!(held.unlock());
        let turn = &mut self.turn;
        // Hand the turn to the next task of this process as soon as the release is on its way,
        // not when Redis answers: that task's `SET NX` travels on the same connection, behind
        // the release, so Redis runs them in that order and the hand-over saves a round trip.
        // (Should it overtake anyway — another runtime's connection — it finds the lock held
        // and waits for the release's wake-up as any waiter does.) One place polls the release,
        // so its code is laid out once.
        let result = poll_fn(|cx| {
            let polled = unlock.as_mut().poll(cx);
            if polled.is_pending() {
                drop(turn.take());
            }
            polled
        })
        .await;
        // Only now: if this future is dropped mid-call, `Drop` still releases in the background.
        self.released = true;
        drop(self.turn.take());
        result.and(parts_released)
    }

    /// Whether this guard was taken by another process, which this one was forked from: a copy
    /// of that process's guard, whose drop here leaves the lock to it.
    pub(crate) fn is_inherited(&self) -> bool {
        self.held.shared.is_inherited()
    }

    /// Stops what runs in the background for the lock: it is being released. (An extension
    /// already sent travels ahead of the release on the same connection; a confirmation not
    /// sent yet is not sent, see `Held::unlock`.)
    fn stop_watchdog(&mut self) {
        self.held.close();
        if let Some(task) = self.watchdog.take() {
            task.abort();
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.reentry.reentered {
            return;
        }
        self.stop_watchdog();
        if self.released {
            return;
        }
        if self.is_inherited() {
            // A copy of the parent's guard in a process forked without exec: the lock is the
            // parent's, which releases it; the child must not take it from under it.
            return;
        }
        let held = Arc::clone(&self.held);
        let turn = self.turn.take();
        // The caller's runtime may be shutting down (a cancelled task at the end of a test),
        // or there may be none: release on the background runtime, which is always there.
        crate::support::background::spawn(async move {
            if let Err(error) = held.unlock().await {
                if !matches!(error, LockError::Lost { .. }) {
                    tracing::warn!(target: "distlock", key = %held.keys.lock, %error, "release after drop failed; the lock expires at the end of its ttl");
                }
            }
            drop(turn);
        });
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.key())
            .field("keys", &self.keys())
            .field("token", &self.token())
            .field("fencing_token", &self.held.fence)
            .field("auto_extend", &self.watchdog.is_some())
            .field("lost", &self.is_lost())
            .field("reentered", &self.reentry.reentered)
            .finish_non_exhaustive()
    }
}

/// What a guard knows about its place in its task's held locks: whether it is a re-entry,
/// and the lock-order class of the lock (for `#[distributed_lock]`, its label: the function's
/// path and the key template).
#[derive(Debug, Default)]
pub(crate) struct Reentry {
    /// A re-entered guard: a view of a lock an outer guard holds, which it does not release.
    pub(crate) reentered: bool,
    /// The attribute's label (`path::to::function template`), for lock-order checks.
    pub(crate) class: Option<Arc<str>>,
    /// The key a re-entered guard shows, when it is not its lock's first: a name its outer
    /// guard took together with others by one script.
    pub(crate) shown: Option<Arc<str>>,
}
