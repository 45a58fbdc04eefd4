-- Release a lock taken with `hold_at_least` before the hold is up: keep it until the hold ends
-- if it is still ours, and wake the first live waiter to look again then. Runs after
-- line_prelude.lua and not_ours.lua.
--
-- KEYS[1]  the lock key
-- KEYS[2]  its line
-- KEYS[3]  its `forced` mark (no fencing token is issued here)
-- KEYS[4]  its `since` record (expires with the lock)
-- KEYS[5]  its `released` marker, only when ARGV[4] is given
-- last     its lease table
-- ARGV[1]  token
-- ARGV[2]  what the hold has left, ms (at least 1)
-- ARGV[3]  claim, ms (see acquire.lua)
-- ARGV[4]  optional: how long the `released` marker is kept, ms (for a caller that may re-send)
--
-- Reply: 1 kept until the hold ends (or this same call, re-sent); not ours, nothing touched:
-- -2 force-released, -1 another holder's, 0 nobody's; error: the lock key holds another type,
-- or the line does (the lock still expires when the hold ends).
local value = redis.pcall('GET', KEYS[1])
if value ~= ARGV[1] then
  -- Our token with a ";hold=" suffix, or our token in the `released` marker: this same
  -- call, re-sent (a token never contains ";hold=").
  if type(value) == 'string' and string.sub(value, 1, #ARGV[1]) == ARGV[1]
      and string.find(value, '^;hold=%d+$', #ARGV[1] + 1) then
    return 1
  end
  local why = not_ours(value, KEYS[3], ARGV[1])
  if ARGV[4] and redis.call('GET', KEYS[5]) == ARGV[1] then
    return 1
  end
  return why
end
if ARGV[4] then
  redis.call('SET', KEYS[5], ARGV[1], 'PX', ARGV[4])
end
local read, waiter, channel, now = pcall(first_live, ARGV[1])
if not read then
  redis.call('PEXPIRE', KEYS[4], ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return redis.error_reply('WRONGTYPE distlock: the lock ' .. KEYS[1] .. ' was released to ' ..
    'expire when its hold ends, but its line ' .. KEYS[2] .. ' holds a value of another ' ..
    'type, so nobody in it could be told: something other than distlock wrote that key; ' ..
    'delete it')
end
-- With a live waiter, an expiry alone would leave the lock free at the hold's end until its
-- look lands, for a newcomer's SET NX to take: keep the key a claim longer, marked
-- ";hold=<end>", so that acquire.lua gives it to the line then. "<token> ?" grants nothing:
-- it only wakes the waiter.
if waiter then
  local keep = tonumber(ARGV[2])
  local claim = tonumber(ARGV[3])
  redis.call('PEXPIRE', KEYS[4], keep + claim)
  redis.call('SET', KEYS[1], ARGV[1] .. ';hold=' .. (now + keep), 'PX', keep + claim)
  if channel ~= '' then
    redis.call('PUBLISH', channel, waiter .. ' ?')
  end
  return 1
end
-- The since record before the lock, here and above: a server that reads its clock per command
-- may cross a millisecond between the two, and then the record must be the one that ends first.
redis.call('PEXPIRE', KEYS[4], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
