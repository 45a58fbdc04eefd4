-- Whether a permit, or a reader's lease, is still the caller's: one look that writes nothing.
-- Runs after `family_prelude.lua`.
--
-- - `KEYS[1]` the lock key (a leased set; a string holding the caller's value when a mutex's
--   release handed a reader the whole lock).
-- - `ARGV[1]` the caller's value (token).
-- - Returns 1 when its lease runs past Redis's clock now (or the string holds its value), 0
--   otherwise. Errors: `MODE other ...` for a key distlock did not write.
local found, value = shape(KEYS[1])
if found == 'string' then
  if value == ARGV[1] then
    return 1
  end
  return 0
end
if found == 'none' then
  return 0
end
if found == 'other' then
  return mode_error(KEYS[1], 'other', 'permits')
end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) >= now_ms() then
  return 1
end
return 0
