-- Set the lock's remaining ttl if it is still ours. Runs after not_ours.lua.
--
-- KEYS[1]  the lock key
-- KEYS[2]  its `forced` mark
-- KEYS[3]  its `since` record (extended with the lock)
-- ARGV[1]  token
-- ARGV[2]  new ttl, ms
--
-- Reply: 1 extended; not ours, nothing touched: -2 force-released, -1 another holder's,
-- 0 nobody's; error: the lock key holds another type.
local held = redis.pcall('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return not_ours(held, KEYS[2], ARGV[1])
