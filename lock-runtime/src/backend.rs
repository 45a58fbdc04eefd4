//! The one seam between the lock manager and Redis.
//!
//! Everything above this module (manager, guard, options, the attribute) speaks in lock
//! operations — try to take, release, extend, read the holder, watch for releases — and never
//! sees a connection. Today there is one backend, a standalone Redis server; a cluster or a
//! Redlock quorum would be another implementation of these same operations.

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::RedisResult;

use crate::connection::{Connections, Timeouts};
use crate::keys::LockKeys;
use crate::scripts;
use crate::wake::{WakeHub, Watch};

/// What one attempt to take a lock found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lock is ours now; `fence` is the fencing token when one was asked for.
    Acquired { fence: Option<u64> },
    /// Someone else holds it, for at most `remaining` more (`None`: the key has no expiry).
    Held { remaining: Option<Duration> },
}

/// A standalone Redis server.
pub(crate) struct Backend {
    connections: Connections,
    wake: WakeHub,
}

impl Backend {
    pub(crate) fn standalone(client: redis::Client, timeouts: Timeouts) -> Self {
        Backend {
            wake: WakeHub::new(client.clone(), timeouts),
            connections: Connections::new(client, timeouts),
        }
    }

    /// The connection for the calling runtime (see [`Connections`]).
    pub(crate) async fn connection(&self) -> RedisResult<ConnectionManager> {
        self.connections.get().await
    }

    /// Checks that the server answers as Redis does.
    pub(crate) async fn ping(&self) -> RedisResult<()> {
        let mut connection = self.connection().await?;
        redis::cmd("PING").query_async::<()>(&mut connection).await
    }

    /// One attempt: `SET NX PX`, or the holder's remaining ttl. With `will_wait`, also marks the
    /// lock as awaited so that its release publishes a wake-up.
    ///
    /// Takes its connection by value so the call can outlive its caller (see `finish`).
    pub(crate) async fn try_lock(
        mut connection: ConnectionManager,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
        fencing: bool,
        will_wait: bool,
    ) -> RedisResult<Attempt> {
        let (acquired, value): (i64, i64) = scripts::ACQUIRE
            .key(&keys.lock)
            .key(&keys.wait_flag)
            .key(&keys.fence)
            .arg(token)
            .arg(ttl_millis)
            .arg(flag(fencing))
            .arg(flag(will_wait))
            .invoke_async(&mut connection)
            .await?;
        Ok(if acquired == 1 {
            Attempt::Acquired {
                fence: fencing.then(|| u64::try_from(value).unwrap_or(0)),
            }
        } else {
            Attempt::Held {
                remaining: u64::try_from(value).ok().map(Duration::from_millis),
            }
        })
    }

    /// Deletes the lock if it is still ours (waking its waiters); `false` if it was not ours.
    pub(crate) async fn unlock(&self, keys: &LockKeys, token: &str) -> RedisResult<bool> {
        let mut connection = self.connection().await?;
        let deleted: i64 = scripts::RELEASE
            .key(&keys.lock)
            .key(&keys.wait_flag)
            .arg(token)
            .arg(&keys.wake_channel)
            .invoke_async(&mut connection)
            .await?;
        Ok(deleted == 1)
    }

    /// Sets the lock's remaining ttl if it is still ours; `false` if it was not ours.
    pub(crate) async fn extend(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
    ) -> RedisResult<bool> {
        let mut connection = self.connection().await?;
        let extended: i64 = scripts::EXTEND
            .key(&keys.lock)
            .arg(token)
            .arg(ttl_millis)
            .invoke_async(&mut connection)
            .await?;
        Ok(extended == 1)
    }

    /// The token stored in the lock key now, if any.
    pub(crate) async fn holder(&self, keys: &LockKeys) -> RedisResult<Option<String>> {
        let mut connection = self.connection().await?;
        redis::cmd("GET")
            .arg(&keys.lock)
            .query_async(&mut connection)
            .await
    }

    /// Subscribes to the lock's releases (see [`WakeHub::watch`]).
    pub(crate) async fn watch(&self, keys: &LockKeys) -> RedisResult<Watch> {
        self.wake.watch(&keys.wake_channel).await
    }

    /// Resource counts for leak tests: (runtimes with a connection, watched channels).
    pub(crate) fn resource_counts(&self) -> (usize, usize) {
        (self.connections.len(), self.wake.watched_channels())
    }
}

fn flag(on: bool) -> &'static str {
    if on {
        "1"
    } else {
        "0"
    }
}
