-- Redlock's hold.lua on one master: set the lock to expire ARGV[2] ms from now if it is still
-- ours, and wake the first live waiter in the wake list to look again (nothing handed over).
--
-- KEYS[1]  the lock key
-- KEYS[2]  its wake list (see quorum_acquire.lua)
-- KEYS[3]  its `since` record (expires with the lock)
-- ARGV[1]  token
-- ARGV[2]  how long the lock is to live from now, ms (at least 1)
--
-- Reply: 1 ours, now expires then; 0 not ours, nothing touched.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
-- The since record first: across a millisecond between the two, it ends before the lock.
redis.call('PEXPIRE', KEYS[3], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
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
