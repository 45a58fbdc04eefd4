-- Set the lock's remaining ttl if it is still ours.
--
-- - `KEYS[1]` the lock key, `KEYS[2]` its `forced` mark (see [`FORCE_RELEASE`]), `KEYS[3]` its
--   `since` record (see `granted` in [`LINE_PRELUDE`]), which lives as long as the lock (when
--   there is one: expiring a missing key is a no-op); `ARGV[1]` the token, `ARGV[2]` the new
--   ttl in milliseconds.
-- - Returns 1 when extended; when the lock was not ours (nothing touched), why: -2 an
--   operator force-released it (the mark holds the token), -1 another holder has it, 0 nobody
--   does. The mark is read only then, so an extension costs what it did.
local held = redis.pcall('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return not_ours(held, KEYS[2], ARGV[1])
