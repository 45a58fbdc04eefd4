//! The Lua scripts. Each runs atomically on the Redis server, is invoked by SHA (`EVALSHA`), and
//! is sent with `SCRIPT LOAD` only when a server answers that it does not know it yet ([`invoke`]).
//! Keys always travel in `KEYS`, values in `ARGV`: nothing is ever spliced into the script text.

use once_cell::sync::Lazy;
use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, RedisResult, Script};

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
        Err(error) if crate::redis::classify::is_no_script(&error) => {
            Box::pin(script.load_async(connection)).await?;
            cmd.query_async(connection).await
        }
        other => other,
    }
}

/// Lua shared by the line scripts below (prepended to their text, never spliced with data).
///
/// The KEYS it expects and the functions it defines are in the header of
/// `backend/scripts/line_prelude.lua`.
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

/// Release the lock if it is still ours, handing it to the first live waiter in line; also a
/// waiter leaving the line, and a release re-sent after a lost reply (the `released` marker).
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/release_uncontended.lua`.
pub(crate) static RELEASE: Lazy<Script> = Lazy::new(|| Script::new(&release_source()));

/// The release of a lock held alone: taken by a first try's `SET NX`, with nobody in its line.
/// It changes nothing otherwise, and the caller then sends [`RELEASE`].
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/release_alone.lua`.
pub(crate) static RELEASE_ALONE: Lazy<Script> =
    Lazy::new(|| Script::new(include_str!("scripts/release_alone.lua")));

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

/// The release of a lock nobody waits for, which every uncontended cycle runs (why it comes
/// before [`LINE_PRELUDE`]: see the file's header).
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
/// The function's arguments and results are in the header of `backend/scripts/not_ours.lua`.
const NOT_OURS: &str = include_str!("scripts/not_ours.lua");

/// Release a lock taken with `hold_at_least` before that time is up: keep it until the hold
/// ends, and wake the first live waiter in line to look again then.
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

/// Record an order in which a task took locks of two key templates, and read the opposite
/// order's record (see `backend::orders`).
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/order_record.lua`.
pub(crate) static ORDER_RECORD: Lazy<Script> =
    Lazy::new(|| Script::new(include_str!("scripts/order_record.lua")));

/// Read what inspection shows of one lock, in one atomic look (it writes nothing).
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/inspect.lua`.
pub(crate) static INSPECT: Lazy<Script> =
    Lazy::new(|| Script::new(include_str!("scripts/inspect.lua")));

/// Redlock's [`HOLD`] on one master: keep the lock until the hold ends and wake the first live
/// waiter in the wake list to look again; nothing is handed over.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/quorum_hold.lua`.
pub(crate) static QUORUM_HOLD: Lazy<Script> =
    Lazy::new(|| Script::new(include_str!("scripts/quorum_hold.lua")));

/// Lua shared by the semaphore, read-write and several-key scripts below (prepended to their
/// text).
///
/// The functions it defines are in the header of `backend/scripts/family_prelude.lua`.
const FAMILY_PRELUDE: &str = include_str!("scripts/family_prelude.lua");

/// The fair line of a read-write lock, shared by [`RW_ACQUIRE`] and [`RW_RELEASE`].
const RW_LINE: &str = include_str!("scripts/rw_line.lua");

/// Take a permit of a semaphore, or wait in its line: every attempt and look of a permit's
/// waiter (an uncontended permit is this one call).
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/semaphore_acquire.lua`.
pub(crate) static SEMAPHORE_ACQUIRE: Lazy<Script> = Lazy::new(|| {
    Script::new(
        &[
            FAMILY_PRELUDE,
            include_str!("scripts/semaphore_acquire.lua"),
        ]
        .concat(),
    )
});

/// Give a permit back, handing it to the next live waiter; or leave the permit line.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/semaphore_release.lua`.
pub(crate) static SEMAPHORE_RELEASE: Lazy<Script> = Lazy::new(|| {
    Script::new(
        &[
            FAMILY_PRELUDE,
            include_str!("scripts/semaphore_release.lua"),
        ]
        .concat(),
    )
});

/// Set the remaining lease of a permit or of a reader, if it is still the caller's.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/semaphore_extend.lua`.
pub(crate) static SEMAPHORE_EXTEND: Lazy<Script> = Lazy::new(|| {
    Script::new(&[FAMILY_PRELUDE, include_str!("scripts/semaphore_extend.lua")].concat())
});

/// Break the leases of a semaphore or of readers that an operator saw, and let in the head of
/// the line.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/leased_force_release.lua`.
pub(crate) static LEASED_FORCE_RELEASE: Lazy<Script> = Lazy::new(|| {
    Script::new(
        &[
            FAMILY_PRELUDE,
            RW_LINE,
            include_str!("scripts/leased_force_release.lua"),
        ]
        .concat(),
    )
});

/// Whether a permit or a reader's lease is still the caller's; writes nothing.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/leased_held.lua`.
pub(crate) static LEASED_HELD: Lazy<Script> =
    Lazy::new(|| Script::new(&[FAMILY_PRELUDE, include_str!("scripts/leased_held.lua")].concat()));

/// What inspection shows of a leased set: every permit or reader with its lease.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/semaphore_inspect.lua`.
pub(crate) static LEASED_INSPECT: Lazy<Script> = Lazy::new(|| {
    Script::new(
        &[
            FAMILY_PRELUDE,
            include_str!("scripts/semaphore_inspect.lua"),
        ]
        .concat(),
    )
});

/// Take a read or write lock, or wait in the lock's fair line.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/rw_acquire.lua`.
pub(crate) static RW_ACQUIRE: Lazy<Script> = Lazy::new(|| {
    Script::new(
        &[
            FAMILY_PRELUDE,
            RW_LINE,
            include_str!("scripts/rw_acquire.lua"),
        ]
        .concat(),
    )
});

/// Release a read or write lock, letting in the head of the line; or leave the line.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/rw_release.lua`.
pub(crate) static RW_RELEASE: Lazy<Script> = Lazy::new(|| {
    Script::new(
        &[
            FAMILY_PRELUDE,
            RW_LINE,
            include_str!("scripts/rw_release.lua"),
        ]
        .concat(),
    )
});

/// Take several locks of one slot, all or none, or wait in the line of the first busy one.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/multi_acquire.lua`.
pub(crate) static MULTI_ACQUIRE: Lazy<Script> = Lazy::new(|| {
    Script::new(&[FAMILY_PRELUDE, include_str!("scripts/multi_acquire.lua")].concat())
});

/// Release several locks taken together, handing each to the first live waiter of its line.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/multi_release.lua`.
pub(crate) static MULTI_RELEASE: Lazy<Script> = Lazy::new(|| {
    Script::new(&[FAMILY_PRELUDE, include_str!("scripts/multi_release.lua")].concat())
});

/// Set the remaining ttl of several locks taken together, each only if still the caller's.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/multi_extend.lua`.
pub(crate) static MULTI_EXTEND: Lazy<Script> =
    Lazy::new(|| Script::new(&[FAMILY_PRELUDE, include_str!("scripts/multi_extend.lua")].concat()));
/// Write, renew or end the wait records of a lock's holder, only while it holds the lock.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/wait_record.lua`.
pub(crate) static WAIT_RECORD: Lazy<Script> =
    Lazy::new(|| Script::new(&[FAMILY_PRELUDE, include_str!("scripts/wait_record.lua")].concat()));

/// One look of a deadlock walk: a lock's holders and their live wait records.
///
/// KEYS, ARGV and the reply are in the header of `backend/scripts/wait_look.lua`.
pub(crate) static WAIT_LOOK: Lazy<Script> =
    Lazy::new(|| Script::new(&[FAMILY_PRELUDE, include_str!("scripts/wait_look.lua")].concat()));
