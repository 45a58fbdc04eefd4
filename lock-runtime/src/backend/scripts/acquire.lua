-- Take the lock, or wait in line for it: the contended path of an acquisition (its first try is
-- a plain `SET NX PX`) and every later look of a waiter. Runs after line_prelude.lua.
--
-- KEYS[1]   the lock key
-- KEYS[2]   its line (entries: see line_prelude.lua)
-- KEYS[3]   its fencing counter
-- KEYS[4]   its `since` record
-- KEYS[5]   its `forced` mark
-- KEYS[6]   its lease table (the last key: see line_prelude.lua)
-- ARGV[1]   token
-- ARGV[2]   ttl, ms
-- ARGV[3]   "1" issue a fencing token, "0" not
-- ARGV[4]   the waiter's grant channel ("" not subscribed: it finds a grant by looking again)
-- ARGV[5]   lease of a place in line, ms
-- ARGV[6]   claim: the longest ttl a hand-off gives before the new holder confirms, ms
-- ARGV[7]   when the lock is held: "first" take no place, "join" append a place, "renew" renew
--           the caller's place (append one when it lapsed)
-- ARGV[8]   "1" when PUBLISH counts receivers, "0" not
-- ARGV[9]   "renew" only: the caller's entry as last written ("" unknown: found by token)
-- ARGV[10]  "renew" only: the lease deadline its last renewal got, Redis ms ("" none)
--
-- Reply:
--   {1, fence, pttl}              the caller holds the lock (fence 0 without fencing)
--   {0, pttl, deadline, written}  the caller waits first in line; pttl the holder's ttl left
--                                 (the hold's, for a key kept past a hold; -1 no expiry)
--   {0, -3, deadline, written}    the caller waits behind another waiter
--     deadline  when its place lapses, Redis ms (0 for "first": no place)
--     written   0 entry left as it was (lease in the table), 1 entry (re)written
--               "<ARGV[1]> <deadline> <ARGV[2]> <ARGV[3]> <ARGV[4]>" and lease recorded,
--               2 entry written, no lease recorded
--   error     the lock key or line holds another type; the fencing counter cannot issue a token
-- GET, not TYPE (outside the minimal ACL), tells a key of another type.
local held = redis.pcall('GET', KEYS[1])
if type(held) == 'table' and held.err then
  return redis.error_reply('WRONGTYPE the lock key holds a value of another type, not a lock')
end
-- Our own token is a grant: a hand-off whose message we missed, or a re-sent command.
-- Nobody acquired since, so the counter's value is our fence.
if held == ARGV[1] then
  local fence = 0
  if ARGV[3] == '1' then
    fence = tonumber(redis.call('GET', KEYS[3])) or 0
  end
  return {1, fence, redis.call('PTTL', KEYS[1])}
end
-- "<token>;hold=<end>" is a lock kept for the line past a hold (see hold.lua): held until
-- the end, then free for the line but for the releaser, while a plain SET NX still fails.
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
-- First come, first served: a free lock goes to the first live waiter in line.
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
    -- The since record before the lock: a server that reads its clock per command may cross
    -- a millisecond between the two, and then the record must be the one that ends first.
    if ARGV[7] ~= 'first' then
      granted(ARGV[1], ARGV[2])
    elseif redis.pcall('GET', KEYS[5]) == ARGV[1] then
      -- A first try sent again after an operator broke the lock its first run took: the
      -- token holds the lock anew, and the mark no longer speaks for it (it would call a
      -- later expiry a break, and make a release that deleted the lock look broken).
      redis.call('DEL', KEYS[5])
    end
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
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
-- A renewal costs the same however long the line: when the table still holds the lease the
-- last renewal gave, the place is where it was (a place leaves only by a hand-off, a leave,
-- a skip that zeroes its score, or with the whole line). Else look for the entry (LPOS).
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
-- Nothing outlives the last waiter, and a line that never empties never expires.
redis.call('PEXPIRE', KEYS[2], 2 * lease)
-- Only the first waiter needs the holder's ttl (it looks when the holder dies): no PTTL
-- for a place further back.
if index > 0 then
  return {0, -3, deadline, written}
end
return {0, remaining(), deadline, written}
