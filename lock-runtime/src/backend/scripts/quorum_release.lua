-- Redlock's release on one master: delete the lock if it is still ours, and wake one waiter.
--
-- - `KEYS[1]` the lock key, `KEYS[2]` its wake list (see [`QUORUM_ACQUIRE`]), `KEYS[3]` its
--   `since` record, deleted with the lock.
-- - `ARGV[1]` the token, `ARGV[2]` the caller's own member, taken out of the wake list whether
--   or not the lock is ours (empty: none), `ARGV[3]` `"1"` to wake a waiter when the lock is
--   deleted: a release; `"0"` for a contender giving back the masters of an attempt that did
--   not reach a majority, which retries on its own and must not wake a waiter that would only
--   find the lock held by whoever won.
-- - Returns 1 when the lock was ours and is now deleted, 0 when it was not ours (nothing of
--   the lock touched).
--
-- The wake-up goes to the first live waiter only: places are taken out earliest lease first,
-- those whose lease ran out (their waiter died, or its network did) dropped on the way, and the
-- first still running is sent `"<token> ?"` on its channel (one `ZPOPMIN` when nobody died). So a release wakes at most one waiter per master
-- however many wait, and a dead waiter's place is skipped at most a lease after its last
-- renewal. With nobody waiting this is the compare-and-delete of any Redis lock plus one
-- `EXISTS`.
local waiting = redis.call('EXISTS', KEYS[2]) == 1
if waiting and ARGV[2] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[2])
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[3])
if waiting and ARGV[3] == '1' then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  while true do
    local first = redis.call('ZPOPMIN', KEYS[2])
    if not first[1] then
      break
    end
    if tonumber(first[2]) >= now then
      local channel, waiter = string.match(first[1], '^(%S+) (.+)$')
      if channel then
        redis.call('PUBLISH', channel, waiter .. ' ?')
        break
      end
    end
  end
end
return 1
