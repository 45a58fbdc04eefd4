-- Take a permit of a semaphore of n permits, or wait in its line: every attempt and every look
-- of a waiter (an uncontended permit is this one call). Runs after `family_prelude.lua`.
--
-- - `KEYS[1]` the lock key (the leased set: holders scored by lease expiry, and the marker
--   `#permits=<n>`), `KEYS[2]` the semaphore's line (helper `permit-line`), `KEYS[3]` the
--   fencing counter (helper `fence`, shared with the mutex), `KEYS[4]` the holders' fencing
--   tokens (helper `permit-fences`, a hash token → fence).
-- - `ARGV[1]` the caller's value (token), `ARGV[2]` its ttl in ms, `ARGV[3]` `"1"` to issue a
--   fencing token, `ARGV[4]` its grant channel (empty: not subscribed), `ARGV[5]` the lease of
--   a place in line in ms, `ARGV[6]` the claim in ms (the longest lease a hand-off gives before
--   the new holder confirms it), `ARGV[7]` n, the caller's number of permits (>= 1),
--   `ARGV[8]` `"first"` (an attempt that takes no place), `"join"` or `"renew"` (take or renew a
--   place), `ARGV[9]` `"1"` where receivers of a publish are counted.
-- - Returns `{1, fence, pttl}` when the caller holds a permit (fence 0 without fencing; a call
--   run twice finds its own lease and answers the same); `{0, pttl, deadline, index}` when it
--   waits: `pttl` when the earliest lease runs out (-1: unknown), `deadline` when its place
--   lapses (0 for `"first"`), `index` its place in line (-1 for `"first"`).
-- - Errors: `MODE <found> permits ...` when the name is held as a mutex or a read-write lock;
--   `PERMITS <stored> <asked> ...` when the caller's n differs from the semaphore's. The
--   semaphore then keeps the smaller of the two, so nobody is let in beyond it, and every
--   caller with the other value is refused the same way until the last lease is gone.
--
-- Permits freed by leases that ran out go first to the live waiters at the head of the line
-- (in the same call, published to them), then to the caller if some are left: first come,
-- first served, and no permit stays free while someone live waits.
local SET, LINE, FENCE, FENCES = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local me, ttl, claim, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[6]), tonumber(ARGV[7])
local counted = ARGV[9] == '1'
if not n or n < 1 or n ~= math.floor(n) then
  return redis.error_reply('ERR distlock: a semaphore has a whole number of permits, at least 1, ' ..
    'not ' .. tostring(ARGV[7]))
end

local found, stored = shape(SET)
if found ~= 'none' and found ~= 'permits' then
  return mode_error(SET, found, 'permits')
end
local now = now_ms()
if found == 'permits' then
  prune(SET, FENCES, now)
  if stored ~= n then
    local keep = math.min(stored, n)
    redis.call('ZREM', SET, '#permits=' .. stored)
    redis.call('ZADD', SET, '+inf', '#permits=' .. keep)
    settle(SET, FENCES)
    return redis.error_reply('PERMITS ' .. stored .. ' ' .. n .. ' distlock: the semaphore ' ..
      SET .. ' has ' .. stored .. ' permits and this caller asks for ' .. n .. '; it now lets ' ..
      'in at most ' .. keep .. ' until its last lease is gone: give every caller the same ' ..
      'number of permits')
  end
  local mine = redis.call('ZSCORE', SET, me)
  if mine then
    return {1, tonumber(redis.call('HGET', FENCES, me)) or 0, math.floor(tonumber(mine)) - now}
  end
else
  redis.call('ZADD', SET, '+inf', '#permits=' .. n)
end

local free = n - (redis.call('ZCARD', SET) - 1)
local mine, given = give_permits(SET, LINE, FENCE, FENCES, free, now, me, claim, counted)
if mine then
  settle(SET, FENCES)
  return mine
end
free = free - given

-- Permits left over mean `give_permits` emptied the line: nobody live waits, the caller may come in.
if free > 0 then
  local fence = 0
  if ARGV[3] == '1' then
    local failed
    fence, failed = next_fence(FENCE)
    if failed then
      settle(SET, FENCES)
      return failed
    end
    redis.call('HSET', FENCES, me, fence)
  end
  redis.call('ZADD', SET, now + ttl, me)
  settle(SET, FENCES)
  return {1, fence, ttl}
end
settle(SET, FENCES)
local first = redis.call('ZRANGE', SET, 0, 0, 'WITHSCORES')
local pttl = -1
if first[2] and first[1] ~= '#permits=' .. n then
  pttl = math.max(math.floor(tonumber(first[2])) - now, 0)
end
if ARGV[8] == 'first' then
  return {0, pttl, 0, -1}
end
local index, deadline = take_place(LINE, me, ttl .. ' ' .. ARGV[3] .. ' ' .. ARGV[4],
  tonumber(ARGV[5]), now)
return {0, pttl, deadline, index}
