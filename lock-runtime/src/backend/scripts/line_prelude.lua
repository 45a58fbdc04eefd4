-- Helpers shared by the line scripts (acquire, release, hold, force_release), prepended to their
-- text. No reply of its own; reads no ARGV.
--
-- KEYS[1]      the lock key
-- KEYS[2]      its line: a list of waiters, oldest first, each entry
--              "<token> <lease deadline, Redis ms> <ttl ms> <fencing 0|1> <grant channel>"
-- KEYS[3]      its fencing counter (read by next_fence only)
-- KEYS[4]      its `since` record "<holder's UUID> <Redis ms>" (written by granted only)
-- KEYS[#KEYS]  its lease table: sorted set of tokens scored by the lease deadline their last
--              renewal got, Redis ms; a place lives until the later of entry and score
--
-- next_fence()                 -> fence | nil, error reply naming the counter
-- now_ms()                     -> Redis time, ms
-- lease_of(token, deadline, now) -> whether a place still runs at now (entry, else table)
-- forget_lease(token)          -> sets the token's score to 0, if it has one
-- granted(holder, ttl, now)    -> writes the `since` record for ttl ms
-- hand_off(claim, except, quiet, popped, counted, known)
--                              -> {token, fence, ttl} of the new holder | false: nobody live
-- first_live(except)           -> token, channel, now of the first live waiter | nil
-- find(token)                  -> index, entry | nil (scans the line in Lua)
-- place_of(token, entry)       -> index | nil (LPOS on the exact entry, else find)
local LEASES = KEYS[#KEYS]

-- A counter set below 0 is put back as it was, so that every later acquisition fails the
-- same way until someone looks, rather than quietly counting up to 1.
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

-- Score 0 (never a new member): the token's next renewal finds no place and joins again.
local function forget_lease(token)
  redis.pcall('ZADD', LEASES, 'XX', 0, token)
end

-- Records when `holder` got the lock, so a holder that waited does not show its wait as time
-- held; it lives for the lock's ttl, claim included, and extend renews it.
local function granted(holder, ttl, now)
  redis.call('SET', KEYS[4], string.sub(holder, 1, 36) .. ' ' .. (now or now_ms()), 'PX', ttl)
end

-- Gives the free lock to the first live waiter but `except` (a releaser), starting with
-- `popped` (already taken off the line): its ttl is min(its ttl, claim), its grant
-- "<token> <fence>" ("<token> !": no fence could be issued, it loses its place) goes to
-- its channel unless it is `quiet` (the caller). Dead waiters are dropped.
-- A lease past `known` (Redis ms as the caller knows it) is live without a TIME; a wrong
-- `known` never skips a live waiter. With `counted`, a grant nobody received means the
-- waiter's process is gone: the lock goes on and its fence is taken back.
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
        -- The since record first: across a millisecond between the two, it ends first.
        granted(waiter, px, now or known)
        redis.call('SET', KEYS[1], waiter, 'PX', px)
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
