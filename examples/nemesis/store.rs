//! The store the sections read and write: a redis-server of its own that the nemesis never
//! faults, holding one hash per record, behind two Lua scripts that check the fencing token.
//!
//! A record remembers the highest token it has seen (`seen`), from a read or a write. A read or
//! a write with a lower token is refused; a write must also carry a token above the last
//! accepted write's. Checking the read too is what keeps a read-modify-write whole: a holder
//! that read, was frozen, and lost the lock to one that read after it, cannot write back what
//! it read before.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Script;

/// `KEYS[1]` the record, `ARGV[1]` the token. Returns `{1, value}`, or `{0, 0}` when refused.
const READ: &str = r"
local seen = tonumber(redis.call('HGET', KEYS[1], 'seen') or '0')
local token = tonumber(ARGV[1])
if token < seen then return {0, 0} end
redis.call('HSET', KEYS[1], 'seen', token)
return {1, tonumber(redis.call('HGET', KEYS[1], 'value') or '0')}
";

/// `KEYS[1]` the record, `ARGV[1]` the token, `ARGV[2]` the new value. Returns the write's
/// place among the record's accepted writes (1, 2, ...), or 0 when refused.
const WRITE: &str = r"
local seen = tonumber(redis.call('HGET', KEYS[1], 'seen') or '0')
local last = tonumber(redis.call('HGET', KEYS[1], 'written') or '0')
local token = tonumber(ARGV[1])
if token < seen or token <= last then return 0 end
redis.call('HSET', KEYS[1], 'seen', token, 'written', token, 'value', ARGV[2])
return redis.call('HINCRBY', KEYS[1], 'writes', 1)
";

/// Where the records live in the store.
const PREFIX: &str = "nemesis:store:";

/// The store's key of record `key`.
pub(crate) fn record_key(key: &str) -> String {
    format!("{PREFIX}{key}")
}

/// A connection to the store (every call bounded by the timeout given to `connect`) and its
/// two scripts.
pub(crate) struct Store {
    connection: MultiplexedConnection,
    read: Script,
    write: Script,
}

impl Store {
    pub(crate) async fn connect(url: &str, timeout: Duration) -> redis::RedisResult<Store> {
        let client = redis::Client::open(url)?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok(Store {
            connection,
            read: Script::new(READ),
            write: Script::new(WRITE),
        })
    }

    /// The record's value, or `None` when a newer token was seen.
    pub(crate) async fn read(&self, key: &str, token: u64) -> redis::RedisResult<Option<u64>> {
        let mut connection = self.connection.clone();
        let (ok, value): (u8, u64) = self
            .read
            .key(record_key(key))
            .arg(token)
            .invoke_async(&mut connection)
            .await?;
        Ok((ok == 1).then_some(value))
    }

    /// Writes `value` if `token` is still the newest: `Some(place among accepted writes)`, or
    /// `None` when refused.
    pub(crate) async fn write(
        &self,
        key: &str,
        token: u64,
        value: u64,
    ) -> redis::RedisResult<Option<u64>> {
        let mut connection = self.connection.clone();
        let seq: u64 = self
            .write
            .key(record_key(key))
            .arg(token)
            .arg(value)
            .invoke_async(&mut connection)
            .await?;
        Ok((seq > 0).then_some(seq))
    }
}
