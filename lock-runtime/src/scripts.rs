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
/// Finding its own token is a grant too: a command that the connection sent again after a
/// dropped reply (a cluster connection does) has already taken the lock, and the fencing token
/// it was issued is still the counter's value, as nobody else can have acquired since.
///
/// A lock key that holds a list, a hash or any type other than a string was written by something
/// else than a lock: that is an error (`WRONGTYPE`), not a holder to wait for. (`GET` tells,
/// and it is in the minimal ACL already, unlike `TYPE`.)
///
/// A script that fails halfway keeps what it did: if the `INCR` fails (a counter that is not a
/// number, an ACL that denies `INCR`), the lock just taken is deleted again before the error is
/// returned, so a caller who only sees the error leaves nothing held.
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
    return {1, fence}
  end
  return {1, 0}
end
local held = redis.pcall('GET', KEYS[1])
if type(held) == 'table' and held.err then
  return redis.error_reply('WRONGTYPE the lock key holds a value of another type, not a lock')
end
if held == ARGV[1] then
  if ARGV[3] == '1' then
    return {1, tonumber(redis.call('GET', KEYS[3])) or 0}
  end
  return {1, 0}
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
///   `ARGV[1]` the token. From a connection that sends commands again, also `KEYS[3]` the
///   lock's `released` marker and `ARGV[2]` its ttl in milliseconds (see below).
/// - Returns 1 when the lock was ours and is now deleted, 0 when it was not ours (expired, or
///   another holder's) and nothing was touched.
///
/// One `DEL` removes the lock and the waiters key together: it returns 2 exactly when someone
/// waits, so an uncontended release costs the same two commands as a plain compare-and-delete,
/// with one more key to look up.
///
/// A connection that sends a command again after losing its reply (a cluster connection does)
/// can run a release twice, and the second run finds the lock gone: a false "not ours". So such
/// a caller passes `ARGV[2]`, how long after its first run a command may still be re-sent; a
/// release that deletes the lock then leaves its token in the marker for that long, and a
/// release that finds the lock not ours but its own token in the marker is that same release
/// run again, and answers 1. Tokens are never reused, so the marker vouches for no other
/// release; a marker that expired before a late re-send, or that a later holder's release of
/// the same lock overwrote, only brings back the "not ours", never a false "deleted". Without
/// `ARGV[2]` (a standalone server, Redlock: nothing is re-sent) the first block is skipped and
/// the release costs what it did.
pub(crate) static RELEASE: Lazy<Script> = Lazy::new(|| {
    Script::new(
        r"
if ARGV[2] then
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    if redis.call('GET', KEYS[3]) == ARGV[1] then return 1 end
    return 0
  end
  redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
end
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
