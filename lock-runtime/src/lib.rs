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

mod acquire;
#[doc(hidden)]
pub mod attribute;
mod backend;
mod background;
mod builder;
mod classify;
mod connection;
mod error;
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
mod wake;
mod watchdog;

pub use builder::LockManagerBuilder;
pub use error::LockError;
pub use global::{global, init, init_with};
pub use guard::LockGuard;
pub use inspect::{Holder, LockInfo};
pub use manager::LockManager;
#[doc(hidden)]
pub use manager::ResourceCounts;
pub use options::LockOptions;
/// For the code `#[distributed_lock]` generates: it runs the locked call in its span.
#[doc(hidden)]
pub use tracing::Instrument;

/// The release script's text, for the benchmark's floor that sends distlock's commands by hand.
/// Not a public API.
#[doc(hidden)]
#[must_use]
pub fn release_script_source() -> String {
    scripts::release_source()
}
