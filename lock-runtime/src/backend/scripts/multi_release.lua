-- Release several locks taken together (one slot), handing each key that someone waits for
-- straight to the first live waiter in its line. One call. Runs after `family_prelude.lua`.
--
-- - `KEYS` as in `multi_acquire.lua`: k lock keys (repeats allowed), their k lines, their k
--   fencing counters; then, only when `ARGV[5]` is not `""`, the `releases` marks of the first
--   lock key (all share one slot).
-- - `ARGV[1]` the caller's value (token), `ARGV[2]` the claim in ms, `ARGV[3]` `"1"` to also
--   leave every line (a waiter that gives up: keys handed to it meanwhile are handed on),
--   `ARGV[4]` `"1"` where receivers of a publish are counted, `ARGV[5]` how long a release
--   of every key is remembered in the marks, ms (`""`: not at all).
-- - Returns `{released, handed, not_ours}`, counting distinct keys: how many were the caller's
--   and are now free, how many were the caller's and went to a waiter, how many were not the
--   caller's (their lease ran out). The guard is lost when `not_ours` > 0. This same release,
--   re-sent after it gave back every key, finds the token in the marks and answers
--   `{0, 0, 0}`.
--
-- A hand-off here is the mutex's (`hand_key`): the waiter's value is written into the key with a
-- ttl of `min(its ttl, claim)`, its fencing token (if it asked) is issued from that key's
-- counter, and `"<token> <fence>"` is published on its channel; dead or unheard waiters are
-- skipped.
local window = ARGV[5] or ''
local MARKS = nil
if window ~= '' then
  MARKS = KEYS[#KEYS]
end
local k = math.floor(#KEYS / 3)
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
if lost == 0 and ARGV[3] ~= '1' then
  mark_released(MARKS, me, window, now_ms())
elseif released + handed == 0 and was_released(MARKS, me, window) then
  -- Only a run that found every key ours writes the mark, so it vouches for no other.
  return {0, 0, 0}
end
return {released, handed, lost}
