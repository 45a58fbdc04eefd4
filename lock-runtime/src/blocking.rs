//! The synchronous API: the same locks for code without an async runtime — CLI tools, `rayon`
//! jobs, threads pulling from a queue.
//!
//! [`LockManager`] wraps the async [`crate::LockManager`] and drives it on a runtime that
//! distlock owns (one thread for the whole process, started on first use), the way
//! `reqwest::blocking` does: each call blocks the calling thread until the async operation
//! finishes, while what runs between calls (auto-extension, wake-up subscriptions) keeps running
//! on that thread. Many threads may call it at once.
//!
//! Calling it on a thread where a tokio runtime is current (inside a task, or in
//! `spawn_blocking` there) returns [`LockError::InsideAsyncRuntime`] at once, naming the call
//! and where it was made, instead of blocking: a blocked runtime thread cannot run the tasks
//! that would release the lock, which can deadlock. Use the async API there.
//!
//! # Re-entry
//!
//! The lock of a `#[distributed_lock]` plain `fn` belongs to the thread that runs its body.
//! Waiting for it on that thread while the body runs (the body, or a locked `fn` it calls,
//! taking the same key) is refused at once with [`LockError::Config`], which names the lock:
//! waiting would last until the timeout, since only this thread can release it. Pass the guard
//! down instead. A guard of the manual API is not tied to a thread — it may be handed to
//! another thread, which releases it while this one waits for the lock again — so a second
//! `acquire` of it waits as any other does. `try_acquire` never waits, so it is never refused:
//! it finds the lock held. (Async tasks re-enter the locks they hold instead:
//! see [`crate::LockGuard::scope`].)
//!
//! # Lock order
//!
//! A locked plain `fn` that waits for a lock of another key template while a locked `fn`
//! running on the same thread holds one orders the two templates, as a task does: when two
//! templates are taken in both orders, in this process or by any process of the fleet (the
//! order is recorded once in Redis), one `tracing` warning names both and their functions
//! (see [`crate::LockManager::orders`]). Locks of the manual API have no template: they are not
//! ordered. Their name identifies one lock, not a class, so `invoice:42` then `account:42`
//! would never meet `account:43` then `invoice:43`.
//!
//! ```
//! use distlock::{blocking, distributed_lock, LockError, LockOptions};
//!
//! #[distributed_lock(key = "report:{id}")]
//! fn report(id: u32) -> Result<(), LockError> {
//!     // Waiting here for the lock this body holds would last until the timeout: refused.
//!     let again = blocking::global()?.acquire(&format!("report:{id}"), &LockOptions::new());
//!     assert!(matches!(again, Err(LockError::Config(_))));
//!     Ok(())
//! }
//!
//! blocking::init_with(blocking::LockManager::in_process())?;
//! report(7)?;
//! # Ok::<(), LockError>(())
//! ```
//!
//! A process forked without exec (a pre-fork server, a job runner) may go on using the
//! managers, guards and global manager of its parent: the first call in the child starts a
//! runtime and connections of the child's own, since the parent's threads did not come along.
//! Guards the child inherited stay the parent's: dropping one in the child leaves the lock to
//! the parent.
//!
//! ```no_run
//! # fn main() -> Result<(), distlock::LockError> {
//! use distlock::{blocking, LockOptions};
//!
//! let manager = blocking::LockManager::connect("redis://127.0.0.1:6379")?;
//! let guard = manager.acquire("nightly-report", &LockOptions::new())?;
//! // ... only one process of the fleet runs this ...
//! guard.release()?;
//! # Ok(())
//! # }
//! ```

mod all;

use std::fmt;
use std::future::Future;
use std::panic::Location;
use std::time::Duration;

use once_cell::sync::OnceCell;

use crate::{LockError, LockOptions};

/// Whether the current thread runs (or belongs to) an async runtime.
fn in_async_runtime() -> bool {
    tokio::runtime::Handle::try_current().is_ok()
}

/// Whether the current thread is exiting and has already destroyed tokio's thread-locals (a
/// guard kept in a `thread_local!` is dropped then): no runtime can be entered from it any more,
/// so nothing may block on one.
fn thread_exiting() -> bool {
    tokio::runtime::Handle::try_current().is_err_and(|error| error.is_thread_local_destroyed())
}

/// The error of a blocking call made on a thread of an async runtime.
fn inside_runtime(call: &'static str, location: &'static Location<'static>) -> LockError {
    LockError::InsideAsyncRuntime { call, location }
}

/// Runs `future` to completion on the blocking runtime, from a thread outside any runtime;
/// `call` made at `location` names it in errors.
fn block_on<F: Future>(
    call: &'static str,
    location: &'static Location<'static>,
    future: F,
) -> Result<F::Output, LockError> {
    if in_async_runtime() {
        return Err(inside_runtime(call, location));
    }
    if thread_exiting() {
        return Err(LockError::config(format!(
            "distlock::blocking::{call} was called at {location} while its thread was exiting \
             (from the drop of a thread-local), when no runtime can be entered any more; keep \
             locks out of thread-locals, or release them before the thread ends"
        )));
    }
    // The background runtime's thread drives timers and sockets all the time, so the future can
    // be polled here, on the caller's thread, and what it spawns runs there between calls.
    Ok(crate::support::background::handle().block_on(future))
}

/// Takes and releases locks from synchronous code: the async [`crate::LockManager`] on a
/// runtime that distlock owns.
///
/// Cheap to clone; clones share the connection. `Send + Sync`: share one between threads.
///
/// ```no_run
/// # fn main() -> Result<(), distlock::LockError> {
/// use distlock::{blocking, LockOptions};
/// use std::time::Duration;
///
/// let manager = blocking::LockManager::connect("redis://127.0.0.1:6379")?;
/// let options = LockOptions::new().ttl(Duration::from_secs(60));
/// std::thread::scope(|scope| {
///     for _ in 0..4 {
///         scope.spawn(|| -> Result<(), distlock::LockError> {
///             let guard = manager.acquire("ledger", &options)?;
///             // ... one thread, one process of the fleet at a time ...
///             guard.release()
///         });
///     }
/// });
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LockManager {
    inner: crate::LockManager,
}

impl LockManager {
    /// Connects to the standalone Redis at `url` with the default settings, blocking until it
    /// answers (see [`crate::LockManager::connect`]).
    ///
    /// # Errors
    /// As [`crate::LockManagerBuilder::connect`]; [`LockError::InsideAsyncRuntime`] on a thread
    /// of an async runtime.
    ///
    /// ```no_run
    /// let manager = distlock::blocking::LockManager::connect("redis://127.0.0.1:6379")?;
    /// # Ok::<(), distlock::LockError>(())
    /// ```
    #[track_caller]
    pub fn connect(url: &str) -> Result<LockManager, LockError> {
        Self::builder(url).connect()
    }

    /// Starts building a manager for the standalone Redis at `url`.
    ///
    /// ```no_run
    /// let manager = distlock::blocking::LockManager::builder("redis://127.0.0.1:6379")
    ///     .key_prefix("cli:lock:")
    ///     .connect()?;
    /// # Ok::<(), distlock::LockError>(())
    /// ```
    pub fn builder(url: impl Into<String>) -> LockManagerBuilder {
        LockManagerBuilder::from(crate::LockManager::builder(url))
    }

    /// A manager whose locks live in this process's memory (see
    /// [`crate::LockManager::in_process`]): for tests, and tools that run as one process.
    ///
    /// ```
    /// let manager = distlock::blocking::LockManager::in_process();
    /// let guard = manager.acquire("job", &distlock::LockOptions::new())?;
    /// guard.release()?;
    /// # Ok::<(), distlock::LockError>(())
    /// ```
    #[must_use]
    pub fn in_process() -> LockManager {
        LockManager {
            inner: crate::LockManager::in_process(),
        }
    }

    /// The async manager this one drives, for async parts of the same program.
    ///
    /// ```
    /// let manager = distlock::blocking::LockManager::in_process();
    /// let shared: &distlock::LockManager = manager.as_async();
    /// ```
    #[must_use]
    pub fn as_async(&self) -> &crate::LockManager {
        &self.inner
    }

    /// Takes the lock `name`, blocking up to `options.timeout` while someone else holds it
    /// (see [`crate::LockManager::acquire`]).
    ///
    /// # Errors
    /// As [`crate::LockManager::acquire`]; [`LockError::InsideAsyncRuntime`] on a thread
    /// of an async runtime; [`LockError::Config`] at once, without waiting, when a locked `fn`
    /// running on this thread holds the lock already (see [Re-entry](self#re-entry)).
    ///
    /// ```no_run
    /// # fn example(manager: distlock::blocking::LockManager) -> Result<(), distlock::LockError> {
    /// let guard = manager.acquire("trace:abc", &distlock::LockOptions::new())?;
    /// guard.release()?;
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn acquire(&self, name: &str, options: &LockOptions) -> Result<LockGuard, LockError> {
        crate::manager::reentry::refuse_if_thread_holds(&self.inner, name, "LockManager::acquire")?;
        let guard = block_on(
            "LockManager::acquire",
            Location::caller(),
            self.inner.acquire(name, options),
        )??;
        Ok(LockGuard::new(guard))
    }

    /// One attempt: the guard if the lock was free, `None` if someone holds it (see
    /// [`crate::LockManager::try_acquire`]).
    ///
    /// # Errors
    /// As [`crate::LockManager::try_acquire`]; [`LockError::InsideAsyncRuntime`] on a thread
    /// of an async runtime. (One attempt never waits: on a lock that a locked `fn` running on
    /// this thread holds, it finds it held, `None`.)
    ///
    /// ```no_run
    /// # fn example(manager: distlock::blocking::LockManager) -> Result<(), distlock::LockError> {
    /// if let Some(guard) = manager.try_acquire("cron:cleanup", &distlock::LockOptions::new())? {
    ///     guard.release()?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn try_acquire(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let guard = block_on(
            "LockManager::try_acquire",
            Location::caller(),
            self.inner.try_acquire(name, options),
        )??;
        Ok(guard.map(LockGuard::new))
    }

    /// The prefix of every lock key.
    ///
    /// ```
    /// assert_eq!(distlock::blocking::LockManager::in_process().key_prefix(), "lock:");
    /// ```
    #[must_use]
    pub fn key_prefix(&self) -> &str {
        self.inner.key_prefix()
    }
}

impl From<crate::LockManager> for LockManager {
    /// Drives an async manager (any backend) from synchronous code.
    fn from(inner: crate::LockManager) -> Self {
        LockManager { inner }
    }
}

impl fmt::Debug for LockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::LockManager")
            .field(&self.inner)
            .finish()
    }
}

/// Builds a [`LockManager`]: the async [`crate::LockManagerBuilder`], connected by blocking.
/// `From` any async builder, so cluster and Redlock managers work too.
///
/// ```no_run
/// use distlock::blocking::LockManagerBuilder;
///
/// let cluster = LockManagerBuilder::from(distlock::LockManager::cluster_builder(&[
///     "redis://10.0.0.1:7000",
/// ]))
/// .connect()?;
/// # Ok::<(), distlock::LockError>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `.connect()`"]
pub struct LockManagerBuilder {
    inner: crate::LockManagerBuilder,
}

impl LockManagerBuilder {
    /// See [`crate::LockManagerBuilder::key_prefix`].
    ///
    /// ```
    /// let builder = distlock::blocking::LockManager::builder("redis://127.0.0.1").key_prefix("app:lock:");
    /// ```
    pub fn key_prefix(self, prefix: impl Into<String>) -> Self {
        LockManagerBuilder {
            inner: self.inner.key_prefix(prefix),
        }
    }

    /// See [`crate::LockManagerBuilder::connect_timeout`].
    ///
    /// ```
    /// let builder = distlock::blocking::LockManager::builder("redis://127.0.0.1")
    ///     .connect_timeout(std::time::Duration::from_millis(500));
    /// ```
    pub fn connect_timeout(self, timeout: Duration) -> Self {
        LockManagerBuilder {
            inner: self.inner.connect_timeout(timeout),
        }
    }

    /// See [`crate::LockManagerBuilder::response_timeout`].
    ///
    /// ```
    /// let builder = distlock::blocking::LockManager::builder("redis://127.0.0.1")
    ///     .response_timeout(std::time::Duration::from_millis(250));
    /// ```
    pub fn response_timeout(self, timeout: Duration) -> Self {
        LockManagerBuilder {
            inner: self.inner.response_timeout(timeout),
        }
    }

    /// See [`crate::LockManagerBuilder::wait_for_replicas`].
    ///
    /// ```
    /// let builder = distlock::blocking::LockManager::builder("redis://127.0.0.1")
    ///     .wait_for_replicas(1, std::time::Duration::from_millis(100));
    /// ```
    pub fn wait_for_replicas(self, n: u32, timeout: Duration) -> Self {
        LockManagerBuilder {
            inner: self.inner.wait_for_replicas(n, timeout),
        }
    }

    /// Connects, blocking until Redis answers (see [`crate::LockManagerBuilder::connect`]).
    ///
    /// # Errors
    /// As [`crate::LockManagerBuilder::connect`]; [`LockError::InsideAsyncRuntime`] on a
    /// thread of an async runtime.
    ///
    /// ```no_run
    /// let manager = distlock::blocking::LockManager::builder("redis://127.0.0.1:6379").connect()?;
    /// # Ok::<(), distlock::LockError>(())
    /// ```
    #[track_caller]
    pub fn connect(self) -> Result<LockManager, LockError> {
        let inner = block_on(
            "LockManagerBuilder::connect",
            Location::caller(),
            self.inner.connect(),
        )??;
        Ok(LockManager { inner })
    }
}

impl From<crate::LockManagerBuilder> for LockManagerBuilder {
    fn from(inner: crate::LockManagerBuilder) -> Self {
        LockManagerBuilder { inner }
    }
}

/// A lock held from synchronous code.
///
/// Released by [`release`](LockGuard::release), or when dropped — on return, on `?`, while a
/// panic unwinds — before the drop returns, so the next thread can take it at once. A drop on a
/// thread of an async runtime, or on an exiting thread (a guard kept in a `thread_local!`),
/// releases in the background instead.
///
/// ```no_run
/// # fn example(manager: distlock::blocking::LockManager) -> Result<(), distlock::LockError> {
/// let guard = manager.acquire("invoice:42", &distlock::LockOptions::new())?;
/// guard.extend(std::time::Duration::from_secs(30))?; // more time, only if still ours
/// guard.release()?; // Err(LockError::Lost) if it expired meanwhile
/// # Ok(())
/// # }
/// ```
pub struct LockGuard {
    /// `None` once released.
    inner: Option<crate::LockGuard>,
}

impl LockGuard {
    fn new(inner: crate::LockGuard) -> Self {
        LockGuard { inner: Some(inner) }
    }

    /// The async guard inside.
    pub(crate) fn held(&self) -> &crate::LockGuard {
        self.inner
            .as_ref()
            .expect("distlock: a blocking guard holds its lock until release or drop")
    }

    /// The full Redis key of the lock (`key_prefix + name`).
    ///
    /// ```no_run
    /// # fn example(guard: distlock::blocking::LockGuard) {
    /// assert_eq!(guard.key(), "lock:invoice:42");
    /// # }
    /// ```
    #[must_use]
    pub fn key(&self) -> &str {
        self.held().key()
    }

    /// Every full Redis key the guard holds, the first being [`key`](Self::key) (see
    /// [`crate::LockGuard::keys`]).
    ///
    /// ```no_run
    /// # fn example(guard: distlock::blocking::LockGuard) {
    /// for key in guard.keys() {
    ///     println!("holding {key}");
    /// }
    /// # }
    /// ```
    #[must_use]
    pub fn keys(&self) -> Vec<&str> {
        self.held().keys()
    }

    /// The key, shared rather than copied: for a warning after the guard is gone.
    pub(crate) fn shared_key(&self) -> std::sync::Arc<str> {
        self.held().shared_key()
    }

    /// The token stored in the lock key: a fresh UUID v4 for every acquisition.
    ///
    /// ```no_run
    /// # fn example(guard: distlock::blocking::LockGuard) {
    /// assert_eq!(guard.token().len(), 36);
    /// # }
    /// ```
    #[must_use]
    pub fn token(&self) -> &str {
        self.held().token()
    }

    /// The fencing token, when acquired with `fencing(true)` (see
    /// [`crate::LockGuard::fencing_token`]).
    ///
    /// ```no_run
    /// # fn example(guard: distlock::blocking::LockGuard) {
    /// if let Some(token) = guard.fencing_token() { println!("write with fence {token}"); }
    /// # }
    /// ```
    #[must_use]
    pub fn fencing_token(&self) -> Option<u64> {
        self.held().fencing_token()
    }

    /// Sets the lock's remaining time to live to `ttl`, if it is still ours.
    ///
    /// # Errors
    /// As [`crate::LockGuard::extend`]; [`LockError::InsideAsyncRuntime`] on a thread of an async
    /// runtime.
    ///
    /// ```no_run
    /// # fn example(guard: distlock::blocking::LockGuard) -> Result<(), distlock::LockError> {
    /// guard.extend(std::time::Duration::from_secs(30))?;
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        block_on(
            "LockGuard::extend",
            Location::caller(),
            self.held().extend(ttl),
        )?
    }

    /// Asks Redis whether the lock is still ours.
    ///
    /// # Errors
    /// As [`crate::LockGuard::is_held`]; [`LockError::InsideAsyncRuntime`] on a thread of an async
    /// runtime.
    ///
    /// ```no_run
    /// # fn example(guard: distlock::blocking::LockGuard) -> Result<(), distlock::LockError> {
    /// if !guard.is_held()? { eprintln!("lost {}", guard.key()); }
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn is_held(&self) -> Result<bool, LockError> {
        block_on(
            "LockGuard::is_held",
            Location::caller(),
            self.held().is_held(),
        )?
    }

    /// Whether the guard already knows the lock is lost (no Redis call): the auto-extension
    /// watchdog gave it up, or `extend` found it gone.
    ///
    /// ```no_run
    /// # fn example(guard: distlock::blocking::LockGuard) {
    /// if guard.is_lost() { /* stop writing */ }
    /// # }
    /// ```
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.held().is_lost()
    }

    /// Why the lock was lost, once the guard knows it is (as
    /// [`crate::LockGuard::lost_cause`]); `None` while it is not known lost.
    ///
    /// ```no_run
    /// # fn example(guard: distlock::blocking::LockGuard) {
    /// if let Some(cause) = guard.lost_cause() { eprintln!("lost: {cause}"); }
    /// # }
    /// ```
    #[must_use]
    pub fn lost_cause(&self) -> Option<crate::LostCause> {
        self.held().lost_cause()
    }

    /// Releases the lock with an atomic compare-and-delete and wakes the next waiter.
    ///
    /// # Errors
    /// As [`crate::LockGuard::release`]; [`LockError::InsideAsyncRuntime`] on a thread of an
    /// async runtime, [`LockError::Config`] on a thread that is exiting (the lock is then
    /// released in the background either way).
    ///
    /// ```no_run
    /// # fn example(guard: distlock::blocking::LockGuard) -> Result<(), distlock::LockError> {
    /// guard.release()?;
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn release(mut self) -> Result<(), LockError> {
        // Only `release` and `drop` take the guard, and each runs once.
        let Some(guard) = self.inner.take() else {
            return Ok(());
        };
        if in_async_runtime() {
            // Dropping the async guard releases in the background.
            drop(guard);
            return Err(inside_runtime("LockGuard::release", Location::caller()));
        }
        block_on("LockGuard::release", Location::caller(), guard.release())?
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(guard) = self.inner.take() else {
            return;
        };
        if in_async_runtime() || thread_exiting() || guard.is_inherited() {
            // Dropping the async guard releases in the background, which needs nothing from
            // this thread (and leaves a guard inherited by a forked process to its parent).
            return;
        }
        let key = guard.shared_key();
        // A lock lost meanwhile is the holder's business, as with the async guard's drop.
        if let Ok(Err(error)) = block_on("LockGuard::drop", Location::caller(), guard.release()) {
            if !matches!(error, LockError::Lost { .. }) {
                tracing::warn!(target: "distlock", key = %key, %error, "release on drop failed; the lock expires at the end of its ttl");
            }
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Some(guard) => f.debug_tuple("blocking::LockGuard").field(guard).finish(),
            None => f.write_str("blocking::LockGuard(released)"),
        }
    }
}

static GLOBAL: OnceCell<LockManager> = OnceCell::new();

/// Connects to Redis at `url` and installs the connection as the global blocking manager, used
/// by every `#[distributed_lock]` plain `fn`. Call it once, at startup.
///
/// # Errors
/// [`LockError::AlreadyInitialized`] if a global blocking manager is already installed; as
/// [`LockManager::connect`] otherwise. A failure is remembered: until an `init` succeeds,
/// locked calls fail with [`LockError::InitFailed`] and its cause.
///
/// ```no_run
/// fn main() -> Result<(), distlock::LockError> {
///     distlock::blocking::init("redis://127.0.0.1:6379")?;
///     Ok(())
/// }
/// ```
#[track_caller]
pub fn init(url: &str) -> Result<(), LockError> {
    if GLOBAL.get().is_some() {
        return Err(LockError::AlreadyInitialized);
    }
    let result = LockManager::connect(url).and_then(init_with);
    if let Err(error) = &result {
        crate::global::remember_failure("distlock::blocking::init", error);
    }
    result
}

/// Installs a manager built by hand as the global blocking manager.
///
/// # Errors
/// [`LockError::AlreadyInitialized`] if a global blocking manager is already installed.
///
/// ```
/// distlock::blocking::init_with(distlock::blocking::LockManager::in_process())?;
/// # Ok::<(), distlock::LockError>(())
/// ```
pub fn init_with(manager: LockManager) -> Result<(), LockError> {
    GLOBAL
        .set(manager)
        .map_err(|_| LockError::AlreadyInitialized)
}

/// The global blocking manager: the one [`init`] or [`init_with`] installed; else the async
/// global manager ([`crate::init`]), if one is installed, so a program that has both kinds of
/// function initializes once.
///
/// # Errors
/// [`LockError::NotInitialized`] when neither is installed; [`LockError::InitFailed`], with
/// its cause, when an `init` failed and none succeeded since.
///
/// ```no_run
/// let manager = distlock::blocking::global()?;
/// let guard = manager.acquire("job:7", &distlock::LockOptions::new())?;
/// # Ok::<(), distlock::LockError>(())
/// ```
pub fn global() -> Result<&'static LockManager, LockError> {
    GLOBAL.get_or_try_init(|| crate::global().map(|manager| LockManager::from(manager.clone())))
}
