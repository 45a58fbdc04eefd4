//! The Lua scripts. Each runs atomically on the Redis server, is invoked by SHA (`EVALSHA`), and
//! is sent with `SCRIPT LOAD` only when a server answers that it does not know it yet ([`run`]).
//! Keys always travel in `KEYS`, values in `ARGV`: nothing is ever spliced into the script text.

use once_cell::sync::Lazy;
use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind};

/// `EVALSHA <sha> <number of keys> <keys...>`; the caller appends `argv_count` values of up to
/// `argv_bytes` bytes in all.
///
/// Built directly rather than through `Script::key(..).arg(..)`, which first copies every key and
/// value into buffers of its own, and sized up front so that adding the arguments never
/// reallocates: this runs for every lock.
pub(crate) fn evalsha(script: &Script, keys: &[&str], argv_count: usize, argv_bytes: usize) -> Cmd {
    let keys_bytes: usize = keys.iter().map(|key| key.len()).sum();
    // "EVALSHA", the 40-hex-digit SHA, the key count (one or two digits).
    let mut cmd = Cmd::with_capacity(
        3 + keys.len() + argv_count,
        7 + 40 + 2 + keys_bytes + argv_bytes,
    );
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys.len());
    for key in keys {
        cmd.arg(*key);
    }
    cmd
}

/// Runs `cmd` (from [`evalsha`]); if Redis does not know the script yet (`NOSCRIPT`: a new or
/// restarted server), loads it and runs it again.
pub(crate) async fn run<T, C>(script: &Script, cmd: &Cmd, connection: &mut C) -> RedisResult<T>
where
    T: FromRedisValue,
    C: ConnectionLike,
{
    match cmd.query_async(connection).await {
        Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(connection).await?;
            cmd.query_async(connection).await
        }
        other => other,
    }
}

/// Written after the holder's token, in the lock's value, by a waiter: "someone waits for this
/// lock, wake them when you release it". It goes away with the lock (release, expiry), so it
/// always describes the current holding. Reading it costs the release script nothing, as it
/// reads the value anyway: that is why the mark lives in the value and not in a key of its own.
macro_rules! waiting_mark {
    () => {
        "+waiters"
    };
}

/// What the release script appends to the lock key to name the wake-up channel.
macro_rules! wake_channel_suffix {
    () => {
        ":distlock:released"
    };
}

/// See [`waiting_mark!`].
pub(crate) const WAITING_MARK: &str = waiting_mark!();

/// See [`wake_channel_suffix!`]; used by [`crate::keys::LockKeys::wake_channel`].
pub(crate) const WAKE_CHANNEL_SUFFIX: &str = wake_channel_suffix!();

/// Whether a lock's value says that `token` holds it: the token, alone or followed by the
/// [`WAITING_MARK`].
pub(crate) fn holds(value: &str, token: &str) -> bool {
    value
        .strip_prefix(token)
        .is_some_and(|rest| rest.is_empty() || rest == WAITING_MARK)
}

/// Try to take the lock; on failure report how long the holder may still hold it.
///
/// Runs from an acquisition's second attempt on, and from the first with fencing; a first try
/// without fencing is a plain `SET NX PX` (see `backend/node.rs`).
///
/// - `KEYS[1]` the lock key, `KEYS[2]` its fencing counter (only with fencing).
/// - `ARGV[1]` the token, `ARGV[2]` the ttl in milliseconds, `ARGV[3]` `"1"` to issue a fencing
///   token, `ARGV[4]` `"1"` when the caller is subscribed to the wake-up channel and will wait.
/// - Returns `{1, fence}` when acquired (`fence` is 0 unless asked for), `{0, pttl}` when someone
///   else holds it (`pttl` as `PTTL` returns it: milliseconds left, or -1 for a key without expiry).
///
/// A waiter appends the [`WAITING_MARK`] to the holder's value (once: `APPEND` keeps the ttl),
/// so that the release publishes a wake-up only then. A new holder's value carries no mark; its
/// waiters mark it again on their next attempt, at the latest when the old ttl runs out.
///
/// A script that fails halfway keeps what it did: if the `INCR` fails (a counter that is not a
/// number, an ACL that denies `INCR`), the lock just taken is deleted again before the error is
/// returned, so a caller who only sees the error leaves nothing held.
pub(crate) static ACQUIRE: Lazy<Script> = Lazy::new(|| {
    Script::new(concat!(
        r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[3] == '1' then
    local fence = redis.pcall('INCR', KEYS[2])
    if type(fence) == 'table' and fence.err then
      redis.call('DEL', KEYS[1])
      return fence
    end
    return {1, fence}
  end
  return {1, 0}
end
local pttl = redis.call('PTTL', KEYS[1])
if ARGV[4] == '1' then
  local mark = '",
        waiting_mark!(),
        r"'
  if string.sub(redis.call('GET', KEYS[1]), -#mark) ~= mark then
    redis.call('APPEND', KEYS[1], mark)
  end
end
return {0, pttl}
"
    ))
});

/// Delete the lock if it is still ours, and wake the waiters if there are any.
///
/// - `KEYS[1]` the lock key; `ARGV[1]` the token.
/// - Returns 1 when the lock was ours and is now deleted, 0 when it was not ours (expired, or
///   another holder's) and nothing was touched.
///
/// The uncontended case is the plain compare-and-delete, with the same key and argument: it
/// costs Redis what a hand-written lock's release costs. Only a value that carries the
/// [`WAITING_MARK`] publishes, on the channel named after the lock key.
pub(crate) static RELEASE: Lazy<Script> = Lazy::new(|| {
    Script::new(concat!(
        r"
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
if held == ARGV[1] .. '",
        waiting_mark!(),
        r"' then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[1] .. '",
        wake_channel_suffix!(),
        r"', KEYS[1])
  return 1
end
return 0
"
    ))
});

/// Set the lock's remaining ttl if it is still ours.
///
/// - `KEYS[1]` the lock key; `ARGV[1]` the token, `ARGV[2]` the new ttl in milliseconds.
/// - Returns 1 when extended, 0 when the lock was not ours (nothing touched).
pub(crate) static EXTEND: Lazy<Script> = Lazy::new(|| {
    Script::new(concat!(
        r"
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] or held == ARGV[1] .. '",
        waiting_mark!(),
        r"' then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"
    ))
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_held_by_its_token_with_or_without_the_waiting_mark() {
        assert!(holds("abc", "abc"));
        assert!(holds("abc+waiters", "abc"));
        assert!(!holds("abcd", "abc"));
        assert!(!holds("ab", "abc"));
        assert!(!holds("abc+waitersx", "abc"));
    }
}
