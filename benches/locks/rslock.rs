//! rslock (crates.io, the best-known Rust Redis lock) as a contender of the `locks` bench.
//!
//! Needs rslock's `tokio-comp` feature (set in Cargo.toml): without `tokio-comp` (or
//! `smol-comp`) rslock compiles to an empty crate.

use std::time::Duration;

/// One rslock `LockManager` on one Redis server (connects on first use, on the runtime of that
/// first use: make one per runtime).
#[derive(Clone)]
pub(crate) struct Rslock(rslock::LockManager);

/// A lock held through rslock.
pub(crate) struct Held(rslock::LockGuard);

impl Rslock {
    /// A manager with rslock's retry policy: `count` attempts per `lock` call, each failed one
    /// followed by a random pause in `0..delay` (`None`: rslock's defaults, 3 and 200 ms).
    pub(crate) fn new(client: &redis::Client, retry: Option<(u32, Duration)>) -> Self {
        let mut manager = rslock::LockManager::from_clients(vec![client.clone()]);
        if let Some((count, delay)) = retry {
            manager.set_retry(count, delay);
        }
        Rslock(manager)
    }

    /// `LockManager::acquire`: retries until it holds the lock.
    pub(crate) async fn acquire(&self, key: &str, ttl: Duration) -> Held {
        let guard = self
            .0
            .acquire(key.as_bytes(), ttl)
            .await
            .unwrap_or_else(|error| panic!("rslock: acquire {key} failed: {error}"));
        Held(guard)
    }
}

impl Held {
    /// `LockGuard::release` (best effort: rslock reports nothing).
    pub(crate) async fn release(self) {
        self.0.release().await;
    }
}
