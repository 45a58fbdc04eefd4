-- The wait records of a lock's holder (see `backend/waits.rs`): written, renewed and ended by
-- that holder only, and only while the lock still holds its token (the mutex's or writer's
-- value, or a live reader's lease), so that a record never speaks for a holder the lock no
-- longer has. Runs after `family_prelude.lua`.
--
-- The `waits` key is a hash, one field per lock a wait waits for, `<wait id> <i>`, whose value
-- is `<expires, Redis ms> <token> <wait id> <wait start, Unix ms> <lock i>`: the expiry sits in
-- the value, as a hash field has no expiry of its own before Redis 7.4. The end of a wait
-- overwrites its fields with end marks, `<expires> ended`, which a renewal still in flight
-- cannot overwrite. The key lives as long as its newest field.
--
-- KEYS[1]  the lock key
-- KEYS[2]  its `waits` helper key
-- ARGV[1]  the caller's token
-- ARGV[2]  the wait's id
-- ARGV[3]  how long a record (or an end mark) lives, in ms
-- ARGV[4]  'write' (write or renew) or 'end'
-- ARGV[5]  write: the wait's start, Unix ms; end: how many locks the wait waits for
-- ARGV[6..] write: the full keys of the locks the wait waits for
--
-- Reply: 1 written (or ended), 0 not written: the lock is not the caller's (a semaphore's
-- permit never is: its records would not be read), or this wait has ended already (a renewal
-- that arrives after the end must not bring the record back).

local now = now_ms()
local found, value = shape(KEYS[1])
local holds = false
if found == 'string' then
  holds = value == ARGV[1]
elseif found == 'read' then
  local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
  holds = score ~= false and tonumber(score) >= now
end
if not holds then
  return 0
end
local life = tonumber(ARGV[3])
local expires = tostring(now + life)
if ARGV[4] == 'end' then
  for i = 1, tonumber(ARGV[5]) do
    local field = ARGV[2] .. ' ' .. i
    -- A key of another type is no record of this version's: it is replaced.
    if redis.pcall('HSET', KEYS[2], field, expires .. ' ended').err then
      redis.call('DEL', KEYS[2])
      redis.call('HSET', KEYS[2], field, expires .. ' ended')
    end
  end
  redis.call('PEXPIRE', KEYS[2], life)
  return 1
end
-- Drop the fields that ran out (waits of holders that died), and learn whether this wait ended.
-- The hash is rewritten without them (`DEL`, then the live fields), which needs no `HDEL`.
-- A key of another type is no record of this version's: it is replaced.
local fields = redis.pcall('HGETALL', KEYS[2])
if fields.err then
  redis.call('DEL', KEYS[2])
  fields = {}
end
local prefix = ARGV[2] .. ' '
local live, lapsed = {}, false
for i = 1, #fields, 2 do
  local field, text = fields[i], fields[i + 1]
  local until_ms = tonumber(string.match(text, '^(%d+) '))
  if not until_ms or until_ms < now then
    lapsed = true
  else
    if string.sub(field, 1, #prefix) == prefix and string.match(text, '^%d+ ended$') then
      return 0
    end
    live[#live + 1] = field
    live[#live + 1] = text
  end
end
if lapsed then
  redis.call('DEL', KEYS[2])
  if #live > 0 then
    redis.call('HSET', KEYS[2], unpack(live))
  end
end
for i = 6, #ARGV do
  redis.call('HSET', KEYS[2], prefix .. (i - 5),
    expires .. ' ' .. ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[5] .. ' ' .. ARGV[i])
end
redis.call('PEXPIRE', KEYS[2], life)
return 1
