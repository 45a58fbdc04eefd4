-- Read what inspection shows of one lock, in one atomic look (it writes nothing).
--
-- - `KEYS` as in [`LINE_PRELUDE`]: the lock, its line, its fencing counter, its `since`
--   record, its lease table.
-- - Returns `nil` when the lock is free; else `{value, pttl, waiters, fence, since}`: the lock key's
--   value (for a lock kept for the line, with its `;hold=` suffix: `identity::parse` skips the
--   unknown field, and a forced release compares the value as read), its `PTTL` (-1: no
--   expiry) — or, for a lock kept until its hold ends for the line, what is left of the hold
--   (0 once it is over and the line's next look is due) —, how many waiters in line still
--   hold a live place (by their entry's deadline, or else their score in the lease table), and the fencing counter's raw value (`false` when there is none).
--
-- A lock key of another type than a string is an error, as in [`ACQUIRE`]; so is a line that
-- is not a list.
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
