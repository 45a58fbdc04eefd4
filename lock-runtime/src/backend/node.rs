//! One Redis endpoint — a standalone server or a whole cluster — and the lock operations on it.

use std::time::Duration;

use redis::RedisResult;

use super::Attempt;
use crate::connection::{Connection, Connections};
use crate::keys::LockKeys;
use crate::scripts;

/// One endpoint: its per-runtime connections and the lock scripts run on them.
pub(crate) struct Node {
    connections: Connections,
}

impl Node {
    pub(crate) fn new(connections: Connections) -> Self {
        Node { connections }
    }

    pub(crate) async fn connection(&self) -> RedisResult<Connection> {
        self.connections.get().await
    }

    pub(crate) fn connections(&self) -> &Connections {
        &self.connections
    }

    /// Checks that the endpoint answers as Redis does.
    pub(crate) async fn ping(&self) -> RedisResult<()> {
        let mut connection = self.connection().await?;
        redis::cmd("PING").query_async::<()>(&mut connection).await
    }

    /// One attempt: `SET NX PX`, or the holder's remaining ttl. With `will_wait`, also marks the
    /// lock as awaited so that its release publishes a wake-up.
    pub(crate) async fn try_lock(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
        fencing: bool,
        will_wait: bool,
    ) -> RedisResult<Attempt> {
        let mut connection = self.connection().await?;
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

    /// Whether the lock key holds `token` now.
    pub(crate) async fn is_held(&self, keys: &LockKeys, token: &str) -> RedisResult<bool> {
        let mut connection = self.connection().await?;
        let holder: Option<String> = redis::cmd("GET")
            .arg(&keys.lock)
            .query_async(&mut connection)
            .await?;
        Ok(holder.as_deref() == Some(token))
    }
}

fn flag(on: bool) -> &'static str {
    if on {
        "1"
    } else {
        "0"
    }
}
