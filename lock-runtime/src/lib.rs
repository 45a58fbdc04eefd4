//! The runtime of [distlock](https://docs.rs/distlock): the Redis lock manager, its guards, and
//! the global client behind `#[distributed_lock]`. Use it through the `distlock` crate, which
//! re-exports everything here.
//!
//! ```no_run
//! # async fn example() -> Result<(), lock_runtime::LockError> {
//! use lock_runtime::{LockManager, LockOptions};
//!
//! let manager = LockManager::connect("redis://127.0.0.1:6379").await?;
//! let guard = manager.acquire("trace:abc", &LockOptions::new()).await?;
//! // ... only one holder of lock:trace:abc at a time, fleet-wide ...
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # The path of a lock: acquire → body → release
//!
//! 1. **Acquire.** `#[distributed_lock]` formats the key, opens the call's `distlock.lock` span
//!    (`attribute::span`) and calls `attribute::acquire`, which
//!    asks the global manager (`global`) for [`LockManager::acquire`]. The manager names the
//!    lock's Redis keys (`keys`), waits for its turn among the tasks of this process that want
//!    the same key (`queue`), then lets the state machine of `acquire` decide each step: a first
//!    try (a plain `SET NX PX`), then a place in the lock's line in Redis (on Redlock, in each
//!    master's wake list), sleeping until a hand-off message or a wake-up (`grants`), the
//!    holder's expiry or the next renewal — until the lock is its own or the timeout runs out.
//!    Every Redis operation goes through the one seam, `backend`. A Redis error is retried with
//!    backoff (`retry`) unless `classify` says retrying cannot cure it.
//! 2. **Body.** The caller gets a [`LockGuard`]. A lock handed over holds on a short claim
//!    until its full ttl is confirmed, a third into the claim, on the background runtime
//!    (`confirm`). With auto-extension, a `watchdog` task extends
//!    the lock every ttl/3, sharing what it knows (`held`) with the guard; `attribute::run` races
//!    the body against the watchdog and cancels the body when the lock is lost.
//! 3. **Release.** [`LockGuard::release`] runs the release script (`scripts`): compare-and-delete
//!    by token, handing the lock to the next in line. A guard dropped without a release (panic,
//!    cancellation) releases on the process-wide `background` runtime, and an acquire dropped
//!    while its command was in flight is finished there too (`finish`), so no clean-up depends on
//!    the caller's runtime.
//!
//! # The modules, from the bottom up
//!
//! Each module's code uses only modules listed before it (its documentation may link ahead):
//! there are no loops. A held lock keeps the
//! manager's inside (`shared`), not the manager, so `held`, `watchdog` and `guard` lie below
//! `manager`; `builder` makes the inside that `manager` wraps.
//!
//! | module | what it holds |
//! |---|---|
//! | `classify` | what a Redis error means, whichever server worded it |
//! | `error` | [`LockError`]: what went wrong and what to do |
//! | `retry` | the pauses between tries: one `Backoff`, and jitter |
//! | `identity` | the lock's value: its UUID, then who holds it (host, pid, since, label) |
//! | `options` | [`LockOptions`], the limits on durations, a connection's `Timeouts` |
//! | `meters` | metrics through the `metrics` facade (the `metrics` feature) |
//! | `keys` | the lock key and its helper keys: one cluster slot, namespaces that cannot meet |
//! | `background` | the process-wide runtime for clean-up that outlives its caller (one per process, also after a fork) |
//! | `sentinel` | which server is a Sentinel service's master now |
//! | `diagnose` | which server settings can break locks (eviction), and their fix |
//! | `eviction` | the eviction check after a connect: one warning per server |
//! | `connection` | connections to one endpoint, per tokio runtime, with timeouts |
//! | `scripts` | the Lua scripts, with their `KEYS`, `ARGV` and replies |
//! | `finish` | finishing a Redis call whose caller stopped waiting |
//! | `grants` | messages to one waiter: a hand-off, or a wake-up on Redlock |
//! | `backend` | the seam: one endpoint, a server or a cluster (`node`); Redlock's majority (`quorum`); the in-process table (`memory`); what a manager recently learned of a key (`recent`) |
//! | `queue` | the in-process first-come-first-served line per key |
//! | `acquire` | the waiting protocol as a state machine, without I/O |
//! | `shared` | the inside of a manager: backend, key prefix, queues; made anew in a forked process |
//! | `held` | what a held lock's guard and watchdog share |
//! | `watchdog` | auto-extension |
//! | `confirm` | the lazy confirmation of a lock handed over on its claim |
//! | `guard` | [`LockGuard`] |
//! | `builder` | [`LockManagerBuilder`]; it makes a manager's inside |
//! | `manager` | [`LockManager`], and [`LockManagerBuilder::connect`], which wraps the inside |
//! | `inspect` | [`LockInfo`], [`Holder`]: `inspect`, `list`, `force_release` |
//! | `global` | the global manager ([`init`], [`global()`]) |
//! | `blocking` | the same API for synchronous code |
//! | `attribute` | what the attribute's code calls |
//!
//! The long-form documents (the API by type, the waiting protocol with its diagrams,
//! reliability, backends, keys) are in the repository's `docs/` directory.

// Nothing in this crate needs `unsafe`, so no change may bring it in unnoticed.
#![forbid(unsafe_code)]

mod acquire;
#[doc(hidden)]
pub mod attribute;
mod backend;
mod background;
pub mod blocking;
mod builder;
mod classify;
mod confirm;
mod connection;
pub mod diagnose;
mod error;
mod eviction;
mod finish;
mod global;
mod grants;
mod guard;
mod held;
mod identity;
mod inspect;
mod keys;
mod manager;
mod meters;
mod options;
mod queue;
mod retry;
mod scripts;
mod sentinel;
mod shared;
mod watchdog;

pub use builder::LockManagerBuilder;
pub use error::{LockError, LostCause};
pub use global::{global, init, init_with};
pub use guard::LockGuard;
pub use inspect::{Holder, LockInfo};
pub use manager::LockManager;
#[cfg(feature = "resource-counts")]
pub use manager::ResourceCounts;
pub use options::LockOptions;
/// For the code `#[distributed_lock]` generates: it runs the locked call in its span.
#[doc(hidden)]
pub use tracing::Instrument;

/// A Redis URL with every password in it hidden (`***`), as distlock's own errors and `Debug`
/// output show URLs: for a program's own messages about where it connects.
///
/// It fails safe rather than parsing the URL: everything between `://` and the last `@` is
/// hidden but for a user name, and so is the value of every query parameter whose name
/// contains `pass`, so that a password holding `/`, `?`, `#` or `@` is not shown in part.
///
/// ```
/// assert_eq!(
///     distlock::redact_url("redis://app:s3cret@cache:6379/0"),
///     "redis://app:***@cache:6379/0"
/// );
/// ```
#[must_use]
pub fn redact_url(url: &str) -> String {
    builder::redact(url)
}
