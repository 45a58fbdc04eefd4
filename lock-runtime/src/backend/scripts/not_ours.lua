-- Defines not_ours(held, forced, token), shared by extend, hold and the release.
--   held    the lock key's value, read by GET through pcall
--   forced  the `forced` mark's key name (nil: none)
--   token   the caller's token
-- Returns -2 when the mark holds token (force-released), -1 when someone else holds the lock,
-- 0 when nobody does; an error reply when the lock key holds another type.
local function not_ours(held, forced, token)
  if type(held) == 'table' then
    return redis.error_reply('WRONGTYPE distlock: the lock key ' .. KEYS[1] ..
      ' holds a value of another type, not a lock')
  end
  if forced then
    local mark = redis.pcall('GET', forced)
    if mark == token then
      return -2
    end
  end
  if held then
    return -1
  end
  return 0
end
