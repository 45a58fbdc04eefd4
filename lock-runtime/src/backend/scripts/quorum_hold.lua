-- Redlock's [`HOLD`] on one master: set the lock to expire `ARGV[2]` ms from now if it is
-- still ours, and tell the first live waiter in the wake list to look again, so that it
-- sleeps until that expiry rather than until the ttl it last saw. The waiter keeps its place:
-- nothing is handed over, and it takes the lock by its own attempt when the hold ends.
--
-- - `KEYS[1]` the lock key, `KEYS[2]` its wake list (see [`QUORUM_ACQUIRE`]), `KEYS[3]` its
--   `since` record, set to expire with the lock; `ARGV[1]` the token, `ARGV[2]` the
--   milliseconds the lock is to live from now (at least 1).
-- - Returns 1 when the lock was ours and now expires then, 0 when it was not ours (nothing
--   touched).
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
