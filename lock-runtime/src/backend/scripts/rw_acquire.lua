-- Take a read or write lock, or wait in the lock's fair line: every attempt and every look of
-- a waiter (an uncontended read lock is this one call; an uncontended write lock stays the
-- mutex's plain `SET NX PX`, and this script is its contended path once readers use the name).
-- Runs after `family_prelude.lua` and `rw_line.lua`.
--
-- - `KEYS[1]` the lock key (a string while a writer holds it, a leased set marked `#read`
--   while readers do), `KEYS[2]` its line (the mutex's helper `line`), `KEYS[3]` the fencing
--   counter (helper `fence`), `KEYS[4]` the readers' fencing tokens (helper `permit-fences`).
-- - `ARGV[1]` the caller's value (token; a reader's carries `;m=r`, which is what makes it a
--   reader), `ARGV[2]` its ttl in ms, `ARGV[3]` `"1"` to issue a fencing token, `ARGV[4]` its
--   grant channel (empty: not subscribed), `ARGV[5]` the lease of a place in line in ms,
--   `ARGV[6]` the claim in ms, `ARGV[7]` `"first"`, `"join"` or `"renew"` (as in
--   `semaphore_acquire.lua`), `ARGV[8]` `"1"` where receivers of a publish are counted.
-- - Returns `{1, fence, pttl}` when the caller holds the lock in its mode (a call run twice
--   answers the same: a writer's fence is then the counter's value, as for the mutex);
--   `{0, pttl, deadline, index}` when it waits: `pttl` what is left of the writer's ttl or of
--   the last reader's lease (-3 when the caller waits behind another waiter), `deadline` when
--   its place lapses (0 for `"first"`), `index` its place (-1 for `"first"`).
-- - Errors: `MODE <found> <read|string> ...` when the name is a semaphore or not distlock's.
--
-- Fair: a caller is let in directly only when nobody live waits in line; otherwise the line is
-- served first (`rw_admit`), so a reader that comes after a waiting writer waits behind it.
-- A caller holding a read lock that asks for the write lock waits for itself: the runtime
-- refuses that upgrade before it gets here.
--
-- A reader that finds the lock key a string holding its own value was handed the whole lock by
-- a mutex's release (`hand_off` in `line_prelude.lua` knows no readers): this call moves its
-- lease into a leased set and lets in the readers behind it up to the next writer. The runtime
-- makes it once after a reader is handed the lock.
local LOCK, LINE, FENCE, FENCES = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local me, ttl, claim = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[6])
local reader = is_reader(me)
local found, value = shape(LOCK)
local now = now_ms()
local writer, readers = false, 0
if found == 'string' then
  if value == me then
    local fence = 0
    if ARGV[3] == '1' then
      fence = tonumber(redis.call('GET', FENCE)) or 0
    end
    local pttl = redis.call('PTTL', LOCK)
    if not reader or pttl <= 0 then
      return {1, fence, pttl}
    end
    -- A reader handed the whole lock by a mutex's release (which does not know readers): its
    -- lease moves into a leased set, and the readers behind it up to the next writer come in.
    redis.call('DEL', LOCK)
    redis.call('ZADD', LOCK, '+inf', '#read')
    redis.call('ZADD', LOCK, now + pttl, me)
    if fence > 0 then
      redis.call('HSET', FENCES, me, fence)
    end
    rw_admit(LOCK, LINE, FENCE, FENCES, now, nil, claim, ARGV[8] == '1', false, 1)
    settle(LOCK, FENCES)
    return {1, fence, pttl}
  end
  writer = true
elseif found == 'read' then
  prune(LOCK, FENCES, now)
  local mine = redis.call('ZSCORE', LOCK, me)
  if mine then
    return {1, tonumber(redis.call('HGET', FENCES, me)) or 0, math.floor(tonumber(mine)) - now}
  end
  readers = redis.call('ZCARD', LOCK) - 1
  if readers == 0 then
    redis.call('DEL', LOCK, FENCES)
  end
elseif found ~= 'none' then
  local wanted = 'string'
  if reader then
    wanted = 'read'
  end
  return mode_error(LOCK, found, wanted)
end

local mine, _
mine, _, writer, readers = rw_admit(LOCK, LINE, FENCE, FENCES, now, me, claim,
  ARGV[8] == '1', writer, readers)
if mine then
  if readers > 0 then
    settle(LOCK, FENCES)
  end
  return mine
end
if redis.call('LLEN', LINE) == 0 and not writer and (reader or readers == 0) then
  local fence = 0
  if ARGV[3] == '1' then
    local failed
    fence, failed = next_fence(FENCE)
    if failed then
      return failed
    end
  end
  if reader then
    redis.call('ZADD', LOCK, '+inf', '#read')
    redis.call('ZADD', LOCK, now + ttl, me)
    if fence > 0 then
      redis.call('HSET', FENCES, me, fence)
    end
    settle(LOCK, FENCES)
  else
    redis.call('SET', LOCK, me, 'PX', ttl)
  end
  return {1, fence, ttl}
end

local pttl = -1
if writer then
  pttl = redis.call('PTTL', LOCK)
elseif readers > 0 then
  settle(LOCK, FENCES)
  pttl = math.max(redis.call('PTTL', LOCK), 0)
end
if ARGV[7] == 'first' then
  return {0, pttl, 0, -1}
end
local index, deadline = take_place(LINE, me, ttl .. ' ' .. ARGV[3] .. ' ' .. ARGV[4],
  tonumber(ARGV[5]), now)
if index > 0 then
  pttl = -3
end
return {0, pttl, deadline, index}
