-- Read what inspection shows of one lock, in one atomic look; writes nothing.
--
-- KEYS[1]  the lock key
-- KEYS[2]  its line
-- KEYS[3]  its fencing counter
-- KEYS[4]  its `since` record
-- KEYS[5]  its lease table
-- ARGV     none
--
-- Reply: nil when the lock is free; else {value, pttl, waiters, fence, since}:
--   value    the lock key's value, ";hold=<ms>" suffix included
--   pttl     its ttl left, ms (-1 no expiry); for a key kept past a hold, the hold's (0: over)
--   waiters  how many places in line are live
--   fence    the counter's raw value (nil: none)
--   since    the `since` record's raw value (nil: none)
-- error: the lock key holds another type, or the line does.
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
