-- Redlock's acquisition on one master: `SET NX PX`, and when someone else holds the lock, a
-- place in the lock's wake list on this master, so that a release here wakes one waiter.
--
-- - `KEYS[1]` the lock key, `KEYS[2]` its wake list: a sorted set of waiters, each member
--   `"<channel> <token>"` (the pub/sub channel its process listens on, its token) scored by
--   the deadline of its lease in ms (Redis time); `KEYS[3]` its `since` record (see `granted`
--   in [`LINE_PRELUDE`]).
-- - `ARGV[1]` the token, `ARGV[2]` the ttl in ms, `ARGV[3]` the caller's member (empty: it is
--   not subscribed, and takes no place), `ARGV[4]` the lease of a place in ms, `ARGV[5]` `"1"`
--   when the caller has waited (its value, made before its first try, is older than this
--   grant, which is then recorded in `KEYS[3]`).
-- - Returns `{1}` when acquired (or found already ours: a re-sent command), `{0, pttl,
--   holder}` when someone else holds it (`pttl` -1: no expiry; `holder` the value of the lock
--   key, so that the caller can tell one holder on several masters from a split).
--
-- Taking a place is a `ZADD`: a renewal or a re-sent command moves the same member's lease,
-- never adds a second place. The lease's deadline is rounded up to the next 100 ms, so that
-- waiters registering at about the same time on every master (an attempt reaches them all at
-- once) tie on each, and ties are ordered by member, the same on every master: a release on
-- all masters then wakes the same waiter on each, not one per master. A waiter that gets the lock here takes its place out. The list
-- expires two leases after its last join or renewal, so nothing outlives the last waiter. The
-- lock key itself is never written by a waiter.
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
