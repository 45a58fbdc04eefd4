-- Record that a task of this fleet, holding a lock of one key template, waited for a lock of
-- another (the order first → second), and read whether the opposite order was recorded.
-- Runs once per order per process: never on the path of an order the process has seen.
--
-- KEYS[1]  the orders hash of the key prefix (`{<prefix>}:distlock:orders`): field
--          "<first>\n<second>", value "<first seen, Redis time in ms>\n<who>"
-- ARGV[1]  this order's field, "<first>\n<second>"
-- ARGV[2]  the opposite order's field, "<second>\n<first>"
-- ARGV[3]  who: "<host> <pid>\n<function that held first>\n<function that waited for second>"
-- ARGV[4]  the most orders the hash keeps
-- ARGV[5]  the hash's expiry, ms, set again by every record
--
-- Reply: {recorded, opposite}: recorded 1 when this order is in the hash (now, or already:
-- the first record is kept), 0 when the hash is full and it is not; opposite the opposite
-- order's value, or nil.
local recorded = 1
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  if redis.call('HLEN', KEYS[1]) < tonumber(ARGV[4]) then
    local time = redis.call('TIME')
    local millis = string.format('%03d', math.floor(tonumber(time[2]) / 1000))
    redis.call('HSET', KEYS[1], ARGV[1], time[1] .. millis .. '\n' .. ARGV[3])
  else
    recorded = 0
  end
end
if recorded == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
end
return {recorded, redis.call('HGET', KEYS[1], ARGV[2])}
