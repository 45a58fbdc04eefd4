//! Stand-in for `mod.rs` while the rslock dev-dependency lacks its `tokio-comp` feature (rslock
//! is then an empty crate): same API, and [`Rslock::new`] returns `None`, so the bench skips
//! rslock and says why.

use std::convert::Infallible;
use std::time::Duration;

/// Whether the bench can run rslock.
pub const AVAILABLE: bool = false;

#[derive(Clone)]
pub struct Rslock(Infallible);

pub struct Held(Infallible);

impl Rslock {
    pub fn new(_client: &redis::Client, _retry: Option<(u32, Duration)>) -> Option<Self> {
        None
    }

    pub async fn acquire(&self, _key: &str, _ttl: Duration) -> Held {
        match self.0 {}
    }
}

impl Held {
    pub async fn release(self) {
        match self.0 {}
    }
}
