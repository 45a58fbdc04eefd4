//! # distlock — distributed mutual exclusion on Redis in one attribute
//!
//! Many workers, on many machines, process tasks concurrently; for a given resource only one may
//! work at a time. Put `#[distributed_lock]` on the `async fn` that does the work:
//!
//! ```no_run
//! use distlock::distributed_lock;
//!
//! #[derive(Debug)]
//! struct AppError(String);
//!
//! impl std::fmt::Display for AppError {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
//!         f.write_str(&self.0)
//!     }
//! }
//!
//! impl std::error::Error for AppError {}
//!
//! // Taking the lock can fail (timeout, Redis unreachable): the error reaches the caller
//! // through this conversion.
//! impl From<distlock::LockError> for AppError {
//!     fn from(error: distlock::LockError) -> Self {
//!         AppError(error.to_string())
//!     }
//! }
//!
//! #[distributed_lock(key = "trace:{trace_id}", ttl = 60)]
//! async fn process_trace(trace_id: &str) -> Result<(), AppError> {
//!     // only one worker in the whole fleet runs this block for a given trace_id
//!     Ok(())
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     distlock::init("redis://127.0.0.1:6379").await?; // global client, once, at startup
//!     process_trace("abc").await?;
//!     Ok(())
//! }
//! ```
//!
//! The attribute takes the lock `lock:trace:abc` before the body runs (waiting up to `timeout`)
//! and releases it with an atomic compare-and-delete after the body ends — by `return`, by `?`, by
//! panic, or because the caller dropped the future. The lock expires by itself after `ttl`, so a
//! crashed worker never deadlocks the fleet.
//!
//! The same locks are available without the attribute through [`LockManager`]:
//! [`LockManager::acquire`] returns a [`LockGuard`] that releases on [`LockGuard::release`] or
//! on drop.
//!
//! Synchronous code uses [`blocking`]: the same manager and guard without `.await`, and the
//! attribute on a plain `fn`. Tests (and single-process tools) can run without any server on
//! [`LockManager::in_process`], which keeps Redis's semantics within one process.
//!
//! Every option of the attribute is documented, with an example, on [`distributed_lock`]; the
//! behaviour under failure, the backends and the waiting protocol are described in the
//! repository's `docs/` directory.

// Nothing in this crate needs `unsafe`, so no change may bring it in unnoticed.
#![forbid(unsafe_code)]

pub use lock_macros::distributed_lock;
pub use lock_runtime::blocking;
pub use lock_runtime::diagnose;
pub use lock_runtime::redact_url;
pub use lock_runtime::{
    global, init, init_with, HeldMode, Holder, LockError, LockGuard, LockInfo, LockManager,
    LockManagerBuilder, LockMode, LockOptions, LockOrder, LostCause,
};

/// Support for the code that `#[distributed_lock]` generates. Not a public API: it may change in
/// any release.
#[doc(hidden)]
pub mod __private {
    pub use core::time::Duration;
    pub use lock_runtime::attribute::{
        acquire, acquire_all, acquire_all_blocking, acquire_all_or_busy, acquire_blocking,
        acquire_or_busy, release, run, span, try_acquire, try_acquire_all, BlockingHeld,
        FromLockError,
    };
    pub use lock_runtime::blocking::LockGuard as BlockingLockGuard;
    pub use lock_runtime::Instrument;
    pub use lock_runtime::{LockError, LockGuard, LockMode, LockOptions};
}
