-- The rest of the release (KEYS, ARGV and reply: release_uncontended.lua): a hand-off to
-- `waiter` (already popped) or the next live one, a lock that is not ours, or a waiter leaving.
if type(waiter) == 'table' then
  redis.call('DEL', KEYS[1], KEYS[4])
  return redis.error_reply('WRONGTYPE distlock: the lock ' .. KEYS[1] .. ' was released, ' ..
    'but its line ' .. KEYS[2] .. ' holds a value of another type, so nobody in it could be ' ..
    'handed the lock: something other than distlock wrote that key; delete it')
end
if ARGV[3] == '1' then
  local index, entry = find(ARGV[1])
  if index then
    redis.call('LREM', KEYS[2], 1, entry)
  end
end
if type(held) == 'table' then
  -- This same release, re-sent after a lost reply, may find the name taken meanwhile as
  -- another kind of lock (readers, a semaphore): its marker says the first run released ours.
  if ARGV[4] ~= '' and redis.pcall('GET', KEYS[6]) == ARGV[1] then
    return 1
  end
  return redis.error_reply('WRONGTYPE the lock key holds a value of another type, not a lock')
end
-- A waiter leaving a key kept past a hold with nobody live behind it gives the key back the
-- hold's own expiry: else it stays a claim for nobody, refusing every SET NX.
if not ours and ARGV[3] == '1' and held then
  local releaser, ends = string.match(held, '^(.*);hold=(%d+)$')
  if releaser and not first_live(releaser) then
    local left = tonumber(ends) - now_ms()
    if left > 0 then
      redis.call('PEXPIRE', KEYS[1], left)
    else
      redis.call('DEL', KEYS[1])
    end
  end
end
if not ours then
  -- Our token in the `released` marker: this same release, re-sent after a lost reply, found
  -- the lock gone. Only a run that found the lock ours writes it, so it vouches for no other.
  local why = not_ours(held, KEYS[5], ARGV[1])
  if ARGV[4] ~= '' and redis.call('GET', KEYS[6]) == ARGV[1] then
    return 1
  end
  return why
end
if ARGV[4] ~= '' and ARGV[3] == '1' then
  redis.call('SET', KEYS[6], ARGV[1], 'PX', ARGV[4])
end
if not hand_off(tonumber(ARGV[2]), ARGV[1], nil, waiter, ARGV[5] == '1', tonumber(ARGV[6])) then
  redis.call('DEL', KEYS[1], KEYS[4])
  return 1
end
return 2
