-- One look of a deadlock walk at a lock (see `backend/waits.rs`): who holds it, and the live
-- waits of those holders, in one round trip on the lock's node. Runs after
-- `family_prelude.lua`. Writes nothing.
--
-- KEYS[1]  the lock key
-- KEYS[2]  its `waits` helper key (a hash, as `wait_record.lua` writes it)
-- ARGV[1]  the most holders returned
--
-- Reply: `{holders, records}`. `holders`: the mutex's (or writer's) value, or the readers whose
-- lease is live, at most ARGV[1]; none for a free lock, a semaphore (a permit waiter is let in
-- by any holder's release, so no single holder is waited for), or a key distlock did not
-- write. `records`: `<token> <wait id> <wait start> <lock waited for>` for each record of
-- `waits` that is live and names one of `holders` (a record left by an earlier holder names
-- another token, and is dropped).

local now = now_ms()
local found, value = shape(KEYS[1])
local holders = {}
if found == 'string' then
  holders[1] = value
elseif found == 'read' then
  -- The marker is scored +inf; leases are scored by when they run out.
  holders = redis.call('ZRANGEBYSCORE', KEYS[1], now, '(+inf', 'LIMIT', 0, tonumber(ARGV[1]))
end
local records = {}
if #holders == 0 then
  return {holders, records}
end
local named = {}
for _, holder in ipairs(holders) do
  named[holder] = true
end
local fields = redis.pcall('HGETALL', KEYS[2])
if fields.err then
  fields = {}
end
for i = 2, #fields, 2 do
  local until_ms, token, rest = string.match(fields[i], '^(%d+) (%S+) (.*)$')
  if until_ms and tonumber(until_ms) >= now and named[token] then
    records[#records + 1] = token .. ' ' .. rest
  end
end
return {holders, records}
