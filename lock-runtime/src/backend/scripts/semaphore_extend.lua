-- Set the remaining lease of a permit, or of a read lock, if it is still the caller's. One
-- call. Runs after `family_prelude.lua`. Readers' leases use it too: they live in the same
-- kind of leased set (marker `#read`).
--
-- - `KEYS[1]` the lock key (the leased set), `KEYS[2]` the holders' fencing tokens (helper
--   `permit-fences`), set to expire with the set; `KEYS[3]`, if given, the `forced-leases`
--   marks (see `leased_force_release.lua`).
-- - `ARGV[1]` the caller's value (token), `ARGV[2]` the new ttl in ms.
-- - Returns 1 when extended, 0 when the lease was not the caller's any more (nothing touched
--   but leases that ran out, which are pruned), -2 when an operator broke it. A string key holding the caller's value (a
--   reader handed the whole lock by a mutex release that does not know readers) is extended
--   as the mutex's `extend.lua` does. Errors: `MODE ...` for a key of another kind.
local SET, FENCES, FORCED = KEYS[1], KEYS[2], KEYS[3]
local me, ttl = ARGV[1], tonumber(ARGV[2])
local found = shape(SET)
if found == 'string' then
  if redis.call('GET', SET) == me then
    return redis.call('PEXPIRE', SET, ttl)
  end
  if was_forced(FORCED, me) then
    return -2
  end
  return 0
end
if found == 'none' then
  if was_forced(FORCED, me) then
    return -2
  end
  return 0
end
if found == 'other' then
  return mode_error(SET, found, 'permits')
end
local now = now_ms()
prune(SET, FENCES, now)
if not redis.call('ZSCORE', SET, me) then
  settle(SET, FENCES)
  if was_forced(FORCED, me) then
    return -2
  end
  return 0
end
redis.call('ZADD', SET, 'XX', now + ttl, me)
settle(SET, FENCES)
return 1
