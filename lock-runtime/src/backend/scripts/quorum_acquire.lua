-- Redlock's acquisition on one master: `SET NX PX`; when someone else holds the lock, a place
-- in the lock's wake list on this master, so that a release here wakes one waiter.
--
-- KEYS[1]  the lock key
-- KEYS[2]  its wake list: sorted set of "<channel> <token>" scored by lease deadline, Redis ms
-- KEYS[3]  its `since` record
-- ARGV[1]  token
-- ARGV[2]  ttl, ms
-- ARGV[3]  the caller's member "<channel> <token>" ("" not subscribed: takes no place)
-- ARGV[4]  lease of a place, ms
-- ARGV[5]  "1" the caller has waited: record the grant in KEYS[3], "0" not
--
-- Reply: {1} acquired (or already ours: a re-sent command); {0, pttl, holder} someone else
-- holds it (pttl -1: no expiry; holder the lock key's value); error: the lock key holds
-- another type.
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
  -- Rounded up to 100 ms so that an attempt's places tie on every master, and ties order by
  -- member: a release on every master wakes the same waiter on each. ZADD never adds a second
  -- place for a re-sent command.
  redis.call('ZADD', KEYS[2], math.floor((now + lease) / 100) * 100 + 100, ARGV[3])
  redis.call('PEXPIRE', KEYS[2], 2 * lease)
end
return {0, pttl, held}
