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
//!    lock's Redis keys (`backend::keys`), waits for its turn among the tasks of this process that want
//!    the same key (`acquire::queue`), then lets the state machine of `acquire::machine` decide each step: a first
//!    try (a plain `SET NX PX`), then a place in the lock's line in Redis (on Redlock, in each
//!    master's wake list), sleeping until a hand-off message or a wake-up (`backend::grants`), the
//!    holder's expiry or the next renewal — until the lock is its own or the timeout runs out.
//!    Every Redis operation goes through the one seam, `backend`. A Redis error is retried with
//!    backoff (`support::retry`) unless `redis::classify` says retrying cannot cure it.
//! 2. **Body.** The caller gets a [`LockGuard`]. A lock handed over holds on a short claim
//!    until its full ttl is confirmed, a third into the claim, on the background runtime
//!    (`hold::confirm`). With auto-extension, a `hold::watchdog` task extends
//!    the lock every ttl/3, sharing what it knows (`hold::held`) with the guard; `attribute::run` races
//!    the body against the watchdog and cancels the body when the lock is lost. It runs the body
//!    in the guard's scope (`hold::reentry`): there, the task asking for the same lock again
//!    re-enters it, and asking for another records the order of the two templates
//!    (`support::order`), which warns when two templates are taken in both orders.
//! 3. **Release.** [`LockGuard::release`] runs the release script (`backend::scripts`): compare-and-delete
//!    by token, handing the lock to the next in line. A guard dropped without a release (panic,
//!    cancellation) releases on the process-wide `support::background` runtime, and an acquire dropped
//!    while its command was in flight is finished there too (`acquire::finish`), so no clean-up depends on
//!    the caller's runtime.
//!
//! # The folders, from the bottom up
//!
//! The folders are listed from the bottom up: a folder's code uses the ones above it in the
//! table, and the upward uses that remain are being taken out. The public types sit at the top of the crate, as thin faces over the
//! folders.
//!
//! | folder / module | what it holds |
//! |---|---|
//! | `support` | what every part uses: pauses between tries (`retry`), the process-wide runtime for clean-up that outlives its caller (`background`), the lock's value — its UUID, then who holds it (`identity`) — metrics (`meters`), and the lock orders seen in this process, with their warnings (`order`) |
//! | `error` | [`LockError`]: what went wrong and what to do |
//! | `options` | [`LockOptions`], the limits on durations, a connection's `Timeouts` |
//! | `redis` | the only place naming redis-rs connection types: connections to one endpoint per tokio runtime (`connection`), a Sentinel service's master (`sentinel`), what a Redis error means (`classify`), the eviction check at connect (`eviction`) |
//! | `diagnose` | which server settings can break locks (eviction), and their fix |
//! | `backend` | the one seam between the manager and a store: `mod.rs` dispatches; one endpoint, a server or a cluster (`line`); Redlock's majority (`quorum`); the in-process table (`memory`); waiting for replicas (`replicas`); what a manager recently learned of a key (`recent`); hand-off and wake-up messages to one waiter (`grants`); the lock key and its helper keys (`keys`); the Lua scripts (`scripts`, the code in `scripts/*.lua`) |
//! | `acquire` | getting a lock: the waiting protocol as a state machine without I/O (`machine`), the in-process first-come-first-served line (`queue`), finishing a call whose caller stopped waiting (`finish`) |
//! | `shared` | the inside of a manager: backend, key prefix, queues; made anew in a forked process |
//! | `hold` | holding a lock: what its guard and watchdog share (`held`), auto-extension (`watchdog`), the lazy confirmation of a lock handed over on its claim (`confirm`), which locks a task (or a blocking thread) holds, for re-entry, and [`LockGuard::scope`] (`reentry`) |
//! | `guard` | [`LockGuard`] |
//! | `builder` | [`LockManagerBuilder`]; it makes a manager's inside |
//! | `manager` | [`LockManager`], the acquisition's driver, and [`LockManagerBuilder::connect`], which wraps the inside |
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
pub mod blocking;
mod builder;
pub mod diagnose;
mod error;
mod global;
mod guard;
mod hold;
mod inspect;
mod manager;
mod options;
mod redis;
mod shared;
mod support;

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
