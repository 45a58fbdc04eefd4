-- Release a lock taken with `hold_at_least` before that time is up: instead of deleting it,
-- keep it until the hold ends, if it is still ours; and tell the first live waiter in line to
-- look again, so that it sleeps until the hold's end rather than until the ttl it last saw.
--
-- - `KEYS[1]` the lock key, `KEYS[2]` its line (the prelude's line helpers only: no fencing
--   token is issued here, so `KEYS[3]` is free: the `forced` mark, see [`FORCE_RELEASE`]),
--   `KEYS[4]` its `since` record (see `granted` in [`LINE_PRELUDE`]), set to expire with the
--   lock so that it does not outlive it, `KEYS[5]` the `released` marker when given (see
--   below), and last its lease table (see [`LINE_PRELUDE`]); `ARGV[1]` the token, `ARGV[2]` the milliseconds the hold has left (at
--   least 1), `ARGV[3]` the claim (see [`ACQUIRE`]).
-- - Returns 1 when the lock was ours and is now kept until the hold ends; when it was not
--   ours, nothing touched, why, as [`RELEASE`] answers it.
--
-- A line of another type than a list cannot be told: the lock is still left to expire when
-- the hold ends, and the reply is an error naming the line.
--
-- With nobody live in line the lock key is set to expire at the hold's end, and nothing else is
-- written: whoever comes then finds it free. With a live waiter, an expiry alone would leave the
-- lock free at the hold's end until that waiter's look lands, and a newcomer's first try (a
-- plain `SET NX`, which does not read the line) could take it first. So the key is kept a claim
-- longer, its value set to `"<token>;hold=<hold's end, Redis time in ms>"`, which tells
-- [`ACQUIRE`] (whose `GET` of the key reads it anyway) that the lock is the line's from the
-- hold's end: the first waiter's look then, or anyone's join, hands it over. A token never
-- contains `;hold=` (see `identity.rs`), and the suffix is matched at the value's end, so it is
-- unambiguous. Should every waiter die meanwhile, nobody looks, and the key expires a claim
-- after the hold's end.
--
-- The message `"<token> ?"` grants nothing: it only wakes that waiter. A waiter further back
-- learns of the hold at its next renewal.
--
-- Run twice (a re-sent command) it must not start the hold again, nor answer "not ours" once
-- the lock has gone to a waiter or expired: so a caller that may send it again (a cluster
-- connection after a lost reply, `Node::hold` after a dropped connection, as for a release)
-- also passes `KEYS[4]`, the lock's `released` marker, and `ARGV[4]`, how long after the first
-- run it may be re-sent, as for [`RELEASE`]; the first run leaves its
-- token there, and a run that finds the lock not ours but its own token in the marker
-- answers 1, whatever the `forced` mark holds: the first run kept the key for the hold, with
-- the holder's token in it, and an operator who broke that key broke a lock already released. A run that finds the value its own token with a `;hold=` suffix is a re-send too:
-- it answers 1 and changes nothing.
local value = redis.pcall('GET', KEYS[1])
if value ~= ARGV[1] then
  if type(value) == 'string' and string.sub(value, 1, #ARGV[1]) == ARGV[1]
      and string.find(value, '^;hold=%d+$', #ARGV[1] + 1) then
    return 1
  end
  local why = not_ours(value, KEYS[3], ARGV[1])
  if ARGV[4] and redis.call('GET', KEYS[5]) == ARGV[1] then
    return 1
  end
  return why
end
if ARGV[4] then
  redis.call('SET', KEYS[5], ARGV[1], 'PX', ARGV[4])
end
local read, waiter, channel, now = pcall(first_live, ARGV[1])
if not read then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[4], ARGV[2])
  return redis.error_reply('WRONGTYPE distlock: the lock ' .. KEYS[1] .. ' was released to ' ..
    'expire when its hold ends, but its line ' .. KEYS[2] .. ' holds a value of another ' ..
    'type, so nobody in it could be told: something other than distlock wrote that key; ' ..
    'delete it')
end
if waiter then
  local keep = tonumber(ARGV[2])
  local claim = tonumber(ARGV[3])
  redis.call('SET', KEYS[1], ARGV[1] .. ';hold=' .. (now + keep), 'PX', keep + claim)
  redis.call('PEXPIRE', KEYS[4], keep + claim)
  if channel ~= '' then
    redis.call('PUBLISH', channel, waiter .. ' ?')
  end
  return 1
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[4], ARGV[2])
return 1
