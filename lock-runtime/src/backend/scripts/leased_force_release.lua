-- Break the leases of a semaphore or of readers for an operator (`LockManager::force_release`,
-- `distlock release --force`): remove every lease the operator saw that is still there, keep
-- those holders' tokens in the `forced-leases` marks so that each learns why (its next
-- extension or release answers "force-released"), and let in the head of the line as their
-- releases would have. One call. Runs after `family_prelude.lua` and `rw_line.lua`.
--
-- - `KEYS[1]` the lock key (the leased set), `KEYS[2]` its line (`permit-line` for a
--   semaphore, the mutex's `line` for readers), `KEYS[3]` the fencing counter, `KEYS[4]` the
--   holders' fencing tokens (`permit-fences`), `KEYS[5]` the `forced-leases` marks (a sorted
--   set of tokens scored by when each is forgotten).
-- - `ARGV[1]` what the operator saw: `"permits"` or `"read"`; `ARGV[2]` the claim in ms;
--   `ARGV[3]` `"1"` where receivers of a publish are counted; `ARGV[4]` how long a broken
--   holder's token is kept in the marks, ms; `ARGV[5..]` the values of the holders seen.
-- - Returns how many of those leases were broken; when none is there any more, how many of
--   them the marks hold (this same call, re-sent after a lost reply, answers as its first);
--   0: nothing touched, the holders seen are gone (released, run out) or the name is held
--   another way now.
--
-- A holder that came in after the operator looked is not broken: only the values seen are.
local SET, LINE, FENCE, FENCES, FORCED = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local seen, claim, counted, keep = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1', tonumber(ARGV[4])
local found, n = shape(SET)
local now = now_ms()
local broken = 0
if found == seen then
  prune(SET, FENCES, now)
  for i = 5, #ARGV do
    if redis.call('ZREM', SET, ARGV[i]) == 1 then
      redis.call('HDEL', FENCES, ARGV[i])
      redis.call('ZADD', FORCED, now + keep, ARGV[i])
      broken = broken + 1
    end
  end
end
if broken == 0 then
  local again = 0
  for i = 5, #ARGV do
    local kept = redis.call('ZSCORE', FORCED, ARGV[i])
    if kept and tonumber(kept) >= now then
      again = again + 1
    end
  end
  return again
end
redis.call('ZREMRANGEBYSCORE', FORCED, '-inf', '(' .. now)
redis.call('PEXPIRE', FORCED, keep)
local holders = redis.call('ZCARD', SET) - 1
if found == 'permits' then
  give_permits(SET, LINE, FENCE, FENCES, n - holders, now, nil, claim, counted)
  settle(SET, FENCES)
else
  if holders == 0 then
    redis.call('DEL', SET, FENCES)
  end
  local _, _, _, readers = rw_admit(SET, LINE, FENCE, FENCES, now, nil, claim, counted, false,
    holders)
  if readers > 0 then
    settle(SET, FENCES)
  end
end
return broken
