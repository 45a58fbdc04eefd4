-- Redlock's release on one master: delete the lock if it is still ours, and wake one waiter.
--
-- KEYS[1]  the lock key
-- KEYS[2]  its wake list (see quorum_acquire.lua)
-- KEYS[3]  its `since` record (deleted with the lock)
-- ARGV[1]  token
-- ARGV[2]  the caller's own member, taken out of the wake list either way ("" none)
-- ARGV[3]  "1" wake a waiter (a release); "0" not (giving back an attempt that lost: its
--          contender retries, and a woken waiter would only find the winner's lock)
--
-- Reply: 1 ours, now deleted; 0 not ours, nothing of the lock touched.
local waiting = redis.call('EXISTS', KEYS[2]) == 1
if waiting and ARGV[2] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[2])
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[3])
if waiting and ARGV[3] == '1' then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  -- Earliest lease first; places whose lease ran out (dead waiters) are dropped on the way, so
  -- a release wakes at most one waiter per master.
  while true do
    local first = redis.call('ZPOPMIN', KEYS[2])
    if not first[1] then
      break
    end
    if tonumber(first[2]) >= now then
      local channel, waiter = string.match(first[1], '^(%S+) (.+)$')
      if channel then
        redis.call('PUBLISH', channel, waiter .. ' ?')
        break
      end
    end
  end
end
return 1
