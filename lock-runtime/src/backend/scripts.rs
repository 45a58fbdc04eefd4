//! The Lua scripts. Each runs atomically on the Redis server, is invoked by SHA (`EVALSHA`), and
//! is sent with `SCRIPT LOAD` only when a server answers that it does not know it yet ([`invoke`]).
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
    let mut cmd = evalsha_head(script, keys.len(), argv_count, keys_bytes + argv_bytes);
    for key in keys {
        cmd.arg(*key);
    }
    cmd
}

/// `EVALSHA <sha> <key_count>`, sized for `key_count` keys and `argv_count` values of up to
/// `bytes` bytes in all, which the caller appends: for keys that are not at hand as `&str`
/// (helper keys written straight into the command, see `LockKeys::helper_arg`).
pub(crate) fn evalsha_head(
    script: &Script,
    key_count: usize,
    argv_count: usize,
    bytes: usize,
) -> Cmd {
    // "EVALSHA", the 40-hex-digit SHA, the key count (one or two digits).
    let mut cmd = Cmd::with_capacity(3 + key_count + argv_count, 7 + 40 + 2 + bytes);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(key_count);
    cmd
}

/// Runs `cmd` (from [`evalsha`]); if Redis does not know the script yet (`NOSCRIPT`: a new or
/// restarted server), loads it and runs it again.
pub(crate) async fn invoke<T, C>(script: &Script, cmd: &Cmd, connection: &mut C) -> RedisResult<T>
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

/// Lua shared by the line scripts below (prepended to their text, never spliced with data).
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/line_prelude.lua`.
const LINE_PRELUDE: &str = include_str!("scripts/line_prelude.lua");

/// A waiter's entry in a line, in the form [`LINE_PRELUDE`] reads and [`ACQUIRE`] writes: for a
/// join that appends its entry itself (`RPUSHX`, see `Backend::join_behind`), with the lease
/// `deadline` (Redis time in ms) of an earlier place.
pub(crate) fn line_entry(
    token: &str,
    deadline: u64,
    ttl_millis: u64,
    fencing: bool,
    channel: &str,
) -> String {
    format!(
        "{token} {deadline} {ttl_millis} {} {channel}",
        u8::from(fencing)
    )
}

/// Take the lock, or wait in line for it: the contended path of an acquisition (its first try
/// is a plain `SET NX PX`, see `backend/line.rs`), and every later look of a waiter.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/acquire.lua`.
pub(crate) static ACQUIRE: Lazy<Script> =
    Lazy::new(|| Script::new(&[LINE_PRELUDE, include_str!("scripts/acquire.lua")].concat()));

/// Release the lock if it is still ours, handing it to the first live waiter in line.
///
/// - `KEYS` as in [`LINE_PRELUDE`]: `KEYS[4]` the `since` record, `KEYS[5]` the lock's
///   `forced` mark, `KEYS[6]` the `released` marker below when given, and the lease table last;
///   `ARGV[1]` the token, `ARGV[2]` the claim (see
///   [`ACQUIRE`]), `ARGV[3]` `"1"` to also leave the line: a waiter that gives up, whose lock may
///   have been handed to it meanwhile; `ARGV[4]` see below (empty: none); `ARGV[5]` `"1"` where
///   receivers of a publish are counted, `ARGV[6]` Redis time in ms as the caller knows it: a
///   waiter whose lease runs past it is live without a `TIME` (empty: none; see `hand_off`).
/// - The `forced` mark (see [`FORCE_RELEASE`]) is read only when the lock is not ours.
/// - Returns 1 when the lock was ours and is now free, 2 when it was ours and is now handed to
///   a waiter (so the key is contended: the caller's next acquisition of it can skip its
///   plain `SET NX`); when it was not ours, nothing of the lock touched, why (see
///   [`NOT_OURS`]): -2 force-released, -1 another holder's, 0 nobody's.
///
/// A line of another type than a list (something else wrote it) cannot hand the lock on, but
/// must not keep it held either: the lock is deleted, and the reply is an error naming the
/// line.
///
/// With nobody in line this is the compare-and-delete of any Redis lock, plus one `LPOP` that
/// finds no line; the `DEL` also takes the lock's `since` record (see `granted`), which a holder
/// that waited has, so that nothing of the lock outlives it but its fencing counter.
///
/// A waiter leaving while the lock is kept for the line past a hold (its value ends in
/// `;hold=<end>`, see [`HOLD`]) and leaving nobody live in line behind it gives the lock back
/// the expiry a hold with nobody waiting has: the hold's end (deleted when that is past).
/// Else nobody would look at the hold's end, and the key would stay a claim longer for
/// nobody, refusing every plain `SET NX`. A lock key of another type than a string is an error
/// (`WRONGTYPE`), as in [`ACQUIRE`], once a leaving waiter's place is taken out.
///
/// A connection that sends a command again after losing its reply (a cluster connection does)
/// can run a release twice, and the second run finds the lock gone: a false "not ours". So such
/// a caller also passes `KEYS[6]`, the lock's `released` marker, and `ARGV[4]`, how long after
/// its first run a command may still be re-sent; a release that frees the lock then leaves its
/// token in the marker for that long, and a release that finds the lock not ours but its own
/// token in the marker is that same release run again, and answers 1 — even when the `forced`
/// mark holds the token too: only a run that found the lock the caller's writes the marker,
/// so the holder did release it, and an operator broke only what that release left (a key
/// kept for a hold, see [`HOLD`]). Tokens are never reused, and a forced release leaves no
/// marker, so the marker vouches for no other release; a marker that expired before a late re-send, or
/// that a later holder's release of the same lock overwrote, only brings back the "not ours",
/// never a false "released". A standalone server's caller passes them only for a release it may
/// send once more after a dropped connection: one whose connection has gone unused for a second
/// or more, and may have been closed for being idle (see `Node::unlock`).
/// Without them the release costs what it did.
pub(crate) static RELEASE: Lazy<Script> = Lazy::new(|| Script::new(&release_source()));

/// The text of [`RELEASE`]. The benchmark's floor puts the same files together in this order.
pub(crate) fn release_source() -> String {
    [
        RELEASE_UNCONTENDED,
        LINE_PRELUDE,
        NOT_OURS,
        RELEASE_CONTENDED,
    ]
    .concat()
}

/// The release of a lock nobody waits for, which every uncontended cycle runs: it returns
/// before the line's helpers are defined, since Lua builds a script's local functions anew on
/// every run and that costs Redis more than the commands of this path.
const RELEASE_UNCONTENDED: &str = include_str!("scripts/release_uncontended.lua");

/// The rest: a hand-off to `waiter` (already taken off the line) or the next live one, a lock
/// that is not ours, or a waiter leaving the line.
const RELEASE_CONTENDED: &str = include_str!("scripts/release_contended.lua");

/// Redlock's acquisition on one master: `SET NX PX`, and when someone else holds the lock, a
/// place in the lock's wake list on this master, so that a release here wakes one waiter.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/quorum_acquire.lua`.
pub(crate) static QUORUM_ACQUIRE: Lazy<Script> =
    Lazy::new(|| Script::new(include_str!("scripts/quorum_acquire.lua")));

/// Redlock's release on one master: delete the lock if it is still ours, and wake one waiter.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/quorum_release.lua`.
pub(crate) static QUORUM_RELEASE: Lazy<Script> =
    Lazy::new(|| Script::new(include_str!("scripts/quorum_release.lua")));

/// Set the lock's remaining ttl if it is still ours.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/extend.lua`.
pub(crate) static EXTEND: Lazy<Script> =
    Lazy::new(|| Script::new(&[NOT_OURS, include_str!("scripts/extend.lua")].concat()));

/// Lua shared by [`EXTEND`], [`RELEASE`] and [`HOLD`] for a lock that is not the caller's.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/not_ours.lua`.
const NOT_OURS: &str = include_str!("scripts/not_ours.lua");

/// Release a lock taken with `hold_at_least` before that time is up: instead of deleting it,
/// keep it until the hold ends, if it is still ours; and tell the first live waiter in line to
/// look again, so that it sleeps until the hold's end rather than until the ttl it last saw.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/hold.lua`.
pub(crate) static HOLD: Lazy<Script> =
    Lazy::new(|| Script::new(&[LINE_PRELUDE, NOT_OURS, include_str!("scripts/hold.lua")].concat()));

/// Break a lock for an operator (`LockManager::force_release`, `distlock release --force`):
/// release it as its holder would, if its key still holds the value the operator saw.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/force_release.lua`.
pub(crate) static FORCE_RELEASE: Lazy<Script> =
    Lazy::new(|| Script::new(&[LINE_PRELUDE, include_str!("scripts/force_release.lua")].concat()));

/// Read what inspection shows of one lock, in one atomic look (it writes nothing).
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/inspect.lua`.
pub(crate) static INSPECT: Lazy<Script> =
    Lazy::new(|| Script::new(include_str!("scripts/inspect.lua")));

/// Redlock's [`HOLD`] on one master: set the lock to expire `ARGV[2]` ms from now if it is
/// still ours, and tell the first live waiter in the wake list to look again, so that it
/// sleeps until that expiry rather than until the ttl it last saw. The waiter keeps its place:
/// nothing is handed over, and it takes the lock by its own attempt when the hold ends.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/quorum_hold.lua`.
pub(crate) static QUORUM_HOLD: Lazy<Script> =
    Lazy::new(|| Script::new(include_str!("scripts/quorum_hold.lua")));
