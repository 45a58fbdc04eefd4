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
//!    (`attribute::span`) and calls `attribute::acquire`, which asks the global manager
//!    (`global`) for [`LockManager::acquire`]. The manager names the lock's Redis keys
//!    (`backend::keys`) and waits for its turn among the tasks of this process that want the
//!    same key (`acquire::queue`). Then the state machine (`acquire::machine`) decides each step
//!    and the manager's driver (`manager::driver`) performs it: a first try (a plain
//!    `SET NX PX`), then a place in the lock's line in Redis (on Redlock, in each master's wake
//!    list), sleeping until a hand-off message or a wake-up (`backend::grants`), the holder's
//!    expiry or the next renewal — until the lock is its own or the timeout runs out.
//!    Whether a hand-off message is trusted is the machine's decision (`Acquisition::woke`):
//!    only on a store that hands locks over (`backend::Capabilities`), only while the claim the
//!    message gives, counted from the attempt that took the place, is still well ahead
//!    (`GRANT_MARGIN`). Otherwise the driver asks the store: another attempt under the same
//!    token, which renews the place or finds the lock handed to it (`Step::Attempt`), or with
//!    `wait_for_replicas`, a confirmation that the replicas have it (`Step::Confirm`). Every
//!    store operation goes through the one seam, `backend`. A Redis error is retried with
//!    backoff (`support::retry`) unless `redis::classify` says retrying cannot cure it.
//! 2. **Body.** The caller gets a [`LockGuard`]. A lock handed over holds on a short claim
//!    until its full ttl is confirmed, a third into the claim, on the background runtime
//!    (`hold::confirm`). With auto-extension, a `hold::watchdog` task extends
//!    the lock every ttl/3, sharing what it knows (`hold::held`) with the guard; `attribute::run` races
//!    the body against the watchdog and cancels the body when the lock is lost. It runs the body
//!    in the guard's scope (`manager::reentry`): there, the task asking for the same lock again
//!    re-enters it, and asking for another records the order of the two templates
//!    (`hold::order`), which warns when two templates are taken in both orders — and records a
//!    new order once in Redis (`backend::orders`), in the background, so that a process taking
//!    them the other way round is warned too.
//! 3. **Release.** [`LockGuard::release`] asks what the guard and its watchdog share
//!    (`hold::held`) to give the lock back: with `hold_at_least` not yet reached, the lock is
//!    left to expire then (the `HOLD` script); otherwise the store's release runs — on one
//!    endpoint `Node::release` (`backend::line`): a lock taken by a first try's `SET NX` is
//!    first offered to `RELEASE_ALONE` (compare-and-delete when nobody is in line, else
//!    nothing); then the `RELEASE` script: compare-and-delete by token, and, when someone
//!    waits, the Lua function `hand_off` (in `line_prelude.lua`) gives the lock to the first
//!    live waiter and publishes its grant. `RELEASE` is `release_uncontended.lua`,
//!    `line_prelude.lua`, `not_ours.lua` and `release_contended.lua` joined, so that a release
//!    nobody waits for returns before the line's code. A guard dropped
//!    without a release (panic, cancellation) releases on the process-wide
//!    `support::background` runtime, and an acquire dropped while its command was in flight is
//!    finished there too (`acquire::finish`), so no clean-up depends on the caller's runtime.
//!
//! # The folders, from the bottom up
//!
//! The folders are listed from the bottom up: a folder's code uses only the ones above it in
//! the table, never one below (`tests/layers.rs` reads the sources and fails on a use that
//! points down the table). The public types sit at the top of the crate, as thin faces over the
//! folders.
//!
//! | folder / module | what it holds |
//! |---|---|
//! | `support` | what every part uses: pauses between tries (`retry`), the process-wide runtime for clean-up that outlives its caller (`background`), a rare path's future boxed and polled out of line, so that it does not enlarge the usual path's stack frame (`cold`), the lock's value — its UUID, then who holds it (`identity`), a duration in whole milliseconds or microseconds, saturating (`units`) |
//! | `diagnose` | which server settings can break locks (eviction), and their fix; the one `CLUSTER SLOTS` parser |
//! | `redis` | the only place naming redis-rs connection types: connections to one endpoint per tokio runtime and their `Timeouts` (`connection`), a Sentinel service's master (`sentinel`), what a Redis error means (`classify`), the eviction check at connect (`eviction`) |
//! | `error` | [`LockError`]: what went wrong and what to do |
//! | `options` | [`LockOptions`], the limits on durations |
//! | `meters` | metrics of acquisitions and holds |
//! | `backend` | the one seam between the manager and a store: `mod.rs` dispatches each operation to the store; what every store is asked and answers (`operations`: `LockRequest`, `Attempt`, `Ownership`, how a lock was `Taken`); what every store declares it can do (`capabilities`); why an operation failed (`failure`, made a [`LockError`] in one place); one endpoint, a server or a cluster (`line/`: acquire, release, look, several locks of one slot taken together, and what it remembers of each lock); Redlock's majority (`quorum/`, each master's votes in `master`); the in-process table (`memory`); waiting for replicas (`replicas`); what a manager recently learned of a key (`recent`); the fleet's lock-order record, one hash per key prefix (`orders`); hand-off and wake-up messages to one waiter (`grants`); what a holder that waits for another lock records, and one look along a chain of waits (`waits`); the lock key and its helper keys (`keys`); the Lua scripts (`scripts`, the code in `scripts/*.lua`; the `semaphore_*`, `rw_*`, `leased_held` and `family_prelude` files are semaphores' and read-write locks' (docs/family.md), which a permit's or reader's operations run (`line/leased`, in process `memory/leased`): `LockKeys::kind` says which; the `multi_*` files are multi-key locks'); what a manager holds, for leak tests (`counts`) |
//! | `acquire` | getting a lock, the parts without I/O: the waiting protocol as a state machine without I/O or clock, where a hand-off message is trusted or checked (`machine`); the in-process first-come-first-served line (`queue`); when a waiter that holds locks looks for a wait-for cycle and when it reports one (`deadlock`); finishing a call whose caller stopped waiting, which makes every attempt safe to cancel (`finish`) |
//! | `shared` | the inside of a manager: backend, key prefix, queues; made anew in a forked process |
//! | `hold` | holding a lock: what its guard and watchdog share (`held`), auto-extension (`watchdog`), the lazy confirmation of a lock handed over on its claim (`confirm`), the orders in which tasks took locks of two key templates — in this process, and recorded once per order in Redis for the fleet — warned about when both were seen (`order`) |
//! | `guard` | [`LockGuard`] |
//! | `builder` | [`LockManagerBuilder`]; it makes a manager's inside |
//! | `manager` | [`LockManager`]'s face: constructors, `acquire`/`try_acquire` with their metrics, a lock key's checks, what a lock is taken as (mutex, permit, reader) and where (`kind`), and [`LockManagerBuilder::connect`], which wraps the inside; the acquisition's driver, which performs the I/O the machine asks for (`driver`); one cancel-safe attempt and the clean-up of an unanswered one (`attempt`); several locks at once, all or none, together or one by one in key order (`all`); a waiter's place in line, left if it gives up (`place`); which locks a task (or a blocking thread) holds, for re-entry, and [`LockGuard::scope`] (`reentry`); the watch of a waiting holder for a wait-for cycle, which fails its acquisition with [`LockError::Deadlock`] (`deadlock`) |
//! | `inspect` | [`LockInfo`], [`Holder`]: `inspect`, `list`, `force_release` |
//! | `orders` | [`LockOrder`]: `orders`, the fleet's lock-order record as `distlock order` shows it |
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
mod meters;
mod options;
mod orders;
mod redis;
mod shared;
mod support;

#[cfg(feature = "resource-counts")]
pub use backend::ResourceCounts;
pub use builder::LockManagerBuilder;
pub use error::{LockError, LostCause};
pub use global::{global, init, init_with};
pub use guard::LockGuard;
pub use inspect::{HeldMode, Holder, LockInfo};
pub use manager::LockManager;
pub use options::{LockMode, LockOptions};
pub use orders::LockOrder;
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
