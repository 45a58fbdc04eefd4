//! [`LockManager`]: connects to Redis and takes locks.

mod all;
mod attempt;
mod deadlock;
mod driver;
mod kind;
mod place;
pub(crate) mod reentry;

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use crate::backend::keys::{Kind, LockKeys};
use crate::backend::Backend;
use crate::builder::{LockManagerBuilder, Topology};
use crate::meters::{Meter, Stopwatch};
use crate::shared::Shared;
use crate::{LockError, LockGuard, LockOptions};
pub(crate) use kind::of as kind_of;

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
    pub(crate) inner: Arc<Shared>,
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
    /// the same scheme, else `connect` fails with [`LockError::Config`];
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
    /// refuses (see [`LockManagerBuilder::key_prefix`]), [`LockError::Deadlock`] when this task
    /// holds locks (in their scopes) and this wait closes a wait-for cycle of which it is the
    /// member chosen to give up.
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
        // A lock this task holds already is re-entered at once (see `reentry`).
        if let Some(reentry) = reentry::reenter(self, name, options) {
            return reentry.await;
        }
        let started = Stopwatch::start();
        let result = match self.here() {
            Ok(here) => here.acquire_watching(name, options).await,
            Err(error) => Err(error),
        };
        Meter::new(options).acquisition(result.as_ref().map(|_| true), started);
        result
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
        if let Some(reentry) = reentry::reenter(self, name, options) {
            return reentry.await.map(Some);
        }
        let started = Stopwatch::start();
        let result = match self.here() {
            Ok(here) => here.try_acquire_once(name, options).await,
            Err(error) => Err(error),
        };
        Meter::new(options).acquisition(result.as_ref().map(Option::is_some), started);
        result
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
    pub fn resource_counts(&self) -> crate::ResourceCounts {
        self.inner.backend.resource_counts(self.inner.queues.len())
    }

    /// Checks `options` against what this deployment can do and names the lock's keys (the one
    /// place where a lock key is refused); returns the ttl in milliseconds with the keys.
    pub(crate) fn prepare(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> Result<(u64, LockKeys), LockError> {
        let ttl_millis = options.validate()?;
        if options.fencing_enabled() && !self.inner.backend.capabilities().fencing {
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
        let keys = LockKeys::new(lock)?;
        match kind::of(options) {
            Kind::Mutex => Ok((ttl_millis, keys)),
            kind => Ok((ttl_millis, self.leased(keys, kind)?)),
        }
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

fn to_strings<S: AsRef<str>>(urls: &[S]) -> Vec<String> {
    urls.iter().map(|url| url.as_ref().to_owned()).collect()
}
