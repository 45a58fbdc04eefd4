-- Lua shared by the line scripts below (prepended to their text, never spliced with data).
--
-- They expect `KEYS[1]` the lock key, `KEYS[2]` its line, `KEYS[3]` its fencing counter,
-- `KEYS[4]` its `since` record (see `granted` below; written only by scripts that hand over),
-- and the lock's lease table as the last key (`KEYS[#KEYS]`). The line is a list of waiters,
-- oldest first, each entry `"<token> <lease deadline ms> <ttl ms> <fencing 0|1> <grant
-- channel>"`: everything a release needs to hand the lock over is in the entry it pops, so a
-- hand-off costs no lookup besides the clock. The lease table is a sorted set of the tokens
-- whose places were renewed, each scored by the lease deadline its last renewal gave (Redis
-- time in ms): a renewal writes there, in O(log n), and leaves its entry as it was (see
-- [`ACQUIRE`]). So a waiter's place lasts until the later of its entry's deadline and its score.
--
-- `next_fence()`: the next fencing token, or `nil` and an error reply naming the counter. A
-- counter that is not a number (or not a string) fails `INCR`; one that something else set below 0 would give a token that is not
-- above every earlier one: it is put back as it was (so every later acquisition fails the same
-- way until someone looks, rather than quietly counting up to 1), and the error names it.
--
-- `hand_off(claim, except, quiet, popped, counted, known)`: gives the free lock to the first
-- live waiter in line (starting with `popped`, an entry the caller already took off the line,
-- when given) other than `except` (a releasing holder is never handed its own lock back): sets
-- the lock key to its token with a ttl of `min(its ttl, claim)`, issues its fencing token when
-- it asked for one, and publishes `"<token> <fence>"` on its grant channel (`"<token> !"` when
-- its fencing token cannot be issued: it is then dropped from the line). Dead waiters are
-- dropped on the way. Returns `{token, fence, ttl}` of the new holder (fence 0 without
-- fencing); `false` when nobody live waits. The waiter `quiet` is not sent a message: it is the
-- caller, and learns from the reply.
--
-- Who is dead: a waiter whose lease has run out (it stopped renewing: its process died, or its
-- network did): its entry's deadline has passed, and so has its score in the lease table, which
-- is read only then (a waiter that waited less than a renewal has none). A waiter skipped as
-- unheard or whose fencing token failed has its score set to 0 (`forget_lease`, which never
-- adds one), so that its next renewal looks for its place, finds none, and takes one at the
-- end; a dead one's score has run out, which a renewal checks too. The lease table's commands
-- run in `pcall`: refused by an ACL written before distlock used them, every renewal looks for
-- its entry and rewrites its deadline there, as without a table.
--
-- A lease that runs past `known` — Redis time in ms as the caller knows it from
-- its own last place in this line (see `Backend::redis_clock`) — has surely not run out, and
-- costs no `TIME`; only one that does not (or without `known`) is judged against `TIME`, read
-- once. So a `known` that is wrong (read off another server's clock, before a failover) never
-- has a live waiter skipped, and in a busy line, whose waiters all renew, the release reads no
-- clock. And with `counted` (a standalone server or a Sentinel
-- master, where `PUBLISH` answers how many connections received the message), a waiter whose
-- grant nobody received: its process is gone (a killed process's connection closes, and its
-- subscription with it), however long its lease has left. The lock goes on to the next waiter
-- in the same script, and the fencing token the unheard one was issued, if any, is taken back
-- (the counter is set back), so no token goes to nobody. A waiter's place names a channel only
-- while its process knows itself subscribed, so a live process is unheard only when its
-- connection dropped and it has not seen that yet: it loses its place, and takes one again at
-- its next look. On a cluster a
-- publish reaches every node but counts only the receivers on the lock's node: receivers
-- cannot be counted there, and leases alone tell.
--
-- `granted(holder, ttl, now)`: records in the lock's `since` key that `holder` got the lock now
-- (Redis time in ms: `now` when the caller knows it — a hand-off takes `known` rather than read
-- the clock, as it does for leases; it is off only by what separates two servers' clocks after
-- a failover, which a time shown to an operator can bear): `"<holder's UUID> <ms>"`, for
-- `ttl` ms — the ttl the lock key was just given, a hand-off's claim included, so that the
-- record of a holder that dies before confirming its full ttl expires with its lock — which
-- every extension of the lock renews (see [`EXTEND`]). A holder whose value was
-- written before it waited (a hand-off, a waiter that finds the lock free) would otherwise
-- show its wait as time held; inspection takes the record only while it names the lock's
-- current holder (UUIDs are never reused). A first try writes no record: its value is made
-- just before it, and its `SET NX` stays the only command of an uncontended acquisition.
--
-- `first_live(except)`: the first waiter in line whose lease still runs, other than `except`:
-- its token, its grant channel and the time now (read only when someone is in line); `nil` when
-- nobody live waits.
--
-- `lease_of(token, deadline, now)`: whether a place whose entry says `deadline` still runs at
-- `now`, by its entry or else by its score in the lease table.
--
-- `find(token)`: the index and text of `token`'s entry in line, or `nil`: a scan of the line.
--
-- `place_of(token, entry)`: the index of `token`'s entry, looked up by its exact text `entry`
-- with `LPOS` (a scan inside Redis, without copying the line into Lua); by `find` when that
-- finds nothing (`entry` is not what the line holds: a re-sent renewal rewrote it) or `LPOS`
-- is refused (an ACL written before distlock used it).
local LEASES = KEYS[#KEYS]

local function next_fence()
  local fence = redis.pcall('INCR', KEYS[3])
  if type(fence) == 'table' and fence.err then
    return nil, redis.error_reply((string.match(fence.err, '^(%u+) ') or 'ERR') ..
      ' distlock: the fencing counter ' .. KEYS[3] .. ' cannot issue a token (' .. fence.err ..
      '), so the lock was not taken; set it to an integer above the largest token your ' ..
      'storage has accepted, or delete it if no storage has seen its tokens')
  end
  if fence < 1 then
    redis.call('SET', KEYS[3], fence - 1)
    return nil, redis.error_reply('ERR distlock: the fencing counter ' .. KEYS[3] .. ' holds ' ..
      (fence - 1) .. ', below 0, so no token above every earlier one can be issued and the ' ..
      'lock was not taken; set the counter above the largest token your storage has ' ..
      'accepted, or delete it if no storage has seen its tokens')
  end
  return fence
end

local function now_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

local function lease_of(token, deadline, now)
  if tonumber(deadline) >= now then
    return true
  end
  local renewed = tonumber(redis.pcall('ZSCORE', LEASES, token))
  return renewed ~= nil and renewed >= now
end

local function forget_lease(token)
  redis.pcall('ZADD', LEASES, 'XX', 0, token)
end

local function granted(holder, ttl, now)
  redis.call('SET', KEYS[4], string.sub(holder, 1, 36) .. ' ' .. (now or now_ms()), 'PX', ttl)
end

local function hand_off(claim, except, quiet, popped, counted, known)
  local now = nil
  while true do
    local entry = popped or redis.call('LPOP', KEYS[2])
    popped = nil
    if not entry then
      return false
    end
    local waiter, deadline, ttl, fencing, channel =
      string.match(entry, '^(%S+) (%d+) (%d+) ([01]) (.*)$')
    local live = waiter ~= nil and waiter ~= except
    if live and not (known and tonumber(deadline) >= known) then
      now = now or now_ms()
      live = lease_of(waiter, deadline, now)
    end
    if live then
      local fence, failed = 0, nil
      if fencing == '1' then
        fence, failed = next_fence()
      end
      if failed then
        forget_lease(waiter)
        if channel ~= '' then
          redis.call('PUBLISH', channel, waiter .. ' !')
        end
      else
        local px = math.min(tonumber(ttl), claim)
        redis.call('SET', KEYS[1], waiter, 'PX', px)
        granted(waiter, px, now or known)
        local heard = 1
        if channel ~= '' and waiter ~= quiet then
          heard = redis.call('PUBLISH', channel, waiter .. ' ' .. fence)
        end
        if heard > 0 or not counted then
          return {waiter, fence, px}
        end
        forget_lease(waiter)
        if fence > 0 then
          redis.call('SET', KEYS[3], fence - 1)
        end
      end
    end
  end
end

local function first_live(except)
  local entries = redis.call('LRANGE', KEYS[2], 0, -1)
  if #entries == 0 then
    return nil
  end
  local now = now_ms()
  for _, entry in ipairs(entries) do
    local token, deadline, channel = string.match(entry, '^(%S+) (%d+) %d+ [01] (.*)$')
    if token and token ~= except and lease_of(token, deadline, now) then
      return token, channel, now
    end
  end
  return nil
end

local function find(token)
  local entries = redis.call('LRANGE', KEYS[2], 0, -1)
  local prefix = token .. ' '
  for index, entry in ipairs(entries) do
    if string.sub(entry, 1, #prefix) == prefix then
      return index - 1, entry
    end
  end
  return nil
end

local function place_of(token, entry)
  if entry ~= '' then
    local index = redis.pcall('LPOS', KEYS[2], entry)
    if type(index) == 'number' then
      return index
    end
  end
  return find(token)
end
