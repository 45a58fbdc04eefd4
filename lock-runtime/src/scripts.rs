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
/// They expect `KEYS[1]` the lock key, `KEYS[2]` its line, `KEYS[3]` its fencing counter,
/// `KEYS[4]` its `since` record (see `granted` below; written only by scripts that hand over),
/// and the lock's lease table as the last key (`KEYS[#KEYS]`). The line is a list of waiters,
/// oldest first, each entry `"<token> <lease deadline ms> <ttl ms> <fencing 0|1> <grant
/// channel>"`: everything a release needs to hand the lock over is in the entry it pops, so a
/// hand-off costs no lookup besides the clock. The lease table is a sorted set of the tokens
/// whose places were renewed, each scored by the lease deadline its last renewal gave (Redis
/// time in ms): a renewal writes there, in O(log n), and leaves its entry as it was (see
/// [`ACQUIRE`]). So a waiter's place lasts until the later of its entry's deadline and its score.
///
/// `next_fence()`: the next fencing token, or `nil` and an error reply naming the counter. A
/// counter that is not a number (or not a string) fails `INCR`; one that something else set below 0 would give a token that is not
/// above every earlier one: it is put back as it was (so every later acquisition fails the same
/// way until someone looks, rather than quietly counting up to 1), and the error names it.
///
/// `hand_off(claim, except, quiet, popped, counted, known)`: gives the free lock to the first
/// live waiter in line (starting with `popped`, an entry the caller already took off the line,
/// when given) other than `except` (a releasing holder is never handed its own lock back): sets
/// the lock key to its token with a ttl of `min(its ttl, claim)`, issues its fencing token when
/// it asked for one, and publishes `"<token> <fence>"` on its grant channel (`"<token> !"` when
/// its fencing token cannot be issued: it is then dropped from the line). Dead waiters are
/// dropped on the way. Returns `{token, fence, ttl}` of the new holder (fence 0 without
/// fencing); `false` when nobody live waits. The waiter `quiet` is not sent a message: it is the
/// caller, and learns from the reply.
///
/// Who is dead: a waiter whose lease has run out (it stopped renewing: its process died, or its
/// network did): its entry's deadline has passed, and so has its score in the lease table, which
/// is read only then (a waiter that waited less than a renewal has none). A waiter skipped as
/// unheard or whose fencing token failed has its score set to 0 (`forget_lease`, which never
/// adds one), so that its next renewal looks for its place, finds none, and takes one at the
/// end; a dead one's score has run out, which a renewal checks too. The lease table's commands
/// run in `pcall`: refused by an ACL written before distlock used them, every renewal looks for
/// its entry and rewrites its deadline there, as without a table.
///
/// A lease that runs past `known` — Redis time in ms as the caller knows it from
/// its own last place in this line (see `Backend::redis_clock`) — has surely not run out, and
/// costs no `TIME`; only one that does not (or without `known`) is judged against `TIME`, read
/// once. So a `known` that is wrong (read off another server's clock, before a failover) never
/// has a live waiter skipped, and in a busy line, whose waiters all renew, the release reads no
/// clock. And with `counted` (a standalone server or a Sentinel
/// master, where `PUBLISH` answers how many connections received the message), a waiter whose
/// grant nobody received: its process is gone (a killed process's connection closes, and its
/// subscription with it), however long its lease has left. The lock goes on to the next waiter
/// in the same script, and the fencing token the unheard one was issued, if any, is taken back
/// (the counter is set back), so no token goes to nobody. A waiter's place names a channel only
/// while its process knows itself subscribed, so a live process is unheard only when its
/// connection dropped and it has not seen that yet: it loses its place, and takes one again at
/// its next look. On a cluster a
/// publish reaches every node but counts only the receivers on the lock's node: receivers
/// cannot be counted there, and leases alone tell.
///
/// `granted(holder, ttl, now)`: records in the lock's `since` key that `holder` got the lock now
/// (Redis time in ms: `now` when the caller knows it — a hand-off takes `known` rather than read
/// the clock, as it does for leases; it is off only by what separates two servers' clocks after
/// a failover, which a time shown to an operator can bear): `"<holder's UUID> <ms>"`, for
/// `ttl` ms — the ttl the lock key was just given, a hand-off's claim included, so that the
/// record of a holder that dies before confirming its full ttl expires with its lock — which
/// every extension of the lock renews (see [`EXTEND`]). A holder whose value was
/// written before it waited (a hand-off, a waiter that finds the lock free) would otherwise
/// show its wait as time held; inspection takes the record only while it names the lock's
/// current holder (UUIDs are never reused). A first try writes no record: its value is made
/// just before it, and its `SET NX` stays the only command of an uncontended acquisition.
///
/// `first_live(except)`: the first waiter in line whose lease still runs, other than `except`:
/// its token, its grant channel and the time now (read only when someone is in line); `nil` when
/// nobody live waits.
///
/// `lease_of(token, deadline, now)`: whether a place whose entry says `deadline` still runs at
/// `now`, by its entry or else by its score in the lease table.
///
/// `find(token)`: the index and text of `token`'s entry in line, or `nil`: a scan of the line.
///
/// `place_of(token, entry)`: the index of `token`'s entry, looked up by its exact text `entry`
/// with `LPOS` (a scan inside Redis, without copying the line into Lua); by `find` when that
/// finds nothing (`entry` is not what the line holds: a re-sent renewal rewrote it) or `LPOS`
/// is refused (an ACL written before distlock used it).
const LINE_PRELUDE: &str = r"
local LEASES = KEYS[#KEYS]

local function next_fence()
  local fence = redis.pcall('INCR', KEYS[3])
  if type(fence) == 'table' and fence.err then
    return nil, redis.error_reply((string.match(fence.err, '^(%u+) ') or 'ERR') ..
      ' distlock: the fencing counter ' .. KEYS[3] .. ' cannot issue a token (' .. fence.err ..
      '), so the lock was not taken; set it to an integer above the largest token your ' ..
      'storage has accepted, or delete it if no storage has seen its tokens')
  end
  if fence < 1 then
    redis.call('SET', KEYS[3], fence - 1)
    return nil, redis.error_reply('ERR distlock: the fencing counter ' .. KEYS[3] .. ' holds ' ..
      (fence - 1) .. ', below 0, so no token above every earlier one can be issued and the ' ..
      'lock was not taken; set the counter above the largest token your storage has ' ..
      'accepted, or delete it if no storage has seen its tokens')
  end
  return fence
end

local function now_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

local function lease_of(token, deadline, now)
  if tonumber(deadline) >= now then
    return true
  end
  local renewed = tonumber(redis.pcall('ZSCORE', LEASES, token))
  return renewed ~= nil and renewed >= now
end

local function forget_lease(token)
  redis.pcall('ZADD', LEASES, 'XX', 0, token)
end

local function granted(holder, ttl, now)
  redis.call('SET', KEYS[4], string.sub(holder, 1, 36) .. ' ' .. (now or now_ms()), 'PX', ttl)
end

local function hand_off(claim, except, quiet, popped, counted, known)
  local now = nil
  while true do
    local entry = popped or redis.call('LPOP', KEYS[2])
    popped = nil
    if not entry then
      return false
    end
    local waiter, deadline, ttl, fencing, channel =
      string.match(entry, '^(%S+) (%d+) (%d+) ([01]) (.*)$')
    local live = waiter ~= nil and waiter ~= except
    if live and not (known and tonumber(deadline) >= known) then
      now = now or now_ms()
      live = lease_of(waiter, deadline, now)
    end
    if live then
      local fence, failed = 0, nil
      if fencing == '1' then
        fence, failed = next_fence()
      end
      if failed then
        forget_lease(waiter)
        if channel ~= '' then
          redis.call('PUBLISH', channel, waiter .. ' !')
        end
      else
        local px = math.min(tonumber(ttl), claim)
        redis.call('SET', KEYS[1], waiter, 'PX', px)
        granted(waiter, px, now or known)
        local heard = 1
        if channel ~= '' and waiter ~= quiet then
          heard = redis.call('PUBLISH', channel, waiter .. ' ' .. fence)
        end
        if heard > 0 or not counted then
          return {waiter, fence, px}
        end
        forget_lease(waiter)
        if fence > 0 then
          redis.call('SET', KEYS[3], fence - 1)
        end
      end
    end
  end
end

local function first_live(except)
  local entries = redis.call('LRANGE', KEYS[2], 0, -1)
  if #entries == 0 then
    return nil
  end
  local now = now_ms()
  for _, entry in ipairs(entries) do
    local token, deadline, channel = string.match(entry, '^(%S+) (%d+) %d+ [01] (.*)$')
    if token and token ~= except and lease_of(token, deadline, now) then
      return token, channel, now
    end
  end
  return nil
end

local function find(token)
  local entries = redis.call('LRANGE', KEYS[2], 0, -1)
  local prefix = token .. ' '
  for index, entry in ipairs(entries) do
    if string.sub(entry, 1, #prefix) == prefix then
      return index - 1, entry
    end
  end
  return nil
end

local function place_of(token, entry)
  if entry ~= '' then
    local index = redis.pcall('LPOS', KEYS[2], entry)
    if type(index) == 'number' then
      return index
    end
  end
  return find(token)
end
";

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
/// is a plain `SET NX PX`, see `backend/node.rs`), and every later look of a waiter.
///
/// - `KEYS` as in [`LINE_PRELUDE`]: the lock, its line, its fencing counter, its lease table.
/// - `ARGV[1]` the token, `ARGV[2]` the ttl in ms, `ARGV[3]` `"1"` to issue a fencing token,
///   `ARGV[4]` the waiter's grant channel (empty: it is not subscribed, and finds its grant by
///   looking again), `ARGV[5]` the lease of a place in line in ms, `ARGV[6]` the claim: the
///   longest ttl a hand-off gives before the new holder confirms it, `ARGV[7]` what to do when
///   the lock is someone else's: `"first"` nothing (a first try, which takes no place in line
///   before it listens for hand-offs), `"join"` take a place at the end, `"renew"` renew the
///   caller's place (or take one at the end, when it lapsed), `ARGV[8]` `"1"` where receivers
///   of a publish are counted (see `hand_off`); for `"renew"`, `ARGV[9]` the caller's entry
///   exactly as it was written (empty: not known, the entry is looked for by token) and
///   `ARGV[10]` the lease deadline its last renewal was given (empty: none since its entry was
///   written, or its place may have been handed on or dropped meanwhile: look for it).
/// - Returns `{1, fence, pttl}` when the caller holds the lock (`fence` 0 without fencing,
///   `pttl` what is left of its ttl), `{0, pttl, deadline, written}` when it waits first in line
///   behind a holder with `pttl` left (-1: no expiry), `pttl` -3 when it waits behind another
///   waiter; `deadline` is when its place lapses (Redis time in ms), 0 for a first try, which
///   takes no place. `written` says what became of the caller's entry: 0 left as it was (the
///   renewal went to the lease table), 1 (re)written as `"<ARGV[1]> <deadline> <ARGV[2]>
///   <ARGV[3]> <ARGV[4]>"` and its lease recorded in the table too, 2 written so but no lease
///   recorded (a join, or a first try's nothing). A caller may give that deadline to a place it
///   takes in the same line within a renewal, without this script: see `Backend::try_lock`.
///
/// Only the first waiter is told the holder's ttl: it is the one to look when the holder dies
/// without releasing, and its look hands the lock on. A waiter further back relies on the
/// hand-off message and its renewal (which tells it the ttl once it is first), so a join
/// behind others costs no `PTTL`.
///
/// First come, first served: a free lock goes to the first live waiter in line, so a caller
/// that was not in line, or not first, hands it on and waits. Finding its own token is a grant
/// too: a hand-off whose message it has not heard, or a command that the connection sent again
/// after a dropped reply (a cluster connection does) — the fencing token it was issued is the
/// counter's value, as nobody else can have acquired since.
///
/// A waiter renews its place within its lease; one that does not (it died, or its network did)
/// is skipped by the next hand-off, and one whose place lapsed joins again at the end. Every
/// join and renewal sets the line to expire two leases later (a renewal, its lease table too):
/// so nothing outlives the last waiter, and a line that never empties (a busy fleet, whose
/// waiters wait less than a renewal) does not expire under its waiters either.
///
/// A renewal costs the same however long the line: it does not look for the caller's entry
/// when the lease table still holds the very lease the caller's last renewal was given
/// (`ZSCORE`), and that lease has not run out: its place is then where it was, since a place
/// leaves the line only by a hand-off to it (whose message the caller heard, or it would not
/// pass that lease), by its own leaving, by being skipped (dead: its lease ran out; unheard:
/// its score is set to 0) or with the whole line (a `FLUSHALL`, a restart: the table goes
/// too). It writes the new lease into the table (`ZADD`), takes out the scores that have run
/// out (`ZREMRANGEBYSCORE`, each once) and reads the line's first entry (`LINDEX 0`) to know
/// whether it is first. Otherwise — the first renewal after a join, a place that names no
/// channel or another one than now, a place that may have been handed on — it looks for the
/// entry by its exact text (`LPOS`, inside Redis) and rewrites it (`LSET`), or takes a place at
/// the end when it is gone.
///
/// A lock released within its `hold_at_least` while someone waited is still in its lock key,
/// kept a claim past the hold, its value the releaser's token followed by `;hold=<hold's end>`
/// (see [`HOLD`]): the `GET` above reads it, so telling costs no command. While the hold runs,
/// the holder's remaining time reported is the hold's (so the first waiter looks again when it
/// ends), and once it is over the lock is free for the line: it goes to the first live waiter
/// other than the releaser, as a free lock does, while a first try's plain `SET NX` still finds
/// the key and fails. A value without the suffix is a holder as any other, with no `TIME` for
/// it.
///
/// A lock key that holds a list, a hash or any type other than a string was written by something
/// else than a lock: that is an error (`WRONGTYPE`), not a holder to wait for. (`GET` tells,
/// and it is in the minimal ACL already, unlike `TYPE`.) A fencing counter that cannot issue a
/// token (see `next_fence`) fails the acquisition before anything is taken.
pub(crate) static ACQUIRE: Lazy<Script> = Lazy::new(|| {
    Script::new(
        &[
            LINE_PRELUDE,
            r"
local held = redis.pcall('GET', KEYS[1])
if type(held) == 'table' and held.err then
  return redis.error_reply('WRONGTYPE the lock key holds a value of another type, not a lock')
end
if held == ARGV[1] then
  local fence = 0
  if ARGV[3] == '1' then
    fence = tonumber(redis.call('GET', KEYS[3])) or 0
  end
  return {1, fence, redis.call('PTTL', KEYS[1])}
end
local hold_left, released = nil, nil
if held then
  local releaser, ends = string.match(held, '^(.*);hold=(%d+)$')
  if releaser then
    hold_left = tonumber(ends) - now_ms()
    if hold_left <= 0 then
      hold_left = nil
      released = releaser
      held = false
    end
  end
end
local function remaining()
  return hold_left or redis.call('PTTL', KEYS[1])
end
if not held then
  local first = hand_off(tonumber(ARGV[6]), released, ARGV[1], nil, ARGV[8] == '1')
  if not first then
    local fence = 0
    if ARGV[3] == '1' then
      local failed
      fence, failed = next_fence()
      if failed then
        return failed
      end
    end
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    if ARGV[7] ~= 'first' then
      granted(ARGV[1], ARGV[2])
    end
    return {1, fence, tonumber(ARGV[2])}
  end
  if first[1] == ARGV[1] then
    return {1, first[2], first[3]}
  end
end
if ARGV[7] == 'first' then
  return {0, remaining(), 0, 2}
end
local lease = tonumber(ARGV[5])
local now = now_ms()
local deadline = now + lease
local index, written = nil, 2
if ARGV[7] == 'renew' then
  local leased = tonumber(ARGV[10])
  if leased and leased >= now and tonumber(redis.pcall('ZSCORE', LEASES, ARGV[1])) == leased then
    local first = redis.pcall('LINDEX', KEYS[2], 0)
    if type(first) == 'string' then
      index = 1
      if string.sub(first, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
        index = 0
      end
      written = 0
    end
  end
  if not index then
    index = place_of(ARGV[1], ARGV[9])
  end
  if ARGV[9] ~= '' or written == 0 then
    redis.pcall('ZREMRANGEBYSCORE', LEASES, '-inf', '(' .. now)
    if type(redis.pcall('ZADD', LEASES, deadline, ARGV[1])) == 'number' then
      redis.call('PEXPIRE', LEASES, 2 * lease)
      if written ~= 0 then
        written = 1
      end
    elseif written == 0 then
      index, written = place_of(ARGV[1], ARGV[9]), 2
    end
  end
end
if written ~= 0 then
  local entry = ARGV[1] .. ' ' .. deadline .. ' ' .. ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. ARGV[4]
  if index then
    redis.call('LSET', KEYS[2], index, entry)
  else
    index = redis.call('RPUSH', KEYS[2], entry) - 1
  end
end
redis.call('PEXPIRE', KEYS[2], 2 * lease)
if index > 0 then
  return {0, -3, deadline, written}
end
return {0, remaining(), deadline, written}
",
        ]
        .concat(),
    )
});

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

/// The text of [`RELEASE`] (for the benchmark, which sends it by hand as a floor).
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
const RELEASE_UNCONTENDED: &str = r"
local held = redis.pcall('GET', KEYS[1])
local ours = held == ARGV[1]
local waiter = nil
if ours and ARGV[3] ~= '1' then
  if ARGV[4] ~= '' then
    redis.call('SET', KEYS[6], ARGV[1], 'PX', ARGV[4])
  end
  waiter = redis.pcall('LPOP', KEYS[2])
  if not waiter then
    redis.call('DEL', KEYS[1], KEYS[4])
    return 1
  end
end
";

/// The rest: a hand-off to `waiter` (already taken off the line) or the next live one, a lock
/// that is not ours, or a waiter leaving the line.
const RELEASE_CONTENDED: &str = r"
if type(waiter) == 'table' then
  redis.call('DEL', KEYS[1], KEYS[4])
  return redis.error_reply('WRONGTYPE distlock: the lock ' .. KEYS[1] .. ' was released, ' ..
    'but its line ' .. KEYS[2] .. ' holds a value of another type, so nobody in it could be ' ..
    'handed the lock: something other than distlock wrote that key; delete it')
end
if ARGV[3] == '1' then
  local index, entry = find(ARGV[1])
  if index then
    redis.call('LREM', KEYS[2], 1, entry)
  end
end
if type(held) == 'table' then
  return redis.error_reply('WRONGTYPE the lock key holds a value of another type, not a lock')
end
if not ours and ARGV[3] == '1' and held then
  local releaser, ends = string.match(held, '^(.*);hold=(%d+)$')
  if releaser and not first_live(releaser) then
    local left = tonumber(ends) - now_ms()
    if left > 0 then
      redis.call('PEXPIRE', KEYS[1], left)
    else
      redis.call('DEL', KEYS[1])
    end
  end
end
if not ours then
  local why = not_ours(held, KEYS[5], ARGV[1])
  if ARGV[4] ~= '' and redis.call('GET', KEYS[6]) == ARGV[1] then
    return 1
  end
  return why
end
if ARGV[4] ~= '' and ARGV[3] == '1' then
  redis.call('SET', KEYS[6], ARGV[1], 'PX', ARGV[4])
end
if not hand_off(tonumber(ARGV[2]), ARGV[1], nil, waiter, ARGV[5] == '1', tonumber(ARGV[6])) then
  redis.call('DEL', KEYS[1], KEYS[4])
  return 1
end
return 2
";

/// Redlock's acquisition on one master: `SET NX PX`, and when someone else holds the lock, a
/// place in the lock's wake list on this master, so that a release here wakes one waiter.
///
/// - `KEYS[1]` the lock key, `KEYS[2]` its wake list: a sorted set of waiters, each member
///   `"<channel> <token>"` (the pub/sub channel its process listens on, its token) scored by
///   the deadline of its lease in ms (Redis time); `KEYS[3]` its `since` record (see `granted`
///   in [`LINE_PRELUDE`]).
/// - `ARGV[1]` the token, `ARGV[2]` the ttl in ms, `ARGV[3]` the caller's member (empty: it is
///   not subscribed, and takes no place), `ARGV[4]` the lease of a place in ms, `ARGV[5]` `"1"`
///   when the caller has waited (its value, made before its first try, is older than this
///   grant, which is then recorded in `KEYS[3]`).
/// - Returns `{1}` when acquired (or found already ours: a re-sent command), `{0, pttl,
///   holder}` when someone else holds it (`pttl` -1: no expiry; `holder` the value of the lock
///   key, so that the caller can tell one holder on several masters from a split).
///
/// Taking a place is a `ZADD`: a renewal or a re-sent command moves the same member's lease,
/// never adds a second place. The lease's deadline is rounded up to the next 100 ms, so that
/// waiters registering at about the same time on every master (an attempt reaches them all at
/// once) tie on each, and ties are ordered by member, the same on every master: a release on
/// all masters then wakes the same waiter on each, not one per master. A waiter that gets the lock here takes its place out. The list
/// expires two leases after its last join or renewal, so nothing outlives the last waiter. The
/// lock key itself is never written by a waiter.
pub(crate) static QUORUM_ACQUIRE: Lazy<Script> = Lazy::new(|| {
    Script::new(
        r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[3] ~= '' then
    redis.call('ZREM', KEYS[2], ARGV[3])
  end
  if ARGV[5] == '1' then
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    redis.call('SET', KEYS[3], string.sub(ARGV[1], 1, 36) .. ' ' .. now, 'PX', ARGV[2])
  end
  return {1}
end
local held = redis.pcall('GET', KEYS[1])
if type(held) == 'table' and held.err then
  return redis.error_reply('WRONGTYPE the lock key holds a value of another type, not a lock')
end
if held == ARGV[1] then
  if ARGV[3] ~= '' then
    redis.call('ZREM', KEYS[2], ARGV[3])
  end
  return {1}
end
local pttl = redis.call('PTTL', KEYS[1])
if ARGV[3] ~= '' then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local lease = tonumber(ARGV[4])
  redis.call('ZADD', KEYS[2], math.floor((now + lease) / 100) * 100 + 100, ARGV[3])
  redis.call('PEXPIRE', KEYS[2], 2 * lease)
end
return {0, pttl, held}
",
    )
});

/// Redlock's release on one master: delete the lock if it is still ours, and wake one waiter.
///
/// - `KEYS[1]` the lock key, `KEYS[2]` its wake list (see [`QUORUM_ACQUIRE`]), `KEYS[3]` its
///   `since` record, deleted with the lock.
/// - `ARGV[1]` the token, `ARGV[2]` the caller's own member, taken out of the wake list whether
///   or not the lock is ours (empty: none), `ARGV[3]` `"1"` to wake a waiter when the lock is
///   deleted: a release; `"0"` for a contender giving back the masters of an attempt that did
///   not reach a majority, which retries on its own and must not wake a waiter that would only
///   find the lock held by whoever won.
/// - Returns 1 when the lock was ours and is now deleted, 0 when it was not ours (nothing of
///   the lock touched).
///
/// The wake-up goes to the first live waiter only: places are taken out earliest lease first,
/// those whose lease ran out (their waiter died, or its network did) dropped on the way, and the
/// first still running is sent `"<token> ?"` on its channel (one `ZPOPMIN` when nobody died). So a release wakes at most one waiter per master
/// however many wait, and a dead waiter's place is skipped at most a lease after its last
/// renewal. With nobody waiting this is the compare-and-delete of any Redis lock plus one
/// `EXISTS`.
pub(crate) static QUORUM_RELEASE: Lazy<Script> = Lazy::new(|| {
    Script::new(
        r"
local waiting = redis.call('EXISTS', KEYS[2]) == 1
if waiting and ARGV[2] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[2])
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[3])
if waiting and ARGV[3] == '1' then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  while true do
    local first = redis.call('ZPOPMIN', KEYS[2])
    if not first[1] then
      break
    end
    if tonumber(first[2]) >= now then
      local channel, waiter = string.match(first[1], '^(%S+) (.+)$')
      if channel then
        redis.call('PUBLISH', channel, waiter .. ' ?')
        break
      end
    end
  end
end
return 1
",
    )
});

/// Set the lock's remaining ttl if it is still ours.
///
/// - `KEYS[1]` the lock key, `KEYS[2]` its `forced` mark (see [`FORCE_RELEASE`]), `KEYS[3]` its
///   `since` record (see `granted` in [`LINE_PRELUDE`]), which lives as long as the lock (when
///   there is one: expiring a missing key is a no-op); `ARGV[1]` the token, `ARGV[2]` the new
///   ttl in milliseconds.
/// - Returns 1 when extended; when the lock was not ours (nothing touched), why: -2 an
///   operator force-released it (the mark holds the token), -1 another holder has it, 0 nobody
///   does. The mark is read only then, so an extension costs what it did.
pub(crate) static EXTEND: Lazy<Script> = Lazy::new(|| {
    Script::new(
        &[
            NOT_OURS,
            r"
local held = redis.pcall('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return not_ours(held, KEYS[2], ARGV[1])
",
        ]
        .concat(),
    )
});

/// Lua shared by [`EXTEND`], [`RELEASE`] and [`HOLD`] for a lock that is not the caller's.
///
/// `not_ours(held, forced, token)`: why the lock whose key read `held` (a `GET` through
/// `pcall`) is not `token`'s — -2 when the `forced` mark (a key name; `nil`: none passed) holds
/// `token`, -1 when someone else holds it, 0 when nobody does — or the error of a lock key of
/// another type, naming it. A mark of another type is no mark: it only costs the cause.
const NOT_OURS: &str = r"
local function not_ours(held, forced, token)
  if type(held) == 'table' then
    return redis.error_reply('WRONGTYPE distlock: the lock key ' .. KEYS[1] ..
      ' holds a value of another type, not a lock')
  end
  if forced then
    local mark = redis.pcall('GET', forced)
    if mark == token then
      return -2
    end
  end
  if held then
    return -1
  end
  return 0
end
";

/// Release a lock taken with `hold_at_least` before that time is up: instead of deleting it,
/// keep it until the hold ends, if it is still ours; and tell the first live waiter in line to
/// look again, so that it sleeps until the hold's end rather than until the ttl it last saw.
///
/// - `KEYS[1]` the lock key, `KEYS[2]` its line (the prelude's line helpers only: no fencing
///   token is issued here, so `KEYS[3]` is free: the `forced` mark, see [`FORCE_RELEASE`]),
///   `KEYS[4]` its `since` record (see `granted` in [`LINE_PRELUDE`]), set to expire with the
///   lock so that it does not outlive it, `KEYS[5]` the `released` marker when given (see
///   below), and last its lease table (see [`LINE_PRELUDE`]); `ARGV[1]` the token, `ARGV[2]` the milliseconds the hold has left (at
///   least 1), `ARGV[3]` the claim (see [`ACQUIRE`]).
/// - Returns 1 when the lock was ours and is now kept until the hold ends; when it was not
///   ours, nothing touched, why, as [`RELEASE`] answers it.
///
/// A line of another type than a list cannot be told: the lock is still left to expire when
/// the hold ends, and the reply is an error naming the line.
///
/// With nobody live in line the lock key is set to expire at the hold's end, and nothing else is
/// written: whoever comes then finds it free. With a live waiter, an expiry alone would leave the
/// lock free at the hold's end until that waiter's look lands, and a newcomer's first try (a
/// plain `SET NX`, which does not read the line) could take it first. So the key is kept a claim
/// longer, its value set to `"<token>;hold=<hold's end, Redis time in ms>"`, which tells
/// [`ACQUIRE`] (whose `GET` of the key reads it anyway) that the lock is the line's from the
/// hold's end: the first waiter's look then, or anyone's join, hands it over. A token never
/// contains `;hold=` (see `identity.rs`), and the suffix is matched at the value's end, so it is
/// unambiguous. Should every waiter die meanwhile, nobody looks, and the key expires a claim
/// after the hold's end.
///
/// The message `"<token> ?"` grants nothing: it only wakes that waiter. A waiter further back
/// learns of the hold at its next renewal.
///
/// Run twice (a re-sent command) it must not start the hold again, nor answer "not ours" once
/// the lock has gone to a waiter or expired: so a caller that may send it again (a cluster
/// connection after a lost reply, `Node::hold` after a dropped connection, as for a release)
/// also passes `KEYS[4]`, the lock's `released` marker, and `ARGV[4]`, how long after the first
/// run it may be re-sent, as for [`RELEASE`]; the first run leaves its
/// token there, and a run that finds the lock not ours but its own token in the marker
/// answers 1, whatever the `forced` mark holds: the first run kept the key for the hold, with
/// the holder's token in it, and an operator who broke that key broke a lock already released. A run that finds the value its own token with a `;hold=` suffix is a re-send too:
/// it answers 1 and changes nothing.
pub(crate) static HOLD: Lazy<Script> = Lazy::new(|| {
    Script::new(
        &[
            LINE_PRELUDE,
            NOT_OURS,
            r"
local value = redis.pcall('GET', KEYS[1])
if value ~= ARGV[1] then
  if type(value) == 'string' and string.sub(value, 1, #ARGV[1]) == ARGV[1]
      and string.find(value, '^;hold=%d+$', #ARGV[1] + 1) then
    return 1
  end
  local why = not_ours(value, KEYS[3], ARGV[1])
  if ARGV[4] and redis.call('GET', KEYS[5]) == ARGV[1] then
    return 1
  end
  return why
end
if ARGV[4] then
  redis.call('SET', KEYS[5], ARGV[1], 'PX', ARGV[4])
end
local read, waiter, channel, now = pcall(first_live, ARGV[1])
if not read then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[4], ARGV[2])
  return redis.error_reply('WRONGTYPE distlock: the lock ' .. KEYS[1] .. ' was released to ' ..
    'expire when its hold ends, but its line ' .. KEYS[2] .. ' holds a value of another ' ..
    'type, so nobody in it could be told: something other than distlock wrote that key; ' ..
    'delete it')
end
if waiter then
  local keep = tonumber(ARGV[2])
  local claim = tonumber(ARGV[3])
  redis.call('SET', KEYS[1], ARGV[1] .. ';hold=' .. (now + keep), 'PX', keep + claim)
  redis.call('PEXPIRE', KEYS[4], keep + claim)
  if channel ~= '' then
    redis.call('PUBLISH', channel, waiter .. ' ?')
  end
  return 1
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[4], ARGV[2])
return 1
",
        ]
        .concat(),
    )
});

/// Break a lock for an operator (`LockManager::force_release`, `distlock release --force`):
/// release it as its holder would, if its key still holds the value the operator saw.
///
/// - `KEYS` as in [`LINE_PRELUDE`]: `KEYS[4]` the `since` record, `KEYS[5]` the lock's
///   `forced` mark, `KEYS[6]` its lease table (last, as the prelude expects); `ARGV[1]` the value
///   seen, `ARGV[2]` the claim (see [`ACQUIRE`]), `ARGV[3]` `"1"` where receivers of a publish
///   are counted (see `hand_off`), `ARGV[4]` how long the mark is kept, in ms.
/// - Returns 1 when the lock was broken (or was by this same call: see below), 0 when its key
///   holds something else now (nothing touched).
///
/// A lock deleted here takes its `since` record with it, as a release's does.
///
/// The holder is not told, and goes on believing it holds the lock: so the holder's token
/// (the value without a `;hold=` suffix) is left in the `forced` mark, where its next
/// [`EXTEND`], [`RELEASE`] or [`HOLD`] finds it and answers "force-released" rather than a
/// cause the holder could not act on. The `released` marker is left alone: a holder's token
/// there would tell the holder's own marked release that it had released the lock itself.
/// (A key kept for a hold was released by its holder already: that holder's marker, not this
/// mark, answers its re-sent release.) The mark also recognises this script run twice (a cluster connection re-sends a command
/// whose reply it lost): a run that finds the lock not the value's but the mark the
/// holder's answers 1.
///
/// A line of another type than a list cannot hand the lock on: the lock is deleted, and the
/// reply is an error naming the line, as in [`RELEASE`].
pub(crate) static FORCE_RELEASE: Lazy<Script> = Lazy::new(|| {
    Script::new(
        &[
            LINE_PRELUDE,
            r"
local held = redis.pcall('GET', KEYS[1])
local holder = string.match(ARGV[1], '^(.*);hold=%d+$') or ARGV[1]
if held ~= ARGV[1] then
  if type(held) == 'table' then
    return redis.error_reply('WRONGTYPE distlock: the lock key ' .. KEYS[1] ..
      ' holds a value of another type, not a lock')
  end
  if redis.pcall('GET', KEYS[5]) == holder then
    return 1
  end
  return 0
end
redis.call('SET', KEYS[5], holder, 'PX', ARGV[4])
local read, first = pcall(hand_off, tonumber(ARGV[2]), holder, nil, nil, ARGV[3] == '1', nil)
if not read then
  redis.call('DEL', KEYS[1], KEYS[4])
  return redis.error_reply('WRONGTYPE distlock: the lock ' .. KEYS[1] .. ' was released, ' ..
    'but its line ' .. KEYS[2] .. ' holds a value of another type, so nobody in it could be ' ..
    'handed the lock: something other than distlock wrote that key; delete it')
end
if not first then
  redis.call('DEL', KEYS[1], KEYS[4])
end
return 1
",
        ]
        .concat(),
    )
});

/// Read what inspection shows of one lock, in one atomic look (it writes nothing).
///
/// - `KEYS` as in [`LINE_PRELUDE`]: the lock, its line, its fencing counter, its `since`
///   record, its lease table.
/// - Returns `nil` when the lock is free; else `{value, pttl, waiters, fence, since}`: the lock key's
///   value (for a lock kept for the line, with its `;hold=` suffix: `identity::parse` skips the
///   unknown field, and a forced release compares the value as read), its `PTTL` (-1: no
///   expiry) — or, for a lock kept until its hold ends for the line, what is left of the hold
///   (0 once it is over and the line's next look is due) —, how many waiters in line still
///   hold a live place (by their entry's deadline, or else their score in the lease table), and the fencing counter's raw value (`false` when there is none).
///
/// A lock key of another type than a string is an error, as in [`ACQUIRE`]; so is a line that
/// is not a list.
pub(crate) static INSPECT: Lazy<Script> = Lazy::new(|| {
    Script::new(
        r"
local value = redis.pcall('GET', KEYS[1])
if type(value) == 'table' and value.err then
  return redis.error_reply('WRONGTYPE the lock key holds a value of another type, not a lock')
end
if not value then
  return false
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local waiters = 0
for _, entry in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
  local token, deadline = string.match(entry, '^(%S+) (%d+) ')
  if deadline and (tonumber(deadline) >= now
      or (tonumber(redis.pcall('ZSCORE', KEYS[5], token)) or 0) >= now) then
    waiters = waiters + 1
  end
end
local pttl
local ends = string.match(value, ';hold=(%d+)$')
if ends then
  pttl = math.max(tonumber(ends) - now, 0)
else
  pttl = redis.call('PTTL', KEYS[1])
end
return {value, pttl, waiters, redis.call('GET', KEYS[3]), redis.call('GET', KEYS[4])}
",
    )
});

/// Redlock's [`HOLD`] on one master: set the lock to expire `ARGV[2]` ms from now if it is
/// still ours, and tell the first live waiter in the wake list to look again, so that it
/// sleeps until that expiry rather than until the ttl it last saw. The waiter keeps its place:
/// nothing is handed over, and it takes the lock by its own attempt when the hold ends.
///
/// - `KEYS[1]` the lock key, `KEYS[2]` its wake list (see [`QUORUM_ACQUIRE`]), `KEYS[3]` its
///   `since` record, set to expire with the lock; `ARGV[1]` the token, `ARGV[2]` the
///   milliseconds the lock is to live from now (at least 1).
/// - Returns 1 when the lock was ours and now expires then, 0 when it was not ours (nothing
///   touched).
pub(crate) static QUORUM_HOLD: Lazy<Script> = Lazy::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[2])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local first = redis.call('ZRANGEBYSCORE', KEYS[2], now, '+inf', 'LIMIT', 0, 1)[1]
if first then
  local channel, waiter = string.match(first, '^(%S+) (.+)$')
  if channel then
    redis.call('PUBLISH', channel, waiter .. ' ?')
  end
end
return 1
",
    )
});
