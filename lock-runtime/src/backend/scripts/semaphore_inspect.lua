-- Read what inspection shows of a leased set — a semaphore's permits or a read-write lock's
-- readers — in one atomic look that writes nothing. The runtime runs it where the mutex's
-- `inspect.lua` answers `WRONGTYPE` (the lock key is not a string). Runs after
-- `family_prelude.lua`.
--
-- - `KEYS[1]` the lock key, `KEYS[2]` the semaphore's line (helper `permit-line`), `KEYS[3]`
--   the mutex's line (helper `line`, where readers wait), `KEYS[4]` the fencing counter.
-- - Returns `false` when the key is free; `{kind, n, holders, waiters, fence}` otherwise:
--   `kind` `"permits"` or `"read"` (`"string"` for a mutex or writer, with nothing else: read
--   it with `inspect.lua`), `n` the stored number of permits (0 for readers), `holders` a flat
--   list `value, ms left, value, ms left, ...` of the leases still running (earliest expiry
--   first), `waiters` the live places in the line that kind uses, `fence` the counter's raw
--   value (`false`: none). Errors: `MODE other ...` for a key distlock did not write.
--
-- Leases that ran out are skipped, not pruned: inspection never writes.
local found, n = shape(KEYS[1])
if found == 'none' then
  return false
end
if found == 'string' then
  return {'string'}
end
if found == 'other' then
  return mode_error(KEYS[1], 'other', 'permits')
end
local now = now_ms()
local holders = {}
local leases = redis.call('ZRANGEBYSCORE', KEYS[1], now, '(+inf', 'WITHSCORES')
for i = 1, #leases, 2 do
  holders[#holders + 1] = leases[i]
  holders[#holders + 1] = math.floor(tonumber(leases[i + 1])) - now
end
local line = KEYS[2]
if found == 'read' then
  line, n = KEYS[3], 0
end
local waiters = 0
for _, entry in ipairs(redis.call('LRANGE', line, 0, -1)) do
  local token, deadline = parse(entry)
  if token and tonumber(deadline) >= now then
    waiters = waiters + 1
  end
end
return {found, n, holders, waiters, redis.call('GET', KEYS[4])}
