-- Lua shared by the semaphore, read-write and multi-key scripts (`semaphore_*.lua`, `rw_*.lua`,
-- `multi_*.lua`), prepended to their text as `line_prelude.lua` is to the mutex's scripts.
-- It defines functions only; the key names are passed in, so no KEYS layout is assumed here.
--
-- A leased set is a sorted set at the lock key itself: one member per holder (its whole value,
-- `<uuid>;h=..;p=..;t=..`, so inspection reads who holds it), scored by the Redis time in ms at
-- which that holder's lease runs out, plus one marker member scored `+inf` that says what the
-- name is: `#permits=<n>` (a semaphore of n permits) or `#read` (a read-write lock held by
-- readers). The key itself expires with its last lease (`settle`), as a mutex key expires with
-- its holder. A mutex key is a string: so `GET` through `pcall` tells the two apart with no
-- `TYPE` (which the minimal ACL lacks), and a plain `SET NX` of a mutex finds a leased set
-- occupied.
--
-- A line entry has the mutex's format, `"<token> <lease deadline ms> <ttl ms> <fencing 0|1>
-- <grant channel>"`; a reader's value carries the field `;m=r` (see `is_reader`).
--
-- - `bytes_before(a, b)`: whether string `a` sorts before `b` byte by byte. Lua's `<` on
--   strings follows the server's `LC_COLLATE` (Redis takes it from its environment), and the
--   order keys are taken in must be the byte order every client uses, whatever the locale.
-- - `now_ms()`: Redis time in ms.
-- - `parse(entry)`: token, deadline, ttl, fencing, channel of a line entry (`nil` if malformed).
-- - `is_reader(token)`: whether the value has the field `;m=r` (host and label are
--   percent-escaped, so `;` inside a value always starts a field).
-- - `next_fence(counter)`: the next fencing token of `counter`, or `nil` and an error reply.
-- - `shape(key)`: what the key holds: `'none'`; `'string', value` (a mutex, or a writer);
--   `'permits', n`; `'read'`; `'other'` (something distlock did not write).
-- - `mode_error(key, found, wanted)`: the error reply for a name used in two ways, headed
--   `MODE <found> <wanted>` so the runtime can build a `LockError::Config` naming both.
-- - `prune(set, fences, now)`: drops the leases of `set` that ran out before `now`, and their
--   fencing tokens from the hash `fences`; every script that reads a leased set calls it first.
-- - `settle(set, fences)`: sets `set` (and `fences`) to expire with its last lease, or deletes
--   them when only the marker is left.
-- - `find(line, token)`: the index and text of `token`'s entry in `line`, or `nil`.
-- - `take_place(line, token, entry_tail, lease, now)`: writes the caller's entry (its deadline
--   `now + lease`) in place or at the end; returns its index and deadline.
-- - `publish(channel, token, fence, counted)`: sends a grant; whether someone heard it (always
--   true without `counted`, or with no channel: the waiter then finds its grant by looking).
-- - `grant(token, wanted, fencing, channel, me, claim, counted, counter, place, take_back)`: the
--   one lease grant of every line here: a lease of `min(wanted, claim)` (`me`, the caller: its
--   full `wanted`, no message), its fencing token from `counter` when it asked (`fencing`
--   `'1'`), written by `place(px, fence)`, and `"<token> <fence>"` on its channel. Returns
--   `'mine', {1, fence, px}` for `me`; `'given'` when the waiter heard it; `'failed', error` when
--   `me`'s fencing token could not be issued; `'skipped'` when another's could not (it is told
--   `"<token> !"`) or nobody heard its grant (with `counted`): then `take_back()` undoes
--   `place`, and its fencing token goes back to the counter when it was the last issued.
-- - `hand_key(lock, line, counter, me, claim, counted)`: hands the mutex key `lock`, which the
--   caller `me` holds, to the first live waiter of `line` other than `me`, as the mutex's
--   release does (`grant`, the value written into `lock`); dead entries and ones whose grant
--   nobody heard are dropped. Returns whether someone got it (if not, `lock` is left as it was).
-- - `give_permits(set, line, counter, fences, free, now, me, claim, counted)`: hands up to
--   `free` permits of the leased set `set` to the live waiters at the head of `line`, in order:
--   each gets a lease of `min(its ttl, claim)` (`me`, the caller, its full ttl and no message),
--   its fencing token from `counter` when it asked (kept in `fences`), and `"<token> <fence>"`
--   on its channel; one whose grant nobody heard (with `counted`) gets nothing, loses its place,
--   and its fencing token is taken back when it was the last issued; dead entries and entries of
--   holders are dropped. Returns the reply for `me` when it got a permit (or the error reply of
--   its fencing token), and how many permits went to others.
-- - `mark_released(marks, token, window, now)`: remembers in the sorted set `marks` (helper
--   `releases`) that `token`'s release ran, for `window` ms (`''`: nothing is kept, `marks` is
--   nil), so that the same release sent again (a cluster connection's resend after a lost
--   reply) is known for what it is; drops the marks whose window closed. A set, not the
--   mutex's one-token `released` marker: several permits or readers release side by side.
-- - `was_released(marks, token, window)`: whether `marks` remembers `token`'s release.
-- - `was_forced(forced, token)`: whether the `forced-leases` marks `forced` (nil: none) hold
--   `token`: an operator broke its lease (`leased_force_release.lua`).
-- - `gone_reply(marks, window, forced, token)`: what a release answers for a lease that is not
--   `token`'s: 1 when this same release ran before (its mark), -2 when an operator broke it,
--   nil otherwise (the caller says whose it is).
local function bytes_before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end

local function now_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

local function parse(entry)
  return string.match(entry, '^(%S+) (%d+) (%d+) ([01]) (.*)$')
end

local function is_reader(token)
  return string.find(token .. ';', ';m=r;', 1, true) ~= nil
end

local function next_fence(counter)
  local fence = redis.pcall('INCR', counter)
  if type(fence) == 'table' and fence.err then
    return nil, redis.error_reply('ERR distlock: the fencing counter ' .. counter ..
      ' cannot issue a token (' .. fence.err .. '), so nothing was taken; set it to an ' ..
      'integer above the largest token your storage has accepted')
  end
  if fence < 1 then
    redis.call('SET', counter, fence - 1)
    return nil, redis.error_reply('ERR distlock: the fencing counter ' .. counter ..
      ' is below 0, so nothing was taken; set it above the largest token your storage has ' ..
      'accepted')
  end
  return fence
end

local function shape(key)
  local value = redis.pcall('GET', key)
  if value == false then
    return 'none'
  end
  if type(value) == 'string' then
    return 'string', value
  end
  local marker = redis.pcall('ZRANGEBYSCORE', key, '+inf', '+inf', 'LIMIT', 0, 1)
  if type(marker) ~= 'table' or marker.err or not marker[1] then
    return 'other'
  end
  if marker[1] == '#read' then
    return 'read'
  end
  local n = string.match(marker[1], '^#permits=(%d+)$')
  if n then
    return 'permits', tonumber(n)
  end
  return 'other'
end

local NAMES = {
  string = 'a mutex (or a write lock)', read = 'a read-write lock', permits = 'a semaphore',
  other = 'something distlock did not write', multi = 'one of several keys taken together',
}

local function mode_error(key, found, wanted)
  return redis.error_reply('MODE ' .. found .. ' ' .. wanted .. ' distlock: ' .. key ..
    ' is held as ' .. NAMES[found] .. ', and this caller uses it as ' .. NAMES[wanted] ..
    ': every caller of a name must use it the same way; use another name for one of them')
end

local function prune(set, fences, now)
  local gone = redis.call('ZRANGEBYSCORE', set, '-inf', '(' .. now)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', set, '-inf', '(' .. now)
    -- In slices: Lua hands at most about 8000 values to one call, and the leases of holders
    -- that stopped together run out together.
    for first = 1, #gone, 1000 do
      redis.call('HDEL', fences, unpack(gone, first, math.min(first + 999, #gone)))
    end
  end
end

local function settle(set, fences)
  local last = redis.call('ZREVRANGEBYSCORE', set, '(+inf', '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if last[2] then
    local at = math.floor(tonumber(last[2]))
    redis.call('PEXPIREAT', set, at)
    redis.call('PEXPIREAT', fences, at)
  else
    redis.call('DEL', set, fences)
  end
end

local function find(line, token)
  local prefix = token .. ' '
  for index, entry in ipairs(redis.call('LRANGE', line, 0, -1)) do
    if string.sub(entry, 1, #prefix) == prefix then
      return index - 1, entry
    end
  end
  return nil
end

local function take_place(line, token, entry_tail, lease, now)
  local deadline = now + lease
  local entry = token .. ' ' .. deadline .. ' ' .. entry_tail
  local index = find(line, token)
  if index then
    redis.call('LSET', line, index, entry)
  else
    index = redis.call('RPUSH', line, entry) - 1
  end
  redis.call('PEXPIRE', line, 2 * lease)
  return index, deadline
end

local function publish(channel, token, fence, counted)
  if channel == '' then
    return true
  end
  local heard = redis.call('PUBLISH', channel, token .. ' ' .. fence)
  return heard > 0 or not counted
end

local function grant(token, wanted, fencing, channel, me, claim, counted, counter, place, take_back)
  local px = tonumber(wanted)
  if token ~= me then
    px = math.min(px, claim)
  end
  local fence, failed = 0, nil
  if fencing == '1' then
    fence, failed = next_fence(counter)
  end
  if failed then
    if token == me then
      return 'failed', failed
    end
    if channel ~= '' then
      redis.call('PUBLISH', channel, token .. ' !')
    end
    return 'skipped'
  end
  place(px, fence)
  if token == me then
    return 'mine', {1, fence, px}
  end
  if publish(channel, token, fence, counted) then
    return 'given'
  end
  take_back()
  if fence > 0 and tonumber(redis.call('GET', counter)) == fence then
    redis.call('SET', counter, fence - 1)
  end
  return 'skipped'
end

local function hand_key(lock, line, counter, me, claim, counted)
  local now = nil
  while true do
    local entry = redis.call('LPOP', line)
    if not entry then
      return false
    end
    local token, deadline, wanted, fencing, channel = parse(entry)
    now = now or now_ms()
    if token and token ~= me and tonumber(deadline) >= now then
      local outcome = grant(token, wanted, fencing, channel, me, claim, counted, counter,
        function(px)
          redis.call('SET', lock, token, 'PX', px)
        end,
        function()
          redis.call('DEL', lock)
        end)
      if outcome == 'given' then
        return true
      end
    end
  end
end

local function give_permits(set, line, counter, fences, free, now, me, claim, counted)
  local given = 0
  while free > 0 do
    local entry = redis.call('LPOP', line)
    if not entry then
      break
    end
    local token, deadline, wanted, fencing, channel = parse(entry)
    if token and (token == me or tonumber(deadline) >= now)
        and not redis.call('ZSCORE', set, token) then
      local outcome, reply = grant(token, wanted, fencing, channel, me, claim, counted, counter,
        function(px, fence)
          if fence > 0 then
            redis.call('HSET', fences, token, fence)
          end
          redis.call('ZADD', set, now + px, token)
        end,
        function()
          redis.call('ZREM', set, token)
          redis.call('HDEL', fences, token)
        end)
      if outcome == 'failed' or outcome == 'mine' then
        return reply, given
      end
      if outcome == 'given' then
        free = free - 1
        given = given + 1
      end
    end
  end
  return nil, given
end

local function mark_released(marks, token, window, now)
  if window == '' then
    return
  end
  local keep = tonumber(window)
  redis.call('ZREMRANGEBYSCORE', marks, '-inf', '(' .. now)
  redis.call('ZADD', marks, now + keep, token)
  redis.call('PEXPIRE', marks, keep)
end

local function was_released(marks, token, window)
  if window == '' then
    return false
  end
  local kept = redis.call('ZSCORE', marks, token)
  return kept ~= false and tonumber(kept) >= now_ms()
end

local function was_forced(forced, token)
  if not forced then
    return false
  end
  local kept = redis.call('ZSCORE', forced, token)
  return kept ~= false and tonumber(kept) >= now_ms()
end

local function gone_reply(marks, window, forced, token)
  if was_released(marks, token, window) then
    return 1
  end
  if was_forced(forced, token) then
    return -2
  end
  return nil
end
