//! [`LockManager`]: connects to Redis and takes locks.

use std::fmt;
use std::future::{poll_fn, Future};
use std::hash::{BuildHasher, Hasher};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Attempt, Backend, Wait};
use crate::builder::{LockManagerBuilder, Topology};
use crate::finish::FinishOnDrop;
use crate::keys::LockKeys;
use crate::queue::{LocalQueues, Turn};
use crate::wake::Watch;
use crate::{LockError, LockGuard, LockOptions};

/// Waiters that are not subscribed to wake-ups (the subscription failed) retry at least this
/// often, so a missed release costs them at most this much.
const UNSUBSCRIBED_POLL: Duration = Duration::from_millis(200);
/// Spread of the retries of waiters that wake at the same moment (a ttl running out).
const RETRY_JITTER: Duration = Duration::from_millis(2);
/// Backoff after a Redis error while acquiring: from the first to the last value, doubling.
const ERROR_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_millis(500));

/// Takes and releases locks on one Redis deployment.
///
/// Cheap to clone (an `Arc` inside); clones share connections, wake-up subscriptions and the
/// in-process queue of each key. Usable from any tokio runtime: each runtime that uses it gets
/// its own multiplexed connection, so one global manager serves every `#[tokio::test]`.
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
    inner: Arc<Inner>,
}

struct Inner {
    backend: Backend,
    key_prefix: String,
    queues: Arc<LocalQueues>,
    /// Where it connects, passwords hidden: for `Debug`.
    description: String,
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

    /// A manager over `backend`, before any Redis call.
    pub(crate) fn new(backend: Backend, key_prefix: String, description: String) -> Self {
        LockManager {
            inner: Arc::new(Inner {
                backend,
                key_prefix,
                queues: Arc::new(LocalQueues::default()),
                description,
            }),
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
    /// Waiting costs no polling: a waiter is woken by the holder's release, or retries when the
    /// holder's ttl runs out. Tasks of this process that wait for the same lock are served first
    /// come, first served. Cancel-safe: if this future is dropped, nothing is left held — not
    /// even a lock that Redis granted just as the caller gave up.
    ///
    /// # Errors
    /// [`LockError::Timeout`] if the lock was still held when the timeout ran out,
    /// [`LockError::Redis`] if Redis failed until the deadline (with the last cause),
    /// [`LockError::Config`] for an out-of-range ttl or timeout.
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
        let mut token = new_token();
        let mut watch = None;
        let mut contended = false;
        let mut backoff = ERROR_BACKOFF.0;
        let mut wait = Wait::FirstTry;
        loop {
            // Listen before asking: a release published while the attempt is in flight must
            // still wake us.
            let mut wake_up = watch.as_ref().map(Watch::next_release);
            let sent = Instant::now();
            let attempt = self
                .attempt(&keys, &token, ttl_millis, options.fencing_enabled(), wait)
                .await;
            let pause = match attempt {
                Ok(Attempt::Acquired { fence }) => {
                    let waited = started.elapsed();
                    tracing::debug!(target: "distlock", key = %keys.lock, waited_us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX), fence, "acquired");
                    return Ok(self.guard(keys, token, fence, turn, options, sent));
                }
                Ok(Attempt::Held { remaining }) => {
                    if !contended {
                        contended = true;
                        tracing::debug!(target: "distlock", key = %keys.lock, remaining_ms = remaining.map(|r| u64::try_from(r.as_millis()).unwrap_or(u64::MAX)), "contended; waiting");
                    }
                    if Instant::now() >= deadline {
                        return Err(timeout(&keys, started));
                    }
                    // From now on ask for the holder's ttl (and mark the wait, once subscribed).
                    wait = if watch.is_some() {
                        Wait::Subscribed
                    } else {
                        Wait::Poll
                    };
                    if watch.is_none() {
                        // Bounded by the deadline: a slow pub/sub connect must not stretch it.
                        let subscribing =
                            tokio::time::timeout_at(deadline, self.inner.backend.watch(&keys));
                        match subscribing
                            .await
                            .unwrap_or_else(|_| Err(subscribe_too_late()))
                        {
                            // Subscribed: ask again at once, now marked as waiting.
                            Ok(subscribed) => {
                                watch = Some(subscribed);
                                wait = Wait::Subscribed;
                                continue;
                            }
                            Err(error) => {
                                tracing::debug!(target: "distlock", key = %keys.lock, %error, "no wake-up subscription; polling")
                            }
                        }
                    }
                    let until_expiry = remaining
                        .unwrap_or(UNSUBSCRIBED_POLL)
                        .max(Duration::from_millis(1));
                    let pause = if watch.is_some() {
                        until_expiry
                    } else {
                        until_expiry.min(UNSUBSCRIBED_POLL)
                    };
                    pause + jitter(RETRY_JITTER)
                }
                Err(error) => {
                    // An error that retrying cannot cure (a permission, a script error) is
                    // reported at once rather than at the deadline.
                    if Instant::now() >= deadline || is_permanent(&error) {
                        return Err(LockError::Redis(error));
                    }
                    tracing::debug!(target: "distlock", key = %keys.lock, %error, "Redis error while acquiring; retrying");
                    // The failed attempt may still run (see `attempt`) and is released by its
                    // token: retry under a new one, so that release cannot hit a later grant.
                    token = new_token();
                    let pause = backoff + jitter(backoff / 2);
                    backoff = (backoff * 2).min(ERROR_BACKOFF.1);
                    pause
                }
            };
            let mut sleep = pin!(tokio::time::sleep_until(
                (Instant::now() + pause).min(deadline)
            ));
            poll_fn(|cx| {
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(());
                }
                match wake_up.as_mut() {
                    Some(wake_up) => wake_up.as_mut().poll(cx),
                    None => Poll::Pending,
                }
            })
            .await;
        }
    }

    /// Takes the lock `name` if it is free now: one attempt, no waiting.
    ///
    /// Returns `Ok(None)` when someone else holds it — in Redis, or a task of this process that
    /// holds or waits for it.
    ///
    /// # Errors
    /// [`LockError::Redis`] if Redis could not be asked, [`LockError::Config`] for an
    /// out-of-range ttl.
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
        let (ttl_millis, keys) = self.prepare(name, options)?;
        let Some(turn) = self.inner.queues.try_turn(&keys.lock) else {
            return Ok(None);
        };
        let token = new_token();
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
            Attempt::Acquired { fence } => {
                tracing::debug!(target: "distlock", key = %keys.lock, fence, "acquired");
                Ok(Some(self.guard(keys, token, fence, turn, options, sent)))
            }
            Attempt::Held { .. } => Ok(None),
        }
    }

    /// Counts of the manager's internal resources, for tests that check nothing leaks.
    #[doc(hidden)]
    #[must_use]
    pub fn resource_counts(&self) -> ResourceCounts {
        let (connections, watched_channels, wake_requests) = self.inner.backend.resource_counts();
        ResourceCounts {
            queued_keys: self.inner.queues.len(),
            watched_channels,
            wake_requests,
            connections,
        }
    }

    /// Checks `options` against what this deployment can do and names the lock's keys; returns
    /// the ttl in milliseconds with the keys.
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
        Ok((ttl_millis, LockKeys::new(lock)))
    }

    /// The guard of a lock just acquired with the attempt sent at `sent`, with its watchdog
    /// when the options ask for one.
    fn guard(
        &self,
        keys: LockKeys,
        token: Arc<str>,
        fence: Option<u64>,
        turn: Turn,
        options: &LockOptions,
        sent: Instant,
    ) -> LockGuard {
        let mut guard = LockGuard::new(self.clone(), keys, token, fence, turn);
        if options.auto_extend_enabled() {
            guard.start_watchdog(options.ttl_duration(), sent);
        }
        guard
    }

    pub(crate) fn backend(&self) -> &Backend {
        &self.inner.backend
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
        let outcome = FinishOnDrop::new(request, move |outcome| async move {
            match outcome {
                Ok(Attempt::Acquired { .. }) => {
                    tracing::debug!(target: "distlock", key = %cleanup_keys.lock, "releasing a lock granted to a cancelled acquire");
                    let _ = manager
                        .inner
                        .backend
                        .unlock(&cleanup_keys, &cleanup_token)
                        .await;
                }
                Err(error) if may_have_run(&error) => {
                    manager
                        .release_unanswered(&cleanup_keys, &cleanup_token, ttl_millis)
                        .await;
                }
                _ => {}
            }
        })
        .await;
        if let Err(error) = &outcome {
            if may_have_run(error) {
                let (manager, keys, token) = (self.clone(), keys.clone(), Arc::clone(token));
                drop(tokio::spawn(async move {
                    manager.release_unanswered(&keys, &token, ttl_millis).await;
                }));
            }
        }
        outcome
    }

    /// Releases whatever `token` was granted by an attempt that got no answer: retries until
    /// Redis answers the release (it then runs after the attempt) or a grant would have expired
    /// anyway. An unanswered release is not enough: if the script is not cached yet, Redis
    /// answers it NOSCRIPT and only a caller still waiting loads the script and tries again.
    async fn release_unanswered(&self, keys: &LockKeys, token: &str, ttl_millis: u64) {
        let give_up = Instant::now() + Duration::from_millis(ttl_millis);
        let mut backoff = ERROR_BACKOFF.0;
        loop {
            match self.inner.backend.unlock(keys, token).await {
                Ok(released) => {
                    if released {
                        tracing::debug!(target: "distlock", key = %keys.lock, "released a lock granted to an attempt that had failed without an answer");
                    }
                    return;
                }
                Err(_) if Instant::now() + backoff < give_up => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(ERROR_BACKOFF.1);
                }
                Err(_) => return,
            }
        }
    }
}

/// Counts of a manager's internal resources (see `LockManager::resource_counts`).
#[doc(hidden)]
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
}

impl fmt::Debug for LockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockManager")
            .field("redis", &self.inner.description)
            .field("key_prefix", &self.inner.key_prefix)
            .finish_non_exhaustive()
    }
}

fn subscribe_too_late() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the wake-up subscription was not confirmed before the acquire deadline",
    ))
}

/// Whether retrying cannot help: Redis refused the command itself (a permission, a script
/// error, a wrong type), as opposed to a connection problem, a timeout or a cluster in flux.
///
/// A key of another type (`WRONGTYPE`) reaches redis-rs as an error code it does not know, so
/// it is recognised by its code; other unknown codes (`OOM`, say) may pass, and are retried.
fn is_permanent(error: &redis::RedisError) -> bool {
    let refused = matches!(error.retry_method(), redis::RetryMethod::NoRetry)
        && matches!(error.kind(), redis::ErrorKind::Server(_));
    refused || is_wrong_type(error)
}

/// Whether Redis answered `WRONGTYPE`: the lock's key holds something that is not a lock.
pub(crate) fn is_wrong_type(error: &redis::RedisError) -> bool {
    error.code() == Some("WRONGTYPE") || error.to_string().contains("WRONGTYPE")
}

/// A fresh UUID v4 for one acquisition, in one allocation.
fn new_token() -> Arc<str> {
    let mut buffer = uuid::Uuid::encode_buffer();
    Arc::from(&*uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buffer))
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

/// Whether a request that failed with `error` may still have reached Redis and run there.
fn may_have_run(error: &redis::RedisError) -> bool {
    error.is_timeout() || (error.is_connection_dropped() && !error.is_connection_refusal())
}

/// A random duration in `0..=max`: spreads retries of waiters that woke together.
pub(crate) fn jitter(max: Duration) -> Duration {
    let max_micros = u64::try_from(max.as_micros()).unwrap_or(u64::MAX);
    if max_micros == 0 {
        return Duration::ZERO;
    }
    // RandomState is seeded randomly per thread and stepped per instance: cheap randomness
    // without another dependency.
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    Duration::from_micros(random % (max_micros + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_its_bound() {
        for _ in 0..1000 {
            assert!(jitter(Duration::from_millis(2)) <= Duration::from_millis(2));
        }
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
    }
}
