-- Give back a permit, handing it (and any permit freed by a lease that ran out) straight to
-- the next live waiters in line; or leave the line. One call. Runs after `family_prelude.lua`.
--
-- - `KEYS` as in `semaphore_acquire.lua`: the leased set, the line, the fencing counter, the
--   holders' fencing tokens; `KEYS[5]` the `forced-leases` marks (see
--   `leased_force_release.lua`); `KEYS[6]` the lock's `releases` marks, only when `ARGV[5]` is
--   not `""`.
-- - `ARGV[1]` the caller's value (token), `ARGV[2]` the claim in ms, `ARGV[3]` `"1"` to also
--   leave the line (a waiter that gives up, whose permit may have been handed to it
--   meanwhile), `ARGV[4]` `"1"` where receivers of a publish are counted, `ARGV[5]` how long a
--   release is remembered in `KEYS[5]`, ms (`""`: not at all).
-- - Returns 1 when the permit was ours and is now free (or this same release, re-sent: the
--   marks hold the token), 2 when it was ours and went to a waiter; 0 when it was not ours
--   (its lease ran out: a semaphore has no single other holder to name), -2 when an operator
--   broke it (the `forced-leases` marks hold the token). Errors:
--   `MODE <found> permits ...` when the name is held as a mutex or a read-write lock.
--
-- A waiter is handed a lease of `min(its ttl, claim)`, confirmed later by its extension, as a
-- mutex hand-off is; its fencing token is issued here. A waiter whose grant nobody heard
-- (`ARGV[4]`) loses its place, and its fencing token is taken back when it was the last.
local SET, LINE, FENCE, FENCES = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local me, claim, counted = ARGV[1], tonumber(ARGV[2]), ARGV[4] == '1'
local FORCED, MARKS, window = KEYS[5], KEYS[6], ARGV[5] or ''

local found, n = shape(SET)
if found ~= 'none' and found ~= 'permits' then
  return mode_error(SET, found, 'permits')
end
if ARGV[3] == '1' then
  local _, entry = find(LINE, me)
  if entry then
    redis.call('LREM', LINE, 1, entry)
  end
end
if found == 'none' then
  return gone_reply(MARKS, window, FORCED, me) or 0
end
local now = now_ms()
prune(SET, FENCES, now)
local ours = redis.call('ZREM', SET, me) == 1
redis.call('HDEL', FENCES, me)

local _, handed = give_permits(SET, LINE, FENCE, FENCES, n - (redis.call('ZCARD', SET) - 1),
  now, nil, claim, counted)
settle(SET, FENCES)
if not ours then
  -- Only a run that found the permit ours writes the mark, so it vouches for no other.
  return gone_reply(MARKS, window, FORCED, me) or 0
end
if ARGV[3] ~= '1' then
  mark_released(MARKS, me, window, now)
end
if handed > 0 then
  return 2
end
return 1
