-- Set the remaining ttl of several locks taken together (one slot), each only if still the
-- caller's. One call. Runs after `family_prelude.lua` (it needs none of it, but every
-- family script is loaded the same way).
--
-- - `KEYS[1..k]` the lock keys (repeats allowed; no lines or counters needed).
-- - `ARGV[1]` the caller's value (token), `ARGV[2]` the new ttl in ms.
-- - Returns `{extended, not_ours}`, counting distinct keys. The guard is lost when
--   `not_ours` > 0; the keys still the caller's are extended anyway, so that the release that
--   follows finds them and hands them on rather than leaving them to expire.
local me, ttl = ARGV[1], ARGV[2]
local seen = {}
local extended, lost = 0, 0
for _, lock in ipairs(KEYS) do
  if not seen[lock] then
    seen[lock] = true
    if redis.pcall('GET', lock) == me then
      redis.call('PEXPIRE', lock, ttl)
      extended = extended + 1
    else
      lost = lost + 1
    end
  end
end
return {extended, lost}
