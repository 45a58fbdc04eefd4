-- Break a lock for an operator (`LockManager::force_release`, `distlock release --force`):
-- release it as its holder would, if its key still holds the value the operator saw.
--
-- - `KEYS` as in [`LINE_PRELUDE`]: `KEYS[4]` the `since` record, `KEYS[5]` the lock's
--   `forced` mark, `KEYS[6]` its lease table (last, as the prelude expects); `ARGV[1]` the value
--   seen, `ARGV[2]` the claim (see [`ACQUIRE`]), `ARGV[3]` `"1"` where receivers of a publish
--   are counted (see `hand_off`), `ARGV[4]` how long the mark is kept, in ms.
-- - Returns 1 when the lock was broken (or was by this same call: see below), 0 when its key
--   holds something else now (nothing touched).
--
-- A lock deleted here takes its `since` record with it, as a release's does.
--
-- The holder is not told, and goes on believing it holds the lock: so the holder's token
-- (the value without a `;hold=` suffix) is left in the `forced` mark, where its next
-- [`EXTEND`], [`RELEASE`] or [`HOLD`] finds it and answers "force-released" rather than a
-- cause the holder could not act on. The `released` marker is left alone: a holder's token
-- there would tell the holder's own marked release that it had released the lock itself.
-- (A key kept for a hold was released by its holder already: that holder's marker, not this
-- mark, answers its re-sent release.) The mark also recognises this script run twice (a cluster connection re-sends a command
-- whose reply it lost): a run that finds the lock not the value's but the mark the
-- holder's answers 1.
--
-- A line of another type than a list cannot hand the lock on: the lock is deleted, and the
-- reply is an error naming the line, as in [`RELEASE`].
local held = redis.pcall('GET', KEYS[1])
local holder = string.match(ARGV[1], '^(.*);hold=%d+$') or ARGV[1]
if held ~= ARGV[1] then
  if type(held) == 'table' then
    return redis.error_reply('WRONGTYPE distlock: the lock key ' .. KEYS[1] ..
      ' holds a value of another type, not a lock')
  end
  if redis.pcall('GET', KEYS[5]) == holder then
    return 1
  end
  return 0
end
redis.call('SET', KEYS[5], holder, 'PX', ARGV[4])
local read, first = pcall(hand_off, tonumber(ARGV[2]), holder, nil, nil, ARGV[3] == '1', nil)
if not read then
  redis.call('DEL', KEYS[1], KEYS[4])
  return redis.error_reply('WRONGTYPE distlock: the lock ' .. KEYS[1] .. ' was released, ' ..
    'but its line ' .. KEYS[2] .. ' holds a value of another type, so nobody in it could be ' ..
    'handed the lock: something other than distlock wrote that key; delete it')
end
if not first then
  redis.call('DEL', KEYS[1], KEYS[4])
end
return 1
