//! Looking at a lock on one endpoint, and scanning it for lock keys.

use std::time::Duration;

use redis::Value;

use super::Node;
use crate::backend::failure;
use crate::backend::keys::{Kind, LockKeys};
use crate::backend::scripts;
use crate::redis::connection::Connection;

impl Node {
    /// One look at the lock, as inspection shows it; `None` when it is free.
    pub(crate) async fn inspect(&self, keys: &LockKeys) -> failure::Result<Option<Look>> {
        let mut connection = self.connection().await?;
        let (line, fence, since, leases) = (keys.line(), keys.fence(), keys.since(), keys.leases());
        let cmd = scripts::evalsha(
            &scripts::INSPECT,
            &[&keys.lock, &line, &fence, &since, &leases],
            0,
            0,
        );
        let reply: Option<InspectReply> =
            match scripts::invoke(&scripts::INSPECT, &cmd, &mut connection).await {
                // Not a string: a semaphore's or readers' leased set, read by its own script.
                Err(error) if crate::redis::classify::is_wrong_type_reply(&error) => {
                    return self.inspect_leased(keys, &mut connection, error).await;
                }
                reply => reply?,
            };
        Ok(reply.map(|(value, pttl, waiters, fence, since)| {
            let granted = since.and_then(|record| granted_at(&record, &value));
            Look {
                value,
                ttl_left: u64::try_from(pttl).ok().map(Duration::from_millis),
                waiters,
                fence: fence.and_then(|raw| std::str::from_utf8(&raw).ok()?.parse().ok()),
                granted,
                leased: None,
            }
        }))
    }

    /// One look at a leased set at the lock key; `None` when it is free. `wrong_type`: the
    /// mutex's script's error, which stands when the key is no leased set either.
    async fn inspect_leased(
        &self,
        keys: &LockKeys,
        connection: &mut Connection,
        wrong_type: redis::RedisError,
    ) -> failure::Result<Option<Look>> {
        let (permit_line, line, fence) = (keys.permit_line(), keys.line(), keys.fence());
        let cmd = scripts::evalsha(
            &scripts::LEASED_INSPECT,
            &[&keys.lock, &permit_line, &line, &fence],
            0,
            0,
        );
        let reply: Value = match scripts::invoke(&scripts::LEASED_INSPECT, &cmd, connection).await {
            // Neither a string nor a leased set: no lock, as the mutex's script said.
            Err(error) if error.code() == Some("MODE") => return Err(wrong_type.into()),
            reply => reply?,
        };
        // The lock key is a string after all: the mutex's script met another type in one of
        // its helper keys, which its error (named by `naming_the_key`) is about.
        if matches!(&reply, Value::Array(items) if items.len() == 1) {
            return Err(wrong_type.into());
        }
        let reply: Option<LeasedReply> =
            redis::from_redis_value(reply).map_err(redis::RedisError::from)?;
        let Some((kind, permits, flat, waiters, fence)) = reply else {
            return Ok(None);
        };
        let holders: Vec<(Vec<u8>, Duration)> = flat
            .chunks(2)
            .filter_map(|pair| match pair {
                [Value::BulkString(value), left] => {
                    let left: i64 = redis::from_redis_value(left.clone()).ok()?;
                    Some((
                        value.clone(),
                        Duration::from_millis(u64::try_from(left).unwrap_or(0)),
                    ))
                }
                _ => None,
            })
            .collect();
        let Some(last) = holders.iter().map(|(_, left)| *left).max() else {
            return Ok(None);
        };
        Ok(Some(Look {
            value: holders[0].0.clone(),
            ttl_left: Some(last),
            waiters,
            fence: fence.and_then(|raw| std::str::from_utf8(&raw).ok()?.parse().ok()),
            granted: None,
            leased: Some(LeasedLook {
                permits: (kind == "permits").then(|| u32::try_from(permits).unwrap_or(u32::MAX)),
                holders,
            }),
        }))
    }

    /// Where to scan for lock keys: this server, or each master of the cluster.
    pub(crate) async fn scan_targets(&self) -> failure::Result<Vec<ScanTarget>> {
        let mut connection = self.connection().await?;
        if !matches!(connection, Connection::Cluster(_)) {
            return Ok(vec![ScanTarget::Server]);
        }
        let slots: Vec<Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut connection)
            .await?;
        Ok(crate::diagnose::cluster_masters(&slots)
            .into_iter()
            .map(|(host, port)| ScanTarget::Address(host, port))
            .collect())
    }

    /// One `SCAN` step on `target`: the next cursor (0 when done) and the keys of type
    /// `of_type` found that match `pattern`.
    pub(crate) async fn scan(
        &self,
        target: &ScanTarget,
        cursor: u64,
        pattern: &str,
        of_type: &str,
    ) -> failure::Result<(u64, Vec<Vec<u8>>)> {
        let mut connection = self.connection().await?;
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .arg("TYPE")
            .arg(of_type);
        match (target, &mut connection) {
            (ScanTarget::Address(host, port), Connection::Cluster(cluster)) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                let reply = cluster.route_command(cmd, routing).await?;
                Ok(redis::from_redis_value(reply).map_err(redis::RedisError::from)?)
            }
            _ => Ok(cmd.query_async(&mut connection).await?),
        }
    }

    /// Whether the lock key holds `token` now. A key of another type (a semaphore's or
    /// readers' set) holds no mutex's token: `false`.
    pub(crate) async fn is_held(&self, keys: &LockKeys, token: &str) -> failure::Result<bool> {
        let mut connection = self.connection().await?;
        let holder: redis::RedisResult<Option<String>> = redis::cmd("GET")
            .arg(&*keys.lock)
            .query_async(&mut connection)
            .await;
        match holder {
            Ok(holder) => Ok(holder.as_deref() == Some(token)),
            Err(error) if crate::redis::classify::is_wrong_type_reply(&error) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    /// For a mutex's one attempt that found the name held (its `SET NX` failed, as on a
    /// semaphore too): `Config` when a semaphore holds it, the misuse a wait would be told of;
    /// nothing for a mutex or readers (a writer's wait for them is a wait). One command, spent
    /// only on a busy name; a store that cannot tell (no answer, an ACL without
    /// `ZRANGEBYSCORE`) leaves the answer "busy".
    pub(crate) async fn refuse_a_semaphore(&self, keys: &LockKeys) -> failure::Result<()> {
        match self.leased_marker(keys).await {
            Some(found @ Kind::Permits(_)) => Err(failure::used_otherwise(keys, found)),
            _ => Ok(()),
        }
    }
}

/// How many keys one `SCAN` step asks a server to look at: large enough that listing a big
/// keyspace takes few round trips, small enough that no step blocks the server for long.
pub(super) const SCAN_COUNT: u64 = 1000;

/// The leased inspect script's reply for a held set: kind, n, holders (value, ms left, ...),
/// waiters, fencing counter.
type LeasedReply = (String, u64, Vec<Value>, u64, Option<Vec<u8>>);

/// The inspect script's reply for a held lock: value, pttl, waiters, fencing counter, `since`
/// record.
pub(super) type InspectReply = (Vec<u8>, i64, u64, Option<Vec<u8>>, Option<Vec<u8>>);

/// The grant time in a `since` record (`"<UUID> <Redis time in ms>"`, see `granted` in
/// `scripts.rs`), if it names the holder of `value` (whose value starts with its UUID): a record
/// left by an earlier holder names another UUID.
pub(super) fn granted_at(record: &[u8], value: &[u8]) -> Option<std::time::SystemTime> {
    let (uuid, millis) = std::str::from_utf8(record).ok()?.split_once(' ')?;
    if uuid.len() != 36 || value.get(..36) != Some(uuid.as_bytes()) {
        return None;
    }
    std::time::UNIX_EPOCH.checked_add(Duration::from_millis(millis.parse().ok()?))
}

/// What one look at a lock found (see `scripts::INSPECT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Look {
    /// The lock key's value: distlock's token and holder, or whatever else wrote it.
    pub(crate) value: Vec<u8>,
    /// `None`: the key has no expiry.
    pub(crate) ttl_left: Option<Duration>,
    pub(crate) waiters: u64,
    pub(crate) fence: Option<u64>,
    /// When its holder got it, for a holder that waited first (whose value was made before
    /// its wait); `None` when the value's own time is right.
    pub(crate) granted: Option<std::time::SystemTime>,
    /// A semaphore's permits or a read lock's readers; `None` for a mutex or a writer, whose
    /// one holder is `value`.
    pub(crate) leased: Option<LeasedLook>,
}

/// What a look at a leased set found (see `scripts::LEASED_INSPECT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeasedLook {
    /// The semaphore's number of permits; `None` for readers.
    pub(crate) permits: Option<u32>,
    /// Every holder's value with its lease left, the earliest to run out first.
    pub(crate) holders: Vec<(Vec<u8>, Duration)>,
}

/// One server to scan for lock keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ScanTarget {
    /// The one server of a standalone endpoint (or a Redlock master).
    Server,
    /// A cluster master, by the address the cluster gives for it.
    Address(String, u16),
}
