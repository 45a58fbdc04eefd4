//! One Redis endpoint — a standalone server or a whole cluster — and the lock operations on it.

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, RedisResult, Value};

use super::{Attempt, Wait};
use crate::connection::{Connection, Connections};
use crate::keys::LockKeys;
use crate::scripts;

/// One endpoint: its per-runtime connections and the lock scripts run on them.
pub(crate) struct Node {
    connections: Arc<Connections>,
}

impl Node {
    pub(crate) fn new(connections: Arc<Connections>) -> Self {
        Node { connections }
    }

    async fn connection(&self) -> RedisResult<Connection> {
        self.connections.get().await
    }

    pub(crate) fn connections(&self) -> &Connections {
        &self.connections
    }

    /// Whether this endpoint's connection sends a command again after losing its reply.
    pub(crate) fn resends_commands(&self) -> bool {
        self.connections.is_cluster()
    }

    /// Checks that the endpoint answers as Redis does and lets us run the lock scripts: a
    /// `PING`, then the release script on a probe key with a token that matches nothing (it
    /// deletes nothing, and loads the script for the first real release).
    pub(crate) async fn ping(&self, probe: &LockKeys) -> RedisResult<()> {
        let mut connection = self.connection().await?;
        redis::cmd("PING")
            .query_async::<()>(&mut connection)
            .await?;
        self.unlock(probe, "no token matches this").await.map(drop)
    }

    /// One attempt: `SET NX PX`; and, as `wait` asks, the holder's remaining ttl and the mark
    /// that someone waits; with `fencing`, the next fencing token.
    pub(crate) async fn try_lock(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
        fencing: bool,
        wait: Wait,
    ) -> RedisResult<Attempt> {
        let mut connection = self.connection().await?;
        if !fencing && wait == Wait::FirstTry {
            // The plain command: no script to run when the lock is free, which is most times.
            // Sized up front ("SET", key, token, "NX", "PX", up to 20 digits): no reallocation.
            let mut set = Cmd::with_capacity(6, 3 + keys.lock.len() + token.len() + 4 + 20);
            set.arg("SET")
                .arg(&*keys.lock)
                .arg(token)
                .arg("NX")
                .arg("PX")
                .arg(ttl_millis);
            // `+OK` or a nil reply: read as a `Value`, which needs no allocation for either.
            return match set.query_async(&mut connection).await? {
                Value::Okay => Ok(Attempt::Acquired { fence: None }),
                Value::Nil => Ok(Attempt::Held { remaining: None }),
                other => Err(redis::RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "SET NX PX answered neither OK nor nil",
                    format!("{other:?}"),
                ))),
            };
        }
        // Arguments: the token, the ttl and two one-digit flags.
        let argv_bytes = token.len() + 20 + 2;
        let waiters = keys.waiters();
        let mut cmd = if fencing {
            let fence = keys.fence();
            scripts::evalsha(
                &scripts::ACQUIRE,
                &[&keys.lock, &waiters, &fence],
                4,
                argv_bytes,
            )
        } else {
            scripts::evalsha(&scripts::ACQUIRE, &[&keys.lock, &waiters], 4, argv_bytes)
        };
        cmd.arg(token)
            .arg(ttl_millis)
            .arg(flag(fencing))
            .arg(flag(wait == Wait::Subscribed));
        let (acquired, value): (i64, i64) =
            scripts::run(&scripts::ACQUIRE, &cmd, &mut connection).await?;
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
    ///
    /// On a Redis Cluster in flux the release is tried again for a while rather than left to
    /// the ttl: while the lock's slot is half-migrated the script (two keys, the waiters key
    /// usually absent) is answered TRYAGAIN, and during a failover CLUSTERDOWN or a MOVED that
    /// redis-rs gave up following, or a refused connection to the master that just died. Each
    /// of these means the script did not run, so trying again cannot release twice; acquires
    /// need no such loop, they retry until their deadline.
    pub(crate) async fn unlock(&self, keys: &LockKeys, token: &str) -> RedisResult<bool> {
        let give_up = tokio::time::Instant::now() + CLUSTER_IN_FLUX_RETRY.0;
        let mut pause = CLUSTER_IN_FLUX_RETRY.1;
        loop {
            let mut connection = self.connection().await?;
            let in_cluster = matches!(connection, Connection::Cluster(_));
            // A cluster connection may run the release twice: mark it, see `RELEASE`.
            let re_sent_within = in_cluster.then(|| self.connections.resend_window());
            match Self::unlock_on(&mut connection, keys, token, re_sent_within).await {
                Err(error)
                    if in_cluster
                        && (cluster_in_flux(&error) || error.is_connection_refusal())
                        && tokio::time::Instant::now() + pause < give_up =>
                {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(CLUSTER_IN_FLUX_RETRY.2);
                }
                result => return result,
            }
        }
    }

    async fn unlock_on(
        connection: &mut Connection,
        keys: &LockKeys,
        token: &str,
        re_sent_within: Option<Duration>,
    ) -> RedisResult<bool> {
        let waiters = keys.waiters();
        let cmd = match re_sent_within {
            Some(window) => {
                let released = keys.released();
                let mut cmd = scripts::evalsha(
                    &scripts::RELEASE,
                    &[&keys.lock, &waiters, &released],
                    2,
                    token.len() + 20,
                );
                cmd.arg(token)
                    .arg(u64::try_from(window.as_millis()).unwrap_or(u64::MAX));
                cmd
            }
            None => {
                let mut cmd =
                    scripts::evalsha(&scripts::RELEASE, &[&keys.lock, &waiters], 1, token.len());
                cmd.arg(token);
                cmd
            }
        };
        let deleted: i64 = scripts::run(&scripts::RELEASE, &cmd, connection).await?;
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
        let mut cmd = scripts::evalsha(&scripts::EXTEND, &[&keys.lock], 2, token.len() + 20);
        cmd.arg(token).arg(ttl_millis);
        let extended: i64 = scripts::run(&scripts::EXTEND, &cmd, &mut connection).await?;
        Ok(extended == 1)
    }

    /// Whether the lock key holds `token` now.
    pub(crate) async fn is_held(&self, keys: &LockKeys, token: &str) -> RedisResult<bool> {
        let mut connection = self.connection().await?;
        let holder: Option<String> = redis::cmd("GET")
            .arg(&*keys.lock)
            .query_async(&mut connection)
            .await?;
        Ok(holder.as_deref() == Some(token))
    }
}

/// How long a release retries while a cluster is in flux, and its first and longest pause.
/// A slot migration or a failover usually settles within a few seconds; past that the lock
/// expires at the end of its ttl, as after any failed release.
const CLUSTER_IN_FLUX_RETRY: (Duration, Duration, Duration) = (
    Duration::from_secs(5),
    Duration::from_millis(10),
    Duration::from_millis(200),
);

/// Whether a cluster refused to run the command for now (it did not run): the slot is being
/// migrated, or has moved, or the cluster is failing over.
fn cluster_in_flux(error: &redis::RedisError) -> bool {
    use redis::ServerErrorKind::{Ask, ClusterDown, MasterDown, Moved, TryAgain};
    matches!(
        error.kind(),
        redis::ErrorKind::Server(TryAgain | Moved | Ask | ClusterDown | MasterDown)
    )
}

fn flag(on: bool) -> &'static str {
    if on {
        "1"
    } else {
        "0"
    }
}
