-- Take the lock, or wait in line for it: the contended path of an acquisition (its first try
-- is a plain `SET NX PX`, see `backend/node.rs`), and every later look of a waiter.
--
-- - `KEYS` as in [`LINE_PRELUDE`]: the lock, its line, its fencing counter, its lease table.
-- - `ARGV[1]` the token, `ARGV[2]` the ttl in ms, `ARGV[3]` `"1"` to issue a fencing token,
--   `ARGV[4]` the waiter's grant channel (empty: it is not subscribed, and finds its grant by
--   looking again), `ARGV[5]` the lease of a place in line in ms, `ARGV[6]` the claim: the
--   longest ttl a hand-off gives before the new holder confirms it, `ARGV[7]` what to do when
--   the lock is someone else's: `"first"` nothing (a first try, which takes no place in line
--   before it listens for hand-offs), `"join"` take a place at the end, `"renew"` renew the
--   caller's place (or take one at the end, when it lapsed), `ARGV[8]` `"1"` where receivers
--   of a publish are counted (see `hand_off`); for `"renew"`, `ARGV[9]` the caller's entry
--   exactly as it was written (empty: not known, the entry is looked for by token) and
--   `ARGV[10]` the lease deadline its last renewal was given (empty: none since its entry was
--   written, or its place may have been handed on or dropped meanwhile: look for it).
-- - Returns `{1, fence, pttl}` when the caller holds the lock (`fence` 0 without fencing,
--   `pttl` what is left of its ttl), `{0, pttl, deadline, written}` when it waits first in line
--   behind a holder with `pttl` left (-1: no expiry), `pttl` -3 when it waits behind another
--   waiter; `deadline` is when its place lapses (Redis time in ms), 0 for a first try, which
--   takes no place. `written` says what became of the caller's entry: 0 left as it was (the
--   renewal went to the lease table), 1 (re)written as `"<ARGV[1]> <deadline> <ARGV[2]>
--   <ARGV[3]> <ARGV[4]>"` and its lease recorded in the table too, 2 written so but no lease
--   recorded (a join, or a first try's nothing). A caller may give that deadline to a place it
--   takes in the same line within a renewal, without this script: see `Backend::try_lock`.
--
-- Only the first waiter is told the holder's ttl: it is the one to look when the holder dies
-- without releasing, and its look hands the lock on. A waiter further back relies on the
-- hand-off message and its renewal (which tells it the ttl once it is first), so a join
-- behind others costs no `PTTL`.
--
-- First come, first served: a free lock goes to the first live waiter in line, so a caller
-- that was not in line, or not first, hands it on and waits. Finding its own token is a grant
-- too: a hand-off whose message it has not heard, or a command that the connection sent again
-- after a dropped reply (a cluster connection does) — the fencing token it was issued is the
-- counter's value, as nobody else can have acquired since.
--
-- A waiter renews its place within its lease; one that does not (it died, or its network did)
-- is skipped by the next hand-off, and one whose place lapsed joins again at the end. Every
-- join and renewal sets the line to expire two leases later (a renewal, its lease table too):
-- so nothing outlives the last waiter, and a line that never empties (a busy fleet, whose
-- waiters wait less than a renewal) does not expire under its waiters either.
--
-- A renewal costs the same however long the line: it does not look for the caller's entry
-- when the lease table still holds the very lease the caller's last renewal was given
-- (`ZSCORE`), and that lease has not run out: its place is then where it was, since a place
-- leaves the line only by a hand-off to it (whose message the caller heard, or it would not
-- pass that lease), by its own leaving, by being skipped (dead: its lease ran out; unheard:
-- its score is set to 0) or with the whole line (a `FLUSHALL`, a restart: the table goes
-- too). It writes the new lease into the table (`ZADD`), takes out the scores that have run
-- out (`ZREMRANGEBYSCORE`, each once) and reads the line's first entry (`LINDEX 0`) to know
-- whether it is first. Otherwise — the first renewal after a join, a place that names no
-- channel or another one than now, a place that may have been handed on — it looks for the
-- entry by its exact text (`LPOS`, inside Redis) and rewrites it (`LSET`), or takes a place at
-- the end when it is gone.
--
-- A lock released within its `hold_at_least` while someone waited is still in its lock key,
-- kept a claim past the hold, its value the releaser's token followed by `;hold=<hold's end>`
-- (see [`HOLD`]): the `GET` above reads it, so telling costs no command. While the hold runs,
-- the holder's remaining time reported is the hold's (so the first waiter looks again when it
-- ends), and once it is over the lock is free for the line: it goes to the first live waiter
-- other than the releaser, as a free lock does, while a first try's plain `SET NX` still finds
-- the key and fails. A value without the suffix is a holder as any other, with no `TIME` for
-- it.
--
-- A lock key that holds a list, a hash or any type other than a string was written by something
-- else than a lock: that is an error (`WRONGTYPE`), not a holder to wait for. (`GET` tells,
-- and it is in the minimal ACL already, unlike `TYPE`.) A fencing counter that cannot issue a
-- token (see `next_fence`) fails the acquisition before anything is taken.
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
