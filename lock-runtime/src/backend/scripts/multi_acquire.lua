-- Take several locks at once, all or none, when their keys share one cluster slot (or on one
-- server); or wait in the line of the first busy one. Every attempt and every look of a waiter:
-- an uncontended multi-key acquisition is this one call, whatever the number of keys. Runs after
-- `family_prelude.lua`.
--
-- - With k the number of names: `KEYS[i]` (1 <= i <= k) the lock keys, in the caller's order,
--   repeats allowed; `KEYS[k + i]` the line of `KEYS[i]` (helper `line`, the mutex's);
--   `KEYS[2k + i]` its fencing counter (helper `fence`). So `#KEYS` is 3k.
-- - `ARGV[1]` the caller's value (token, the same in every key), `ARGV[2]` the ttl in ms,
--   `ARGV[3]` `"1"` to issue fencing tokens (one per distinct key, from its own counter),
--   `ARGV[4]` the grant channel (empty: not subscribed), `ARGV[5]` the lease of a place in
--   line in ms, `ARGV[6]` `"first"`, `"join"` or `"renew"` (as in `semaphore_acquire.lua`),
--   `ARGV[7]` the claim in ms and `ARGV[8]` `"1"` where receivers of a publish are counted
--   (for a key given back, as in `multi_release.lua`).
-- - Returns `{1, fences, ttl}` when the caller holds every key: `fences` one fencing token
--   per position of `KEYS[1..k]` (a repeated key repeats its token; 0s without fencing);
--   `{0, pttl, deadline, busy, index}` when it waits: `busy` the 1-based position in
--   `KEYS[1..k]` of the first busy key in canonical (byte) order, `pttl` what is left of that
--   key's holder (-3: it is free but others wait for it first), `deadline` when the place
--   lapses (0 for `"first"`) and `index` the place in that key's line (-1 for `"first"`);
--   then `kept`, the positions in `KEYS[1..k]` of the keys the waiter holds meanwhile.
-- - Errors: `MODE <found> multi ...` when a key is a semaphore or not distlock's (a key held by
--   readers is busy: the caller waits for them as a writer).
--
-- Each key is a plain mutex key holding the caller's value, so a mutex caller of any one of the
-- names sees it held, and its line is the mutex's line: a waiter waits in the line of the first
-- busy key (canonical order), and a release of that key hands it that key alone. The waiter
-- then holds that key while it waits for the rest, its expiry cut to the place's lease at each
-- look (a waiter that dies frees it within a lease). A key it holds that comes after the first
-- busy one (handed over while an earlier key was free, which has been taken since) is given
-- back at the look, handed to the first live waiter of its line as a release hands it (that
-- waiter may be alone in the line and wait for no message but this one): so a waiter holds
-- only keys before the one it waits for, in one order shared by every caller, and cannot close
-- a cycle with another multi-key caller. An attempt never takes some free keys and not others.
local k = #KEYS / 3
local me, ttl, fencing = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local order, seen = {}, {}
for i = 1, k do
  if not seen[KEYS[i]] then
    seen[KEYS[i]] = i
    order[#order + 1] = i
  end
end
table.sort(order, function(a, b) return bytes_before(KEYS[a], KEYS[b]) end)

local now = now_ms()
local busy, pttl = nil, -1
local owned = {}
for _, i in ipairs(order) do
  local found, value = shape(KEYS[i])
  if found == 'string' then
    if value == me then
      owned[#owned + 1] = i
    elseif not busy then
      busy, pttl = i, redis.call('PTTL', KEYS[i])
    end
  elseif found == 'read' then
    -- Held by readers: busy, as for a writer (the keys are write locks). The readers' line
    -- is this key's line, whose last reader's release lets the caller in as a writer.
    if not busy then
      busy, pttl = i, redis.call('PTTL', KEYS[i])
    end
  elseif found ~= 'none' then
    return mode_error(KEYS[i], found, 'multi')
  elseif not busy then
    for _, entry in ipairs(redis.call('LRANGE', KEYS[k + i], 0, -1)) do
      local token, deadline = parse(entry)
      if token == me then
        break
      end
      if token and tonumber(deadline) >= now then
        busy, pttl = i, -3
        break
      end
    end
  end
end

if not busy then
  local issued = {}
  if fencing == '1' then
    for _, i in ipairs(order) do
      local fence, failed = next_fence(KEYS[2 * k + i])
      if failed then
        for j, earlier in pairs(issued) do
          if tonumber(redis.call('GET', KEYS[2 * k + j])) == earlier then
            redis.call('SET', KEYS[2 * k + j], earlier - 1)
          end
        end
        return failed
      end
      issued[i] = fence
    end
  end
  for _, i in ipairs(order) do
    redis.call('SET', KEYS[i], me, 'PX', ttl)
    if ARGV[6] ~= 'first' then
      local _, entry = find(KEYS[k + i], me)
      if entry then
        redis.call('LREM', KEYS[k + i], 1, entry)
      end
    end
  end
  local fences = {}
  for i = 1, k do
    fences[i] = issued[seen[KEYS[i]]] or 0
  end
  return {1, fences, ttl}
end

local lease = tonumber(ARGV[5])
local kept = {}
for _, i in ipairs(owned) do
  if bytes_before(KEYS[busy], KEYS[i]) then
    -- Handed over while an earlier key was free, which is busy now: holding it while waiting
    -- for that earlier key could close a cycle with another multi-key waiter, so it is given
    -- back, to its line's first live waiter when there is one.
    if not hand_key(KEYS[i], KEYS[k + i], KEYS[2 * k + i], me, tonumber(ARGV[7]),
        ARGV[8] == '1') then
      redis.call('DEL', KEYS[i])
    end
  else
    redis.call('PEXPIRE', KEYS[i], math.min(ttl, lease))
    kept[#kept + 1] = i
  end
end
if ARGV[6] == 'first' then
  return {0, pttl, 0, busy, -1, kept}
end
for _, i in ipairs(order) do
  if i ~= busy then
    local _, entry = find(KEYS[k + i], me)
    if entry then
      redis.call('LREM', KEYS[k + i], 1, entry)
    end
  end
end
local index, deadline = take_place(KEYS[k + busy], me, ttl .. ' ' .. fencing .. ' ' .. ARGV[4],
  lease, now)
if index > 0 and pttl ~= -3 then
  pttl = -3
end
return {0, pttl, deadline, busy, index, kept}
