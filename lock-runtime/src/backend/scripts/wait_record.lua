-- The wait record of a lock's holder (see `backend/waits.rs`): written, renewed and ended by
-- that holder only, and only while the lock key still holds its token, so that a record never
-- speaks for a holder the lock no longer has.
--
-- KEYS[1]  the lock key
-- KEYS[2]  its `waits` helper key
-- ARGV[1]  the caller's token
-- ARGV[2]  the wait's id
-- ARGV[3]  the record to write, or "" to end the wait
-- ARGV[4]  how long the record (or the end mark) lives, in ms
--
-- Reply: 1 written (or ended), 0 not written: the lock is not the caller's, or this wait has
-- ended already (a renewal that arrives after the end must not bring the record back).

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local ended = ARGV[1] .. ' ' .. ARGV[2] .. ' ended'
if ARGV[3] == '' then
  redis.call('SET', KEYS[2], ended, 'PX', ARGV[4])
  return 1
end
if redis.call('GET', KEYS[2]) == ended then
  return 0
end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
return 1
