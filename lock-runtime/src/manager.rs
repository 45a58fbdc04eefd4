//! [`LockManager`]: connects to Redis and takes locks.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::acquire::finish::FinishOnDrop;
use crate::acquire::machine::{Acquisition, Outcome, Request, Step};
use crate::acquire::queue::Turn;
use crate::backend::grants::{Grant, GrantWaiter};
use crate::backend::keys::LockKeys;
use crate::backend::{Attempt, Backend, Wait};
use crate::builder::{LockManagerBuilder, Topology};
use crate::hold::held::{Expiry, Held};
use crate::shared::Shared;
use crate::support::meters::Meter;
use crate::support::retry::{jitter, Backoff};
use crate::{LockError, LockGuard, LockOptions};

/// A hand-off message is trusted without asking Redis only while the claim it announces has at
/// least this much left.
const GRANT_MARGIN: Duration = Duration::from_millis(300);
/// After releasing the token of an unanswered attempt found nothing, how long until it looks
/// once more: long enough for a command still in the network to have reached Redis.
const UNANSWERED_RECHECK: Duration = Duration::from_secs(1);

/// Takes and releases locks on one Redis deployment.
///
/// Cheap to clone (an `Arc` inside); clones share connections, wake-up subscriptions and the
/// in-process queue of each key. Usable from any tokio runtime: each runtime that uses it gets
/// its own multiplexed connection, so one global manager serves every `#[tokio::test]`. A
/// process forked without exec can use its parent's managers too: at its first call each makes
/// its connections, wake-up channel and queues anew in the child, from the same settings (the
/// parent's are driven by threads the child does not have).
///
/// ```no_run
/// # async fn example() -> Result<(), distlock::LockError> {
/// use distlock::{LockManager, LockOptions};
/// use std::time::Duration;
///
/// let manager = LockManager::builder("redis://127.0.0.1:6379")
///     .key_prefix("myapp:lock:")
///     .response_timeout(Duration::from_millis(500))
///     .connect()
///     .await?;
/// let options = LockOptions::new().ttl(Duration::from_secs(60));
/// if let Some(guard) = manager.try_acquire("nightly-report", &options).await? {
///     // ... only one worker gets here ...
///     guard.release().await?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LockManager {
    inner: Arc<Shared>,
}

impl LockManager {
    /// Connects with the default settings (see [`LockManager::builder`]).
    ///
    /// # Errors
    /// As [`LockManagerBuilder::connect`].
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), distlock::LockError> {
    /// let manager = distlock::LockManager::connect("redis://127.0.0.1:6379").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(url: &str) -> Result<LockManager, LockError> {
        Self::builder(url).connect().await
    }

    /// Starts building a manager for the standalone Redis at `url`
    /// (`redis://[user:password@]host[:port][/db]`; `rediss://` for TLS with the `tls` feature).
    ///
    /// ```
    /// let builder = distlock::LockManager::builder("redis://127.0.0.1:6379");
    /// ```
    pub fn builder(url: impl Into<String>) -> LockManagerBuilder {
        LockManagerBuilder::new(Topology::Standalone(url.into()))
    }

    /// Starts building a manager for a Redis Cluster, given some of its nodes (any node will do;
    /// the rest are discovered). Every key of a lock lives in the lock key's hash slot, so each
    /// lock operation is one script on one node; MOVED/ASK redirections and failovers are
    /// followed.
    ///
    /// ```
    /// let builder = distlock::LockManager::cluster_builder(&[
    ///     "redis://10.0.0.1:7000",
    ///     "redis://10.0.0.2:7000",
    /// ]);
    /// ```
    pub fn cluster_builder<S: AsRef<str>>(urls: &[S]) -> LockManagerBuilder {
        LockManagerBuilder::new(Topology::Cluster(to_strings(urls)))
    }

    /// Starts building a Redlock manager over independent Redis masters (at least 3; 5 is
    /// usual): a lock is held when a majority of them granted it in time, so it survives a
    /// minority of masters being down. Not a master that restarts without its data while the
    /// locks it granted are live: it grants them again, so keep a restarted master out for the
    /// longest ttl in use, or run the masters with `appendonly yes` and `appendfsync always`.
    /// Fencing tokens are not available on Redlock (see [`LockOptions::fencing`]).
    ///
    /// ```
    /// let builder = distlock::LockManager::redlock_builder(&[
    ///     "redis://10.0.0.1:6379",
    ///     "redis://10.0.0.2:6379",
    ///     "redis://10.0.0.3:6379",
    /// ])
    /// .node_timeout(std::time::Duration::from_millis(50));
    /// ```
    pub fn redlock_builder<S: AsRef<str>>(urls: &[S]) -> LockManagerBuilder {
        LockManagerBuilder::new(Topology::Redlock(to_strings(urls)))
    }

    /// Starts building a manager for the master of a Redis Sentinel service, given some of its
    /// sentinels (`redis://host:26379`) and the service's name (`sentinel monitor <name> ...`
    /// in their configuration). The master's address is asked of the sentinels at connect,
    /// again whenever the master dies, refuses connections or turns read-only, and at once
    /// when a sentinel announces `+switch-master` for the service: a failover is followed,
    /// with the same waiting, hand-offs and fencing as on a standalone server. A master with a
    /// password takes [`LockManagerBuilder::master_login`].
    ///
    /// With the `tls` feature, `rediss://` sentinels mean TLS everywhere: to the sentinels, to
    /// the master and to whichever replica takes its place, all trusting the system's roots or
    /// `LockManagerBuilder::tls_root_certificate`. The master's certificate must be valid
    /// for the address the sentinels announce (usually an IP address). Every sentinel URL takes
    /// the same scheme, else `connect` fails with [`LockError::Config`](crate::LockError::Config);
    /// TLS sentinels with logins in their URLs share one.
    ///
    /// Replication is asynchronous, so a failover can forget the last writes of the old
    /// master: a lock granted (or released, or a fencing token issued) just before it may be
    /// unknown to the new master, which then grants that lock again. Keep ttls short with
    /// `auto_extend`, so that a forgotten holder notices at its next extension, and pass
    /// fencing tokens to your storage where a double holder would do harm.
    ///
    /// ```
    /// let builder = distlock::LockManager::sentinel_builder(
    ///     &["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///     "locks",
    /// );
    /// ```
    pub fn sentinel_builder<S: AsRef<str>>(
        sentinels: &[S],
        service: impl Into<String>,
    ) -> LockManagerBuilder {
        LockManagerBuilder::new(Topology::Sentinel {
            sentinels: to_strings(sentinels),
            service: service.into(),
        })
    }

    /// A manager whose locks live in this process's memory: no server, nothing to connect.
    ///
    /// It behaves as a manager on one Redis does — ttl expiry, a fresh token per acquisition,
    /// [`extend`](LockGuard::extend), [`is_held`](LockGuard::is_held), `Lost` on a release after
    /// expiry, strictly increasing fencing tokens, waiters served first come, first served and
    /// woken by the release, `auto_extend`, [`try_acquire`](Self::try_acquire), timeouts and
    /// cancellation — and the behaviour tests run the same bodies against both.
    ///
    /// **One process only.** Every in-process manager of the process shares one lock table (as
    /// the clients of one Redis share its keys), so they exclude each other; another process
    /// sees none of it. Use it for tests of code that takes locks, and for tools that run as a
    /// single process; anything with more than one process needs Redis. Its key prefix is
    /// `"lock:"`; ttls run on the real clock, not on a paused tokio clock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::LockError> {
    /// use distlock::{LockManager, LockOptions};
    ///
    /// let manager = LockManager::in_process();
    /// let guard = manager.acquire("report", &LockOptions::new()).await?;
    /// assert!(manager.try_acquire("report", &LockOptions::new()).await?.is_none());
    /// guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn in_process() -> LockManager {
        Self::from_parts(in_process_shared())
    }

    /// The manager over `shared`, which the builder made.
    pub(crate) fn from_parts(shared: Shared) -> Self {
        LockManager {
            inner: Arc::new(shared),
        }
    }

    /// The prefix of every lock key.
    ///
    /// ```no_run
    /// # fn example(manager: distlock::LockManager) {
    /// assert_eq!(manager.key_prefix(), "lock:");
    /// # }
    /// ```
    #[must_use]
    pub fn key_prefix(&self) -> &str {
        &self.inner.key_prefix
    }

    /// Takes the lock `name` (Redis key `key_prefix + name`), waiting up to
    /// `options.timeout` while someone else holds it.
    ///
    /// Waiting costs no polling: the holder's release hands the lock to the first waiter in the
    /// lock's line in Redis, and a waiter also looks again when the holder's ttl runs out (a
    /// holder that died releases nothing). Waiters are served first come, first served across
    /// every process that uses the lock (on Redlock, whose masters keep no shared line, among
    /// the tasks of this process only). Cancel-safe: if this future is dropped, nothing is left
    /// held — not even a lock that Redis granted just as the caller gave up. A task that holds
    /// the lock already, inside its guard's [`scope`](LockGuard::scope) (or a
    /// `#[distributed_lock]` body), gets a re-entered guard at once, without a Redis command.
    ///
    /// # Errors
    /// [`LockError::Timeout`] if the lock was still held when the timeout ran out,
    /// [`LockError::Redis`] if Redis failed until the deadline (with the last cause),
    /// [`LockError::Config`] for an out-of-range ttl or timeout, or a lock key that distlock
    /// refuses (see [`LockManagerBuilder::key_prefix`]).
    ///
    /// ```no_run
    /// # async fn example(manager: distlock::LockManager) -> Result<(), distlock::LockError> {
    /// let options = distlock::LockOptions::new().timeout(std::time::Duration::from_secs(2));
    /// let guard = manager.acquire("trace:abc", &options).await?;
    /// guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire(&self, name: &str, options: &LockOptions) -> Result<LockGuard, LockError> {
        // A lock this task holds already is re-entered at once (see `hold::reentry`).
        if let Some(reentered) = crate::hold::reentry::reenter(self, name) {
            return reentered;
        }
        let started = Instant::now();
        let result = match self.here() {
            Ok(here) => here.acquire_waiting(name, options).await,
            Err(error) => Err(error),
        };
        Meter::new(options).acquisition(result.as_ref().map(|_| true), started.elapsed());
        result
    }

    /// [`LockManager::acquire`], without its metrics.
    async fn acquire_waiting(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        let (ttl_millis, keys) = self.prepare(name, options)?;
        let started = Instant::now();
        let deadline = started + options.timeout_duration();
        // The usual case, nobody else here wants this key, needs no timer.
        let turn = match self.inner.queues.try_turn(&keys.lock) {
            Some(turn) => turn,
            None => {
                let waiting = self.inner.queues.wait_turn(&keys.lock);
                let Ok(turn) = tokio::time::timeout_at(deadline, waiting).await else {
                    return Err(timeout(&keys, started));
                };
                turn
            }
        };
        let fencing = options.fencing_enabled();
        let mut machine = Acquisition::new(deadline, Some(crate::backend::RENEW));
        let mut token = new_token(options, self.inner.pid);
        // Where this waiter listens, once it does; and its place in line, left if it gives up.
        let mut listener: Option<GrantWaiter> = None;
        let mut place = PlaceInLine::new(self, &keys);
        // The send time of the attempt that took this token's place in line, while no later
        // attempt has found the lock held. A hand-off to the token can only have been made
        // after that attempt ran (there was no place to hand it to before), so its claim runs
        // at least until then plus the claim. Once a later attempt finds the lock held, a
        // message read since may have been published before that attempt and its claim have
        // run out (a message is read late when the pub/sub connection's reader is held up):
        // Redis is asked instead.
        let mut placed_at: Option<Instant> = None;
        let mut last_error = None;
        // The last attempt's lock, when too few replicas acknowledged it (`wait_for_replicas`):
        // an acquisition that times out after it says so, not that someone held the lock.
        let mut unreplicated: Option<redis::RedisError> = None;
        // A key handed over a moment ago is most likely held: join the line at once. Not for
        // a single attempt (a zero timeout), which must never take a place in line; nor while
        // subscribing fails, as the join waits for a subscription first, and the next attempt
        // is backed off (up to 2 s): the lock may be free, and a plain first try takes it now.
        let mut step = if !options.timeout_duration().is_zero()
            && self.inner.backend.recently_contended(&keys.lock)
            && !self.inner.backend.grants().subscription_failing()
        {
            machine.start_in_line()
        } else {
            machine.start()
        };
        loop {
            step = match step {
                Step::Attempt(request) => {
                    // Listen before asking: a message published while the attempt is in flight
                    // must still wake us; one from before is superseded by the attempt's answer.
                    // A message cleared here may have been a hand-off to this place, whose claim
                    // ran out unseen: the place is off the line, and its renewal looks for it.
                    if listener.as_ref().is_some_and(GrantWaiter::clear) {
                        self.inner.backend.place_may_be_gone(&keys.lock, &token);
                    }
                    // Named only while the channel is subscribed: a release counts who hears
                    // a hand-off, and takes a waiter nobody hears for dead. While the
                    // subscription is down (its connection dropped, and is not back yet), the
                    // place names no channel and is judged by its lease, and the lock handed
                    // to it is found at the next look.
                    let channel = match &listener {
                        Some(listener)
                            if machine.listening()
                                && self.inner.backend.grants().is_subscribed() =>
                        {
                            Some(listener.channel())
                        }
                        _ => None,
                    };
                    let renewing = place.occupied();
                    let wait = match request {
                        Request::FirstTry => Wait::FirstTry,
                        Request::InLine => Wait::InLine { channel, renewing },
                    };
                    if request == Request::InLine {
                        place.occupy(&token);
                    }
                    let sent = Instant::now();
                    let attempt = self.attempt(&keys, &token, ttl_millis, fencing, wait).await;
                    let mut granted = None;
                    let outcome = match attempt {
                        Ok(Attempt::Acquired { fence, expires_in }) => {
                            granted = Some((fence, expires_in));
                            Outcome::Acquired
                        }
                        Ok(Attempt::Held { remaining }) => {
                            unreplicated = None;
                            if request == Request::FirstTry {
                                tracing::debug!(target: "distlock", key = %keys.lock, remaining_ms = remaining.map(micros).map(|us| us / 1000), "contended; waiting");
                            }
                            placed_at = match request {
                                Request::InLine if !renewing => Some(sent),
                                _ => None,
                            };
                            Outcome::Held { remaining }
                        }
                        Err(error) => {
                            unreplicated = crate::backend::as_not_replicated(&error)
                                .is_some()
                                .then(|| error.clone());
                            let permanent = crate::redis::classify::is_permanent(&error);
                            if !permanent {
                                tracing::debug!(target: "distlock", key = %keys.lock, %error, "Redis error while acquiring; retrying");
                            }
                            let outcome = if request == Request::InLine
                                && self.inner.backend.keeps_place_through(&error)
                            {
                                Outcome::Interrupted
                            } else {
                                Outcome::Failed { permanent }
                            };
                            last_error = Some(error);
                            outcome
                        }
                    };
                    let next = machine.attempted(Instant::now(), outcome);
                    if let (Step::Acquired, Some((fence, expires_in))) = (next, granted) {
                        place.vacate();
                        if request == Request::InLine {
                            self.inner.backend.handed_over(&keys.lock);
                        }
                        tracing::debug!(target: "distlock", key = %keys.lock, waited_us = micros(started.elapsed()), fence, "acquired");
                        return Ok(self.guard(keys, token, fence, turn, options, sent, expires_in));
                    }
                    if matches!(outcome, Outcome::Failed { permanent: false })
                        && matches!(next, Step::Sleep { .. })
                    {
                        // The failed attempt may still run (see `attempt`) and is cleaned up by
                        // its token: go on under a new one, listening for that one.
                        place.give_up();
                        listener = None;
                        token = new_token(options, self.inner.pid);
                    }
                    next
                }
                Step::Subscribe => {
                    let grants = self.inner.backend.grants();
                    // Registered before the place is taken: a message published right after
                    // it must reach the waiter.
                    let registered = grants.register(&token);
                    // Bounded by a renewal as well as the deadline: the subscription is made by
                    // the hub's task, which may run on another runtime than this waiter's (the
                    // one that made the manager), whose threads a body may block; a slow pub/sub
                    // connect must not stretch the deadline either.
                    let bound = deadline.min(Instant::now() + crate::backend::RENEW);
                    match tokio::time::timeout_at(bound, grants.subscribed()).await {
                        Ok(Ok(())) => {
                            listener = Some(registered);
                            machine.subscribed(true)
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(target: "distlock", key = %keys.lock, %error, "no wake-up subscription; polling");
                            machine.subscribed(false)
                        }
                        // Not confirmed yet: takes its place meanwhile, as after a lost
                        // connection. The place names the channel once it is subscribed, and
                        // until then the lock handed to the waiter is found at its next look.
                        Err(_) if bound < deadline => {
                            tracing::debug!(target: "distlock", key = %keys.lock, "wake-up subscription not confirmed yet; waiting in line without it meanwhile");
                            listener = Some(registered);
                            machine.subscribed(true)
                        }
                        Err(_) => {
                            tracing::debug!(target: "distlock", key = %keys.lock, "wake-up subscription not confirmed before the deadline; polling");
                            machine.subscribed(false)
                        }
                    }
                }
                Step::Sleep { until, spread } => {
                    let until = (until + jitter(spread)).min(deadline);
                    let woken = match listener.as_ref() {
                        Some(listener) => {
                            tokio::select! {
                                () = tokio::time::sleep_until(until) => None,
                                message = listener.next() => {
                                    // A hand-off takes the place off the line, and a lost
                                    // connection may have lost one: unless the lock turns out
                                    // ours, the next renewal looks for the place.
                                    if !matches!(message, Some(Grant::FenceFailed)) {
                                        self.inner.backend.place_may_be_gone(&keys.lock, &token);
                                    }
                                    message
                                }
                            }
                        }
                        None => {
                            tokio::time::sleep_until(until).await;
                            None
                        }
                    };
                    // Only a release that hands the lock over sends a grant: on Redlock a
                    // message with a fence (or a fencing failure) is not one of ours, and means
                    // at most "look again" — the majority's answers decide.
                    let woken = woken.filter(|_| self.inner.backend.hands_over());
                    // A hand-off is ours for at least the claim, counted from before the
                    // attempt that took the place (the hand-off came after it): trusted while
                    // that is still well ahead.
                    let claim = options.ttl_duration().min(crate::backend::CLAIM);
                    let trusted_since = placed_at
                        .filter(|placed_at| Instant::now() + GRANT_MARGIN < *placed_at + claim);
                    match (woken, trusted_since) {
                        // Handed over. The guard confirms the full ttl.
                        (Some(Grant::Granted { fence }), Some(placed_at))
                            if !self.inner.backend.waits_for_replicas() =>
                        {
                            place.vacate();
                            self.inner.backend.handed_over(&keys.lock);
                            tracing::debug!(target: "distlock", key = %keys.lock, waited_us = micros(started.elapsed()), fence, "acquired (handed over)");
                            let fence = fencing.then_some(fence);
                            return Ok(
                                self.guard(keys, token, fence, turn, options, placed_at, claim)
                            );
                        }
                        // With `wait_for_replicas`: the hand-off was another connection's write,
                        // counted once this waiter's own confirmation of the full ttl is
                        // acknowledged (see `Backend::confirm_replicated`).
                        (Some(Grant::Granted { fence }), Some(_)) => {
                            let sent = Instant::now();
                            match self
                                .inner
                                .backend
                                .confirm_replicated(&keys, &token, ttl_millis)
                                .await
                            {
                                Ok(true) => {
                                    place.vacate();
                                    self.inner.backend.handed_over(&keys.lock);
                                    tracing::debug!(target: "distlock", key = %keys.lock, waited_us = micros(started.elapsed()), fence, "acquired (handed over, replicated)");
                                    let fence = fencing.then_some(fence);
                                    let ttl = options.ttl_duration();
                                    return Ok(
                                        self.guard(keys, token, fence, turn, options, sent, ttl)
                                    );
                                }
                                // Not ours after all: Redis is asked, as after any doubt.
                                Ok(false) => {}
                                Err(error) => {
                                    // Given back, place and all: the next look takes a new
                                    // place at the end of the line.
                                    self.inner.backend.place_may_be_gone(&keys.lock, &token);
                                    unreplicated = crate::backend::as_not_replicated(&error)
                                        .is_some()
                                        .then(|| error.clone());
                                    last_error = Some(error);
                                }
                            }
                            machine.woke()
                        }
                        (Some(Grant::FenceFailed), _) => {
                            place.give_up();
                            return Err(LockError::Redis(fence_failed(&keys)));
                        }
                        // A message read too late to trust (this waiter did not run for a
                        // while), or after a look that found the lock held, or no message: ask
                        // Redis whether the lock is ours now.
                        (Some(Grant::Granted { .. }) | None, _) => machine.woke(),
                    }
                }
                Step::Acquired => {
                    unreachable!("an acquisition returns as soon as it holds the lock")
                }
                Step::TimedOut => {
                    place.give_up();
                    return Err(
                        unreplicated.map_or_else(|| timeout(&keys, started), LockError::from)
                    );
                }
                Step::Failed => {
                    place.give_up();
                    return Err(last_error.map_or_else(|| timeout(&keys, started), LockError::from));
                }
            };
        }
    }

    /// Takes the lock `name` if it is free now: one attempt, no waiting.
    ///
    /// Returns `Ok(None)` when someone else holds it — in Redis, or a task of this process that
    /// holds or waits for it.
    ///
    /// # Errors
    /// [`LockError::Redis`] if Redis could not be asked, [`LockError::Config`] for an
    /// out-of-range ttl or a lock key that distlock refuses (see
    /// [`LockManagerBuilder::key_prefix`]).
    ///
    /// ```no_run
    /// # async fn example(manager: distlock::LockManager) -> Result<(), distlock::LockError> {
    /// match manager.try_acquire("cron:cleanup", &distlock::LockOptions::new()).await? {
    ///     Some(guard) => guard.release().await?,
    ///     None => println!("another worker is on it"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn try_acquire(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        if let Some(reentered) = crate::hold::reentry::reenter(self, name) {
            return reentered.map(Some);
        }
        let started = Instant::now();
        let result = match self.here() {
            Ok(here) => here.try_acquire_once(name, options).await,
            Err(error) => Err(error),
        };
        Meter::new(options).acquisition(result.as_ref().map(Option::is_some), started.elapsed());
        result
    }

    /// [`LockManager::try_acquire`], without its metrics.
    async fn try_acquire_once(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let (ttl_millis, keys) = self.prepare(name, options)?;
        let Some(turn) = self.inner.queues.try_turn(&keys.lock) else {
            return Ok(None);
        };
        let token = new_token(options, self.inner.pid);
        let sent = Instant::now();
        match self
            .attempt(
                &keys,
                &token,
                ttl_millis,
                options.fencing_enabled(),
                Wait::FirstTry,
            )
            .await?
        {
            Attempt::Acquired { fence, expires_in } => {
                tracing::debug!(target: "distlock", key = %keys.lock, fence, "acquired");
                Ok(Some(self.guard(
                    keys, token, fence, turn, options, sent, expires_in,
                )))
            }
            // A connection that sends a command again after a dropped reply may have been
            // answered "held" by the lock its first send took: ask whose it is.
            Attempt::Held { .. }
                if self.inner.backend.resends_commands()
                    && self.inner.backend.is_held(&keys, &token).await? =>
            {
                tracing::debug!(target: "distlock", key = %keys.lock, "acquired (a re-sent SET found its own grant)");
                let expires_in = options.ttl_duration();
                Ok(Some(
                    self.guard(keys, token, None, turn, options, sent, expires_in),
                ))
            }
            Attempt::Held { .. } => Ok(None),
        }
    }

    /// Counts of the manager's internal resources, for tests that check nothing leaks (built
    /// only with the test-only `resource-counts` feature).
    ///
    /// ```no_run
    /// # async fn run(manager: distlock::LockManager) {
    /// assert_eq!(manager.resource_counts().queued_keys, 0);
    /// # }
    /// ```
    #[cfg(feature = "resource-counts")]
    #[must_use]
    pub fn resource_counts(&self) -> ResourceCounts {
        self.inner.backend.resource_counts(self.inner.queues.len())
    }

    /// Checks `options` against what this deployment can do and names the lock's keys (the one
    /// place where a lock key is refused); returns the ttl in milliseconds with the keys.
    fn prepare(&self, name: &str, options: &LockOptions) -> Result<(u64, LockKeys), LockError> {
        let ttl_millis = options.validate()?;
        if options.fencing_enabled() && !self.inner.backend.supports_fencing() {
            return Err(LockError::config(
                "fencing tokens are not available on Redlock: they need one counter that every \
                 acquisition increments in order, and independent masters each count on their \
                 own (a minority may miss increments, or restart at zero); use a standalone or \
                 cluster manager when you need fencing",
            ));
        }
        let mut lock = String::with_capacity(self.inner.key_prefix.len() + name.len());
        lock.push_str(&self.inner.key_prefix);
        lock.push_str(name);
        Ok((ttl_millis, LockKeys::new(lock)?))
    }

    /// The guard of a lock acquired by the attempt sent at `sent`, ours for at least
    /// `expires_in` from then, with its watchdog when the options ask for one. A lock handed
    /// over with a claim shorter than its ttl is confirmed to its full ttl a third into the
    /// claim, unless it is released before (`confirm`); one whose ttl is within the claim was
    /// handed over with its full ttl, and needs nothing.
    #[allow(clippy::too_many_arguments)]
    fn guard(
        &self,
        keys: LockKeys,
        token: Arc<str>,
        fence: Option<u64>,
        turn: Turn,
        options: &LockOptions,
        sent: Instant,
        expires_in: Duration,
    ) -> LockGuard {
        let ttl = options.ttl_duration();
        let held = Held::new(
            Arc::clone(&self.inner),
            keys,
            token,
            fence,
            Expiry {
                ttl,
                span: expires_in,
                valid_until: sent + expires_in,
            },
            // From when Redis answered, which is after it granted: never a shorter hold.
            options
                .hold_at_least_duration()
                .map(|hold| Instant::now() + hold),
            Meter::new(options).hold(),
        );
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

    /// This process's backend (see [`LockManager::here`]).
    pub(crate) fn backend(&self) -> Result<&Backend, LockError> {
        Ok(&self.inner.current()?.backend)
    }

    /// This manager as it works in this process: itself, or in a process forked from the one
    /// that made it, the manager made anew there from the same settings (see `shared`), so
    /// that the child never waits on connections and tasks that only its parent drives.
    fn here(&self) -> Result<Cow<'_, LockManager>, LockError> {
        let current = self.inner.current()?;
        Ok(if Arc::ptr_eq(current, &self.inner) {
            Cow::Borrowed(self)
        } else {
            Cow::Owned(LockManager {
                inner: Arc::clone(current),
            })
        })
    }

    /// One attempt to take the lock. If the caller stops waiting while the command is in
    /// flight, the attempt still completes, and a lock it turns out to have won is released.
    ///
    /// An attempt that fails without an answer (response timeout, dropped connection) may
    /// still have reached Redis: a stopped or overloaded server runs it later and grants the
    /// lock to a caller that has given up, for the whole ttl. So its token is then released too,
    /// in the background, once Redis answers again (on the same connection, so after the
    /// attempt).
    async fn attempt(
        &self,
        keys: &LockKeys,
        token: &Arc<str>,
        ttl_millis: u64,
        fencing: bool,
        wait: Wait,
    ) -> redis::RedisResult<Attempt> {
        let in_line = matches!(wait, Wait::InLine { .. });
        let (manager, request_keys, request_token) =
            (self.clone(), keys.clone(), Arc::clone(token));
        let request = async move {
            manager
                .inner
                .backend
                .try_lock(&request_keys, &request_token, ttl_millis, fencing, wait)
                .await
        };
        let (manager, cleanup_keys, cleanup_token) =
            (self.clone(), keys.clone(), Arc::clone(token));
        let clean_up = move |outcome: Option<redis::RedisResult<Attempt>>| async move {
            match outcome {
                // Granted to a caller that is gone; or it took (or renewed) a place in line,
                // maybe after the waiter's own leaving ran (a call finished in the background
                // is sent late): leave, passing on the lock if it is ours.
                Some(Ok(attempt)) => {
                    let granted = matches!(attempt, Attempt::Acquired { .. });
                    if granted {
                        tracing::debug!(target: "distlock", key = %cleanup_keys.lock, "releasing a lock granted to a cancelled acquire");
                    }
                    if granted || in_line {
                        manager.leave_line(&cleanup_keys, &cleanup_token).await;
                    }
                }
                Some(Err(error)) if !crate::redis::classify::may_have_run(&error) => {}
                // No answer, or none that will ever come (the runtime that drove the attempt
                // shut down): it may have been granted.
                Some(Err(_)) | None => {
                    manager
                        .release_unanswered(&cleanup_keys, &cleanup_token, ttl_millis)
                        .await;
                }
            }
        };
        let outcome = FinishOnDrop::new(request, clean_up.clone()).await;
        if let Err(error) = &outcome {
            // A waiter that keeps its place goes on under this token: its next look finds what
            // this attempt did, and its place is left if it gives up.
            let kept = in_line && self.inner.backend.keeps_place_through(error);
            if crate::redis::classify::may_have_run(error) && !kept {
                crate::acquire::finish::spawn_clean_up(clean_up, None);
            }
        }
        outcome
    }

    /// Takes `token` out of the lock's line, passing on the lock if it was handed to it.
    async fn leave_line(&self, keys: &LockKeys, token: &str) {
        if let Err(error) = self.inner.backend.leave(keys, token).await {
            tracing::debug!(target: "distlock", key = %keys.lock, %error, "could not leave the line; the place lapses with its lease");
        }
    }

    /// Releases whatever `token` was granted by an attempt that got no answer: retries until
    /// Redis answers the release (it then runs after the attempt) or a grant would have expired
    /// anyway. An unanswered release is not enough: if the script is not cached yet, Redis
    /// answers it NOSCRIPT and only a caller still waiting loads the script and tries again.
    async fn release_unanswered(&self, keys: &LockKeys, token: &str, ttl_millis: u64) {
        let give_up = Instant::now() + Duration::from_millis(ttl_millis);
        let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(500));
        let mut rechecked = false;
        loop {
            match self.inner.backend.leave(keys, token).await {
                Ok(true) => {
                    tracing::debug!(target: "distlock", key = %keys.lock, "released a lock granted to an attempt that had failed without an answer");
                    return;
                }
                // Not granted, as far as Redis has run the attempt. An attempt sent on another
                // connection (one whose runtime shut down) can still be in the network: look
                // once more after it has surely landed.
                Ok(false) if !rechecked && Instant::now() + UNANSWERED_RECHECK < give_up => {
                    rechecked = true;
                    tokio::time::sleep(UNANSWERED_RECHECK).await;
                }
                Err(_) if Instant::now() < give_up => {
                    tokio::time::sleep(backoff.next_pause()).await;
                }
                Ok(false) | Err(_) => return,
            }
        }
    }
}

/// Counts of a manager's internal resources (see `LockManager::resource_counts`), for leak tests.
#[cfg(feature = "resource-counts")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceCounts {
    /// Keys with an in-process queue (held or awaited by a task of this process).
    pub queued_keys: usize,
    /// Wake-up channels subscribed to.
    pub watched_channels: usize,
    /// Subscribe and unsubscribe requests waiting to be sent, over all wake-up connections.
    pub wake_requests: usize,
    /// Runtimes with a connection.
    pub connections: usize,
    /// Waiters registered for hand-off messages.
    pub registered_waiters: usize,
}

// Here rather than in `builder`, which lies below the manager: the builder makes the manager's
// inside, and the manager wraps it.
impl LockManagerBuilder {
    /// Connects and checks that Redis answers and lets this user run distlock's scripts (a
    /// majority of the masters, for Redlock), so that a wrong URL, password or ACL fails here
    /// rather than at the first release.
    ///
    /// # Errors
    /// [`LockError::Config`] for a malformed URL, an out-of-range timeout or too few Redlock
    /// masters; [`LockError::Redis`] when Redis cannot be reached within the timeouts or does
    /// not answer like Redis.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), distlock::LockError> {
    /// let manager = distlock::LockManager::builder("redis://127.0.0.1:6379").connect().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(self) -> Result<LockManager, LockError> {
        self.connect_shared().await.map(LockManager::from_parts)
    }
}

impl fmt::Debug for LockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockManager")
            .field("redis", &self.inner.description)
            .field("key_prefix", &self.inner.key_prefix)
            .finish_non_exhaustive()
    }
}

/// The inside of an in-process manager: the process's lock table, and queues of its own.
fn in_process_shared() -> Shared {
    Shared::new(
        Backend::in_process(),
        "lock:".to_owned(),
        "in-process (this process only)".to_owned(),
        Arc::new(|| Ok(in_process_shared())),
    )
}

/// A fresh lock value for one acquisition: a new UUID v4 and who takes the lock (process
/// `pid`, the one the manager's inside was made in: this one).
fn new_token(options: &LockOptions, pid: u32) -> Arc<str> {
    crate::support::identity::new_value(options.encoded_label(), pid)
}

fn to_strings<S: AsRef<str>>(urls: &[S]) -> Vec<String> {
    urls.iter().map(|url| url.as_ref().to_owned()).collect()
}

fn timeout(keys: &LockKeys, started: Instant) -> LockError {
    LockError::Timeout {
        key: keys.lock.to_string(),
        waited: started.elapsed(),
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// The error of a hand-off that could not issue the waiter's fencing token.
fn fence_failed(keys: &LockKeys) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "fencing counter unusable",
        format!(
            "the fencing counter {} could not issue a token (it is not a number, or below 0), so \
             the lock was passed on; set the counter above the largest token your storage has \
             accepted, or delete it if no storage has seen its tokens",
            keys.fence()
        ),
    ))
}

/// A waiter's place in the lock's line. If the acquisition gives up, or is dropped, while it may
/// hold one, it leaves the line — passing on a lock handed to it meanwhile — in the background,
/// also when its runtime is shutting down.
struct PlaceInLine {
    manager: LockManager,
    keys: LockKeys,
    token: Option<Arc<str>>,
}

impl PlaceInLine {
    fn new(manager: &LockManager, keys: &LockKeys) -> Self {
        PlaceInLine {
            manager: manager.clone(),
            keys: keys.clone(),
            token: None,
        }
    }

    /// Whether a place may be held (by the current token: a new token gives the old one up).
    fn occupied(&self) -> bool {
        self.token.is_some()
    }

    /// `token` may hold a place from now on.
    fn occupy(&mut self, token: &Arc<str>) {
        self.token = Some(Arc::clone(token));
    }

    /// The place became the lock: nothing to leave.
    fn vacate(&mut self) {
        self.token = None;
    }

    /// Leaves the line now, in the background.
    fn give_up(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        let (manager, keys) = (self.manager.clone(), self.keys.clone());
        crate::acquire::finish::spawn_clean_up(
            move |_: Option<()>| async move { manager.leave_line(&keys, &token).await },
            None,
        );
    }
}

impl Drop for PlaceInLine {
    fn drop(&mut self) {
        self.give_up();
    }
}
