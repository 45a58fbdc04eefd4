-- Release a read or write lock, letting in the head of the line (a run of readers together, or
-- one writer once the last reader is gone); or leave the line. One call. Runs after
-- `family_prelude.lua` and `rw_line.lua`.
--
-- - `KEYS` as in `rw_acquire.lua`: the lock key, its line, the fencing counter, the readers'
--   fencing tokens; `KEYS[5]` the `forced-leases` marks (see `leased_force_release.lua`);
--   `KEYS[6]` the lock's `releases` marks, only when `ARGV[5]` is not `""`.
-- - `ARGV[1]` the caller's value (token), `ARGV[2]` the claim in ms, `ARGV[3]` `"1"` to also
--   leave the line, `ARGV[4]` `"1"` where receivers of a publish are counted, `ARGV[5]` how
--   long a release is remembered in `KEYS[5]`, ms (`""`: not at all).
-- - Returns 1 when the lock was ours and is now free (or still held by other readers; or this
--   same release, re-sent: the marks hold the token), 2 when it was ours and someone in line
--   was let in; when it was not ours, -2 when an operator broke the reader's lease, -1 when a
--   writer (someone else) holds it, 0 otherwise.
--   Errors: `MODE ...` when the name is a semaphore or not distlock's.
--
-- A writer's release here is the mutex's release plus the readers' hand-off: a reader at the
-- head is let in with every reader behind it up to the next writer.
local LOCK, LINE, FENCE, FENCES = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local me, claim = ARGV[1], tonumber(ARGV[2])
local FORCED, MARKS, window = KEYS[5], KEYS[6], ARGV[5] or ''
local found, value = shape(LOCK)
if found == 'permits' or found == 'other' then
  local wanted = 'string'
  if is_reader(me) then
    wanted = 'read'
  end
  return mode_error(LOCK, found, wanted)
end
if ARGV[3] == '1' then
  local _, entry = find(LINE, me)
  if entry then
    redis.call('LREM', LINE, 1, entry)
  end
end
local now = now_ms()
local writer, readers, ours, other = false, 0, false, false
if found == 'string' then
  if value == me then
    redis.call('DEL', LOCK)
    ours = true
  else
    writer, other = true, true
  end
elseif found == 'read' then
  prune(LOCK, FENCES, now)
  ours = redis.call('ZREM', LOCK, me) == 1
  redis.call('HDEL', FENCES, me)
  readers = redis.call('ZCARD', LOCK) - 1
  if readers == 0 then
    redis.call('DEL', LOCK, FENCES)
  end
end
local _, admitted
_, admitted, writer, readers = rw_admit(LOCK, LINE, FENCE, FENCES, now, nil, claim,
  ARGV[4] == '1', writer, readers)
if readers > 0 then
  settle(LOCK, FENCES)
end
if not ours then
  -- Only a run that found the lock ours writes the mark, so it vouches for no other.
  local gone = gone_reply(MARKS, window, FORCED, me)
  if gone then
    return gone
  end
  if other then
    return -1
  end
  return 0
end
if ARGV[3] ~= '1' then
  mark_released(MARKS, me, window, now)
end
if admitted > 0 then
  return 2
end
return 1
