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

/// Try to take the lock; on failure report how long the holder may still hold it.
///
/// Runs from an acquisition's second attempt on, and from the first with fencing; a first try
/// without fencing is a plain `SET NX PX` (see `backend/node.rs`).
///
/// - `KEYS[1]` the lock key, `KEYS[2]` its waiters key, `KEYS[3]` its fencing counter (only
///   with fencing).
/// - `ARGV[1]` the token, `ARGV[2]` the ttl in milliseconds, `ARGV[3]` `"1"` to issue a fencing
///   token, `ARGV[4]` `"1"` when the caller is subscribed to the wake-up channel and will wait.
/// - Returns `{1, fence}` when acquired (`fence` is 0 unless asked for), `{0, pttl}` when someone
///   else holds it (`pttl` as `PTTL` returns it: milliseconds left, or -1 for a key without expiry).
///
/// The waiters key tells the releasing script that someone waits, so a release publishes a
/// wake-up only then. It outlives the holder's current ttl by a second; a waiter renews it on
/// each failed attempt, and every waiter attempts again at the latest when that ttl runs out.
/// The lock key itself is never written by a waiter: it holds exactly its holder's token.
///
/// A lock key that holds a list, a hash or any type other than a string was written by something
/// else than a lock: that is an error (`WRONGTYPE`), not a holder to wait for. (`GET` tells,
/// and it is in the minimal ACL already, unlike `TYPE`.)
///
/// A script that fails halfway keeps what it did: if the `INCR` fails (a counter that is not a
/// number, an ACL that denies `INCR`), the lock just taken is deleted again before the error is
/// returned, so a caller who only sees the error leaves nothing held. The same holds for a
/// counter that something else set below 0: its next value would not be above every token
/// issued before, so the lock is given back, the counter put back as it was (so every later
/// acquisition fails the same way until someone looks, rather than quietly counting up to 1),
/// and the error names the counter.
pub(crate) static ACQUIRE: Lazy<Script> = Lazy::new(|| {
    Script::new(
        r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[3] == '1' then
    local fence = redis.pcall('INCR', KEYS[3])
    if type(fence) == 'table' and fence.err then
      redis.call('DEL', KEYS[1])
      return fence
    end
    if fence < 1 then
      redis.call('DEL', KEYS[1])
      redis.call('SET', KEYS[3], fence - 1)
      return redis.error_reply('ERR distlock: the fencing counter ' .. KEYS[3] .. ' holds ' ..
        (fence - 1) .. ', below 0, so no token above every earlier one can be issued and the ' ..
        'lock was not taken; set the counter above the largest token your storage has ' ..
        'accepted, or delete it if no storage has seen its tokens')
    end
    return {1, fence}
  end
  return {1, 0}
end
local held = redis.pcall('GET', KEYS[1])
if type(held) == 'table' and held.err then
  return redis.error_reply('WRONGTYPE the lock key holds a value of another type, not a lock')
end
local pttl = redis.call('PTTL', KEYS[1])
if ARGV[4] == '1' then
  local keep = pttl
  if keep < 0 then keep = tonumber(ARGV[2]) end
  redis.call('SET', KEYS[2], '1', 'PX', keep + 1000)
end
return {0, pttl}
",
    )
});

/// Delete the lock if it is still ours, and wake the waiters if there are any.
///
/// - `KEYS[1]` the lock key, `KEYS[2]` its waiters key, whose name is also the wake-up channel;
///   `ARGV[1]` the token.
/// - Returns 1 when the lock was ours and is now deleted, 0 when it was not ours (expired, or
///   another holder's) and nothing was touched.
///
/// One `DEL` removes the lock and the waiters key together: it returns 2 exactly when someone
/// waits, so an uncontended release costs the same two commands as a plain compare-and-delete,
/// with one more key to look up.
pub(crate) static RELEASE: Lazy<Script> = Lazy::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if redis.call('DEL', KEYS[1], KEYS[2]) == 2 then
    redis.call('PUBLISH', KEYS[2], KEYS[1])
  end
  return 1
end
return 0
",
    )
});

/// Set the lock's remaining ttl if it is still ours.
///
/// - `KEYS[1]` the lock key; `ARGV[1]` the token, `ARGV[2]` the new ttl in milliseconds.
/// - Returns 1 when extended, 0 when the lock was not ours (nothing touched).
pub(crate) static EXTEND: Lazy<Script> = Lazy::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
",
    )
});
