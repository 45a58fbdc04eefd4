//! The lock users write by hand without distlock, for the poll baselines: `SET key token NX PX
//! ttl` on each key it needs, a sleep of a fixed interval after each refusal, and the
//! compare-and-delete script ([`crate::FLOOR_RELEASE`]) to give a key back.
//!
//! It keeps no line and sends no message: a waiter learns that a key is free only by asking
//! again, so a key freed just after a refusal lies unused until some waiter's sleep is over.

use std::time::Duration;

use redis::aio::MultiplexedConnection;

use super::{PREFIX, RESPONSE_TIMEOUT, TTL};

/// One process's hand-written lock: its own multiplexed connection, shared by its tasks.
pub(super) struct HandWritten {
    connection: MultiplexedConnection,
    release: redis::Script,
    interval: Duration,
}

impl HandWritten {
    /// Connects to the Redis at `url`; every refusal will cost a waiter `interval`.
    pub(super) async fn connect(url: &str, interval: Duration) -> Self {
        let client = redis::Client::open(url).expect("bad Redis URL");
        let config =
            redis::AsyncConnectionConfig::new().set_response_timeout(Some(RESPONSE_TIMEOUT));
        HandWritten {
            connection: client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .expect("fleet worker: cannot connect to Redis"),
            release: redis::Script::new(crate::FLOOR_RELEASE),
            interval,
        }
    }

    /// Waits until `token` holds the keys of every lock in `names` and returns those keys.
    ///
    /// Takes them in the order given; when one is refused, gives back those taken before it
    /// and sleeps before trying them all again, so that no caller sits on one key while it
    /// waits for another (callers that name shared locks in one order, sorted, cannot hold one
    /// each of two keys both want). With one name, this is the plain `SET NX` + poll mutex.
    pub(super) async fn take_all(&self, names: &[String], token: &str) -> Vec<String> {
        let keys: Vec<String> = names.iter().map(|name| format!("{PREFIX}{name}")).collect();
        'attempt: loop {
            for (taken, key) in keys.iter().enumerate() {
                if !self.try_take(key, token).await {
                    self.release(&keys[..taken], token).await;
                    tokio::time::sleep(self.interval).await;
                    continue 'attempt;
                }
            }
            return keys;
        }
    }

    /// Waits until `token` holds the key of one lock in `names` (a semaphore's slots) and
    /// returns that key.
    ///
    /// Tries them in order from `first` on, wrapping round, and takes the first that is free:
    /// callers that start at different slots do not all ask for the same one first. Sleeps
    /// when every one refuses.
    pub(super) async fn take_any(&self, names: &[String], first: usize, token: &str) -> String {
        let keys: Vec<String> = names.iter().map(|name| format!("{PREFIX}{name}")).collect();
        loop {
            for offset in 0..keys.len() {
                let key = &keys[(first + offset) % keys.len()];
                if self.try_take(key, token).await {
                    return key.clone();
                }
            }
            tokio::time::sleep(self.interval).await;
        }
    }

    /// Gives back `keys`, which must still be `token`'s: the ttl is far longer than the run,
    /// so a key found gone or another's is a broken lock.
    pub(super) async fn release(&self, keys: &[String], token: &str) {
        for key in keys {
            let deleted: i64 = self
                .release
                .key(key)
                .arg(token)
                .invoke_async(&mut self.connection.clone())
                .await
                .expect("fleet worker: release script failed");
            assert_eq!(deleted, 1, "fleet worker: {key} was no longer ours");
        }
    }

    /// `SET key token NX PX ttl`: whether `token` now holds `key`.
    async fn try_take(&self, key: &str, token: &str) -> bool {
        let set: redis::Value = redis::cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(u64::try_from(TTL.as_millis()).expect("a ttl of centuries"))
            .query_async(&mut self.connection.clone())
            .await
            .expect("fleet worker: SET NX PX failed");
        match set {
            redis::Value::Okay => true,
            redis::Value::Nil => false,
            other => panic!("fleet worker: SET NX PX answered {other:?}"),
        }
    }
}
