-- Break a lock for an operator (`LockManager::force_release`, `distlock release --force`):
-- release it as its holder would, if its key still holds the value the operator saw.
-- Runs after line_prelude.lua.
--
-- KEYS[1]  the lock key
-- KEYS[2]  its line
-- KEYS[3]  its fencing counter
-- KEYS[4]  its `since` record
-- KEYS[5]  its `forced` mark
-- KEYS[6]  its lease table
-- ARGV[1]  the value the operator saw (may end in ";hold=<ms>")
-- ARGV[2]  claim, ms (see acquire.lua)
-- ARGV[3]  "1" when PUBLISH counts receivers, "0" not
-- ARGV[4]  how long the `forced` mark is kept, ms
--
-- Reply: 1 broken (or broken by this same call, re-sent); 0 the key holds something else now,
-- nothing touched; error: the lock key holds another type, or the line does (lock deleted).
local held = redis.pcall('GET', KEYS[1])
local holder = string.match(ARGV[1], '^(.*);hold=%d+$') or ARGV[1]
if held ~= ARGV[1] then
  if type(held) == 'table' then
    return redis.error_reply('WRONGTYPE distlock: the lock key ' .. KEYS[1] ..
      ' holds a value of another type, not a lock')
  end
  -- The mark holds the holder: this same call, re-sent after a lost reply.
  if redis.pcall('GET', KEYS[5]) == holder then
    return 1
  end
  return 0
end
-- The holder is not told: its next extend, hold or release finds its token in the mark and
-- answers "force-released". The `released` marker is left alone: the holder's token there
-- would make its own marked release look successful.
redis.call('SET', KEYS[5], holder, 'PX', ARGV[4])
local read, first = pcall(hand_off, tonumber(ARGV[2]), holder, nil, nil, ARGV[3] == '1', nil)
if not read then
  redis.call('DEL', KEYS[1], KEYS[4])
  return redis.error_reply('WRONGTYPE distlock: the lock ' .. KEYS[1] .. ' was released, ' ..
    'but its line ' .. KEYS[2] .. ' holds a value of another type, so nobody in it could be ' ..
    'handed the lock: something other than distlock wrote that key; delete it')
end
if not first then
  redis.call('DEL', KEYS[1], KEYS[4])
end
return 1
