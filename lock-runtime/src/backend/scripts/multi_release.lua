-- Release several locks taken together (one slot), handing each key that someone waits for
-- straight to the first live waiter in its line. One call. Runs after `family_prelude.lua`.
--
-- - `KEYS` as in `multi_acquire.lua`: k lock keys (repeats allowed), their k lines, their k
--   fencing counters.
-- - `ARGV[1]` the caller's value (token), `ARGV[2]` the claim in ms, `ARGV[3]` `"1"` to also
--   leave every line (a waiter that gives up: keys handed to it meanwhile are handed on),
--   `ARGV[4]` `"1"` where receivers of a publish are counted.
-- - Returns `{released, handed, not_ours}`, counting distinct keys: how many were the caller's
--   and are now free, how many were the caller's and went to a waiter, how many were not the
--   caller's (their lease ran out, or a re-sent release already gave them back). The guard is
--   lost when `not_ours` > 0.
--
-- A hand-off here is the mutex's (`hand_key`): the waiter's value is written into the key with a
-- ttl of `min(its ttl, claim)`, its fencing token (if it asked) is issued from that key's
-- counter, and `"<token> <fence>"` is published on its channel; dead or unheard waiters are
-- skipped.
local k = #KEYS / 3
local me, claim, counted = ARGV[1], tonumber(ARGV[2]), ARGV[4] == '1'
local seen = {}
local released, handed, lost = 0, 0, 0
for i = 1, k do
  local lock = KEYS[i]
  if not seen[lock] then
    seen[lock] = true
    if ARGV[3] == '1' then
      local _, entry = find(KEYS[k + i], me)
      if entry then
        redis.call('LREM', KEYS[k + i], 1, entry)
      end
    end
    local value = redis.pcall('GET', lock)
    if value == me then
      if hand_key(lock, KEYS[k + i], KEYS[2 * k + i], me, claim, counted) then
        handed = handed + 1
      else
        redis.call('DEL', lock)
        released = released + 1
      end
    else
      lost = lost + 1
    end
  end
end
return {released, handed, lost}
