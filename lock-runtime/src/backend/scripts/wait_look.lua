-- One look of a deadlock walk at a lock (see `backend/waits.rs`): who holds it, and the live
-- waits of those holders, in one round trip on the lock's node. Runs after
-- `family_prelude.lua`. Writes nothing.
--
-- KEYS[1]  the lock key
-- KEYS[2]  its `waits` helper key (a hash, as `wait_record.lua` writes it)
-- ARGV[1]  the most holders returned
--
-- Reply: `{holders, records}`. `holders`: the mutex's (or writer's) value, or, of the readers
-- whose lease is live, those that wait (named by a live record), at most ARGV[1] of them in
-- byte order; none for a free lock, a semaphore (a permit waiter is let in by any holder's
-- release, so no single holder is waited for), or a key distlock did not write. A reader that
-- waits for nothing ends every path through it, and a walker has recorded its wait before it
-- looks, so leaving idle readers out loses no cycle however many readers hold the lock.
-- `records`: `<token> <wait id> <wait start> <lock waited for>` for each record of `waits`
-- that is live and names one of `holders` (a record left by an earlier holder names another
-- token, and is dropped).

local now = now_ms()
local found, value = shape(KEYS[1])
if found ~= 'string' and found ~= 'read' then
  return {{}, {}}
end
local fields = redis.pcall('HGETALL', KEYS[2])
if fields.err then
  fields = {}
end
local live = {}
for i = 2, #fields, 2 do
  local until_ms, token, rest = string.match(fields[i], '^(%d+) (%S+) (.*)$')
  if until_ms and tonumber(until_ms) >= now then
    live[#live + 1] = {token, rest}
  end
end
local holders = {}
if found == 'string' then
  holders[1] = value
else
  local waiting, seen = {}, {}
  for _, record in ipairs(live) do
    if not seen[record[1]] then
      seen[record[1]] = true
      waiting[#waiting + 1] = record[1]
    end
  end
  table.sort(waiting, bytes_before)
  local most = tonumber(ARGV[1])
  for _, token in ipairs(waiting) do
    if #holders >= most then
      break
    end
    -- A lease is scored by when it runs out (the marker, +inf, is no token).
    local score = redis.call('ZSCORE', KEYS[1], token)
    if score and tonumber(score) >= now then
      holders[#holders + 1] = token
    end
  end
end
local named = {}
for _, holder in ipairs(holders) do
  named[holder] = true
end
local records = {}
for _, record in ipairs(live) do
  if named[record[1]] then
    records[#records + 1] = record[1] .. ' ' .. record[2]
  end
end
return {holders, records}
